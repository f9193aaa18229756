"""The engine adapter: one vLLM engine whose in-flight requests survive a checkpoint.

Trainers depend on :class:`RolloutEngine` only (the checkpointer on three of its methods,
:class:`CheckpointableEngine`). :class:`ResumableEngine` is one vLLM engine in this
process. An engine someone else starts (a trainer's own vLLM worker) is started from
:func:`with_worker_hooks` and taken over with :meth:`ResumableEngine.attach`; where that worker
already has its own worker extension, the trainer mixes :class:`WorkerHooks` into it (vLLM takes one
extension class). Many engines behind the same interface, in Ray actors, are the layer above:
:mod:`partial_rollout.pool`.
"""

from partial_rollout.engine.factory import EngineConfig
from partial_rollout.engine.protocol import Capabilities, CheckpointableEngine, Cut, Delta, Progress, RolloutEngine
from partial_rollout.engine.resumable import ResumableEngine, with_worker_hooks
from partial_rollout.engine.vllm_internals import WorkerHooks

__all__ = [
    "Capabilities",
    "CheckpointableEngine",
    "Cut",
    "Delta",
    "EngineConfig",
    "Progress",
    "ResumableEngine",
    "RolloutEngine",
    "WorkerHooks",
    "with_worker_hooks",
]
