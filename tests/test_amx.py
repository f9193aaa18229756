"""The AMX permission request that keeps vLLM's CPU attention from dying with SIGILL on AMX CPUs.

Without it every engine test fails on such a machine (the worker exits with -4 at its first decode);
these check the parts that do not need an engine.
"""

from __future__ import annotations

from pathlib import Path

from partial_rollout.engine import amx


def test_the_amx_flag_is_read_from_cpuinfo(tmp_path: Path) -> None:
    with_amx, without = tmp_path / "amx", tmp_path / "plain"
    with_amx.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f amx_bf16 amx_tile amx_int8\n")
    without.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f\n")
    assert amx.cpu_has_amx(with_amx)
    assert not amx.cpu_has_amx(without)
    assert not amx.cpu_has_amx(tmp_path / "missing")


def test_the_request_is_granted_where_the_cpu_has_amx() -> None:
    # Idempotent: a second request in the same process is granted as well.
    assert amx.request_amx_permission() == amx.cpu_has_amx()
    assert amx.request_amx_permission() == amx.cpu_has_amx()
