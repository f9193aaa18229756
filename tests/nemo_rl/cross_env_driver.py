"""A Ray driver for NeMo RL's controller environment whose engine actors run in the project's ``.venv``.

Run with ``.venv-nemo-rl/bin/python cross_env_driver.py ENGINE_PYTHON MODEL_DIR``. It starts a
local Ray cluster, one plain actor and one :class:`~partial_rollout.pool.EnginePool` engine, both
with ``runtime_env={"py_executable": ENGINE_PYTHON}``, and prints one JSON line: what each side
imported and how long each step took. ``test_nemo_rl_env.py`` runs it; it is a script, not a test,
because it must run under the controller's interpreter.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
import time
from typing import Any

import ray
import transformers

from partial_rollout.engine import EngineConfig
from partial_rollout.pool import EnginePool
from partial_rollout.snapshot import SamplingSpec


@ray.remote(num_cpus=0)
class Probe:
    """An actor that reports the environment it runs in."""

    def environment(self) -> dict[str, Any]:
        import transformers
        import vllm

        import partial_rollout.engine
        import partial_rollout.engine.vllm_internals

        return {
            "python": sys.executable,
            "prefix": sys.prefix,
            "vllm": vllm.__version__,
            "transformers": transformers.__version__,
            "ray": ray.__version__,
            "engine_module": partial_rollout.engine.__file__,
        }


async def generate(engine_python: str, model: str) -> dict[str, Any]:
    """One engine in an actor on the engine's interpreter; one greedy request through it."""
    start = time.monotonic()
    pool = await EnginePool.ray(
        EngineConfig(model=model, max_model_len=512, multiprocessing=False),
        1,
        actor_options={"runtime_env": {"py_executable": engine_python}},
    )
    started = time.monotonic()
    try:
        record = await pool.generate(
            "cross-env-0", [5, 6, 7, 8], SamplingSpec(max_tokens=8, temperature=0.0, ignore_eos=True), index=0
        )
    finally:
        await pool.shutdown()
    return {
        "engine_start_s": started - start,
        "tokens": [int(t) for t in record.token_ids],
        "logprobs": len(record.logprobs),
    }


def main() -> None:
    engine_python, model = sys.argv[1], sys.argv[2]
    t0 = time.monotonic()
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=128 * 2**20, log_to_driver=False)
    t1 = time.monotonic()
    try:
        probe = Probe.options(runtime_env={"py_executable": engine_python}).remote()
        actor = ray.get(probe.environment.remote(), timeout=600)
        t2 = time.monotonic()
        engine = asyncio.run(generate(engine_python, model))
    finally:
        ray.shutdown()
    driver = {
        "python": sys.executable,
        "prefix": sys.prefix,
        "transformers": transformers.__version__,
        "ray": ray.__version__,
        "vllm_importable": importlib.util.find_spec("vllm") is not None,
    }
    timings = {"ray_init_s": t1 - t0, "actor_start_and_imports_s": t2 - t1}
    print(json.dumps({"driver": driver, "actor": actor, "engine": engine, "timings": timings}))


if __name__ == "__main__":
    main()
