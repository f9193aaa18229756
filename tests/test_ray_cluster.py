"""Ray as users run it: a local cluster when no address is given, an existing cluster joined by address
(``ray.address`` or ``RAY_ADDRESS``), and an unreachable address failing at once in one line naming it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from partial_rollout.errors import EXIT_BAD_INPUT, ConfigError
from partial_rollout.pool import cluster

pytestmark = pytest.mark.ray
REPO = Path(__file__).resolve().parents[1]


def _closed_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unreachable_address_fails_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    ray = pytest.importorskip("ray")
    assert not ray.is_initialized()
    address = f"127.0.0.1:{_closed_port()}"
    with pytest.raises(ConfigError, match=f"ray.address: cannot reach the Ray cluster at '{address}'") as err:
        cluster.connect(address)
    assert "\n" not in str(err.value)
    monkeypatch.setenv(cluster.ADDRESS_ENV, address)
    with pytest.raises(ConfigError, match=f"RAY_ADDRESS: cannot reach the Ray cluster at '{address}'"):
        cluster.connect(None)
    with pytest.raises(ConfigError, match="'head-node' is not host:port"):
        cluster.connect("head-node")
    assert not ray.is_initialized()


def test_cli_train_with_an_unreachable_cluster_exits_with_one_line(tmp_path: Path) -> None:
    address = f"127.0.0.1:{_closed_port()}"
    env = {k: v for k, v in os.environ.items() if k != cluster.ADDRESS_ENV}
    proc = subprocess.run(
        [
            str(Path(sys.executable).parent / "partial-rollout"),
            "train",
            str(REPO / "integrations/reference_grpo/configs/fast.yaml"),
            "++generation.num_engines=2",
            f"++ray.address={address}",
            f"checkpointing.checkpoint_dir={tmp_path / 'ckpt'}",
            f"logger.log_dir={tmp_path / 'logs'}",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert proc.returncode == EXIT_BAD_INPUT, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if address in line]
    assert len(lines) == 1 and "ray.address: cannot reach the Ray cluster" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.fixture
def running_cluster() -> Iterator[str]:
    """A Ray cluster started by another process (as `ray start --head` would), ended with that process."""
    # Ray 2.60 turns token authentication on for a cluster ray.init starts, with a token only its own
    # processes hold; a cluster of `ray start --head` keeps it in ~/.ray/auth_token for others to join.
    head = subprocess.Popen(
        env={**os.environ, "RAY_AUTH_MODE": "disabled"},
        args=[
            sys.executable,
            "-c",
            "import ray, sys; ray.init(num_cpus=1, include_dashboard=False, object_store_memory=128 * 2**20);"
            " print(ray.get_runtime_context().gcs_address, flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert head.stdout is not None
        address = head.stdout.readline().strip()
        assert address, "the head process did not start a cluster (see its stderr)"
        yield address
    finally:
        assert head.stdin is not None
        head.stdin.close()
        head.wait(timeout=120)


def test_joins_the_cluster_ray_address_names(running_cluster: str, monkeypatch: pytest.MonkeyPatch) -> None:
    ray = pytest.importorskip("ray")
    monkeypatch.setenv(cluster.ADDRESS_ENV, running_cluster)
    try:
        assert cluster.connect(None) == running_cluster
        assert ray.get_runtime_context().gcs_address == running_cluster
        assert ray.cluster_resources()["CPU"] == 1  # the head's, not a new local cluster's
        assert ray.get(ray.remote(lambda: 6 * 7).remote()) == 42
    finally:
        ray.shutdown()


def test_placements_gpus_on_a_gpu_cluster_and_core_groups_on_cpu() -> None:
    """GPUs declared to Ray (no GPU needed to check the request), then a CPU cluster; caller options merged."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, object_store_memory=128 * 2**20)
    try:
        assert cluster.placements(2) == [{"num_cpus": 0, "num_gpus": 1}] * 2
        assert cluster.placements(1, tensor_parallel_size=2)[0]["num_gpus"] == 2
    finally:
        ray.shutdown()
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=128 * 2**20)
    try:
        theirs = {"runtime_env": {"py_executable": "/venv/bin/python", "env_vars": {"PYTHONPATH": "/lib"}}}
        placed = cluster.placements(2, overrides=theirs)
        groups = cluster.core_groups(2)
        for options, cores in zip(placed, groups, strict=True):
            env = options["runtime_env"]["env_vars"]
            assert options["runtime_env"]["py_executable"] == "/venv/bin/python" and env["PYTHONPATH"] == "/lib"
            assert env[cluster.PIN_ENV] == ",".join(map(str, cores)) and env["OMP_NUM_THREADS"] == str(len(cores))
            assert "num_gpus" not in options
        assert all("runtime_env" not in o for o in cluster.placements(2, pin_cpus=False))
    finally:
        ray.shutdown()
