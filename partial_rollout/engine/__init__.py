"""The engine adapter: vLLM engines whose in-flight requests survive a checkpoint.

Trainers depend on :class:`RolloutEngine` only. :class:`ResumableEngine` is one vLLM engine in this
process; :class:`EnginePool` puts one or more of them, in-process or in Ray actors
(:class:`RemoteEngine`), behind the same interface. An engine someone else starts (a trainer's own
vLLM worker) is started from :func:`with_worker_hooks` and taken over with
:meth:`ResumableEngine.attach`.
"""

from partial_rollout.engine.factory import EngineConfig
from partial_rollout.engine.pool import EnginePool, RemoteEngine
from partial_rollout.engine.protocol import Capabilities, Cut, Progress, RolloutEngine
from partial_rollout.engine.resumable import ResumableEngine, with_worker_hooks

__all__ = [
    "Capabilities",
    "Cut",
    "EngineConfig",
    "EnginePool",
    "Progress",
    "RemoteEngine",
    "ResumableEngine",
    "RolloutEngine",
    "with_worker_hooks",
]
