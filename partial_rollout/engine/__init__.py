"""The engine adapter: vLLM engines whose in-flight requests survive a checkpoint.

Trainers depend on :class:`RolloutEngine` only. :class:`ResumableEngine` is one vLLM engine in this
process; :class:`EnginePool` puts one or more of them, in-process or in Ray actors
(:class:`RemoteEngine`, after :func:`connect_ray`), behind the same interface. An engine someone
else starts (a trainer's own vLLM worker) is started from :func:`with_worker_hooks` and taken over
with :meth:`ResumableEngine.attach`; where that worker already has its own worker extension, the
trainer mixes :class:`WorkerHooks` into it (vLLM takes one extension class). When a Ray-actor
engine of a pool dies, its requests continue on the others from the tokens received, which it
streamed as :class:`Delta` (:class:`Failover` reports it; :class:`NoEngineLeftError` when none is left).
"""

from partial_rollout.engine.cluster import connect as connect_ray
from partial_rollout.engine.factory import EngineConfig
from partial_rollout.engine.failover import EngineDiedError, Failover, NoEngineLeftError
from partial_rollout.engine.pool import EnginePool, RemoteEngine
from partial_rollout.engine.protocol import Capabilities, Cut, Delta, Progress, RolloutEngine
from partial_rollout.engine.resumable import ResumableEngine, with_worker_hooks
from partial_rollout.engine.vllm_internals import WorkerHooks

__all__ = [
    "Capabilities",
    "Cut",
    "Delta",
    "EngineConfig",
    "EngineDiedError",
    "EnginePool",
    "Failover",
    "NoEngineLeftError",
    "Progress",
    "RemoteEngine",
    "ResumableEngine",
    "RolloutEngine",
    "WorkerHooks",
    "connect_ray",
    "with_worker_hooks",
]
