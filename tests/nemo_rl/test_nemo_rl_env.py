"""The two environments NeMo RL runs in here: its controller in ``.venv-nemo-rl``, our engine in ``.venv``.

``scripts/setup_nemo_rl.sh`` makes the controller environment. These tests check what it promises,
in that environment's own interpreter: NeMo RL's pins (transformers 5.8.1) and not vLLM's, exactly
.venv's Ray, our snapshot and ledger code importable without vLLM, NeMo RL's single controller
importable from ``NEMO_RL_SRC``; and that a Ray driver there runs a real vLLM engine in an actor on
.venv's interpreter, as NeMo RL runs its workers (``runtime_env`` ``py_executable``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import nemo_rl_harness as harness
import pytest

pytestmark = harness.needs_nemo_rl

CONTROLLER_FACTS = """
import asyncio, importlib.metadata, importlib.util, json, sys, typing, typing_extensions
import partial_rollout.ledger, partial_rollout.snapshot
import nemo_rl.algorithms.single_controller
print(json.dumps({
    "python": list(sys.version_info[:2]),
    "transformers": importlib.metadata.version("transformers"),
    "torch": importlib.metadata.version("torch"),
    "ray": importlib.metadata.version("ray"),
    "vllm_importable": importlib.util.find_spec("vllm") is not None,
    "typed_dict_shimmed": typing.TypedDict is typing_extensions.TypedDict,
    "wait_for_shimmed": asyncio.wait_for.__module__ == "nemo_rl_py311",
    "partial_rollout": partial_rollout.snapshot.__file__,
    "nemo_rl": nemo_rl.algorithms.single_controller.__file__,
}))
"""


def test_controller_env_has_nemo_rl_pins_and_our_snapshot_code(tmp_path: Path) -> None:
    src = harness.nemo_rl_src()
    result = subprocess.run(
        [str(harness.controller_python()), "-c", CONTROLLER_FACTS],
        env=harness.controller_env([src]),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    facts = json.loads(result.stdout.splitlines()[-1])
    import ray

    assert facts["python"] == list(sys.version_info[:2])  # Ray needs one Python version on both sides
    assert facts["ray"] == ray.__version__
    assert facts["transformers"] == "5.8.1"
    assert facts["torch"].startswith("2.13.0")
    assert not facts["vllm_importable"]
    assert facts["typed_dict_shimmed"] == facts["wait_for_shimmed"] == (sys.version_info < (3, 12))
    assert Path(facts["partial_rollout"]).is_relative_to(harness.REPO)
    assert Path(facts["nemo_rl"]).is_relative_to(src)


CANCELLED_PUMPS = """
import asyncio

async def pump(stop):
    loop = asyncio.get_running_loop()
    while not stop:  # as NeMo RL's stall watchdog: every tick awaits a probe through wait_for
        probe = loop.create_future()
        loop.call_soon(lambda f=probe: f.done() or f.set_result(None))
        await asyncio.wait_for(probe, timeout=10)

async def main():
    kept_running = []
    for ticks in range(40):
        stop = []
        task = asyncio.ensure_future(pump(stop))
        for _ in range(ticks):
            await asyncio.sleep(0)
        task.cancel()
        await asyncio.wait({task}, timeout=0.5)
        if not task.cancelled():
            kept_running.append(ticks)
            stop.append(True)
            await task
    print(kept_running)

asyncio.run(main())
"""


def test_a_cancelled_wait_for_loop_stops_in_the_controller_env(tmp_path: Path) -> None:
    """Python 3.11's ``asyncio.wait_for`` drops a cancellation that lands once its future is done
    (stock 3.11 prints every tick count from 1 to 39 here); the controller venv has 3.12's."""
    result = subprocess.run(
        [str(harness.controller_python()), "-c", CANCELLED_PUMPS],
        env=harness.controller_env([]),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert result.stdout.split() == ["[]"], "wait_for loops that ignored their cancellation, by tick"


@pytest.mark.ray
@pytest.mark.engine
def test_controller_driver_runs_a_vllm_engine_actor_in_the_project_venv(tiny_llama: Path) -> None:
    """A real local Ray cluster, a probe actor and an :class:`EnginePool` engine actor; no fakes."""
    driver = Path(__file__).with_name("cross_env_driver.py")
    result = subprocess.run(
        [str(harness.controller_python()), str(driver), str(harness.ENGINE_PYTHON), str(tiny_llama)],
        env=harness.controller_env([]),
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-6000:]
    report = json.loads(result.stdout.splitlines()[-1])
    print(json.dumps(report["timings"] | {"engine_start_s": report["engine"]["engine_start_s"]}))
    driver_side, actor = report["driver"], report["actor"]
    import transformers
    import vllm

    assert Path(driver_side["prefix"]) == harness.CONTROLLER_PYTHON.parents[1]
    assert driver_side["transformers"] == "5.8.1" and not driver_side["vllm_importable"]
    assert Path(actor["prefix"]) == harness.ENGINE_PYTHON.parents[1]
    assert (actor["vllm"], actor["transformers"]) == (vllm.__version__, transformers.__version__)
    assert actor["ray"] == driver_side["ray"]
    assert Path(actor["engine_module"]).is_relative_to(harness.REPO)
    assert len(report["engine"]["tokens"]) == 8 and report["engine"]["logprobs"] == 8
