"""Many engines behind one :class:`~partial_rollout.engine.RolloutEngine`: in this process, or in Ray actors.

:class:`EnginePool` puts one or more :class:`~partial_rollout.engine.ResumableEngine` behind the same
interface, in-process or each in a Ray actor (:class:`RemoteEngine`, after :func:`connect_ray`
started or joined the cluster). When a Ray-actor engine of a pool dies, its requests continue on the
others from the tokens received, which it streamed as :class:`~partial_rollout.engine.Delta`
(:class:`Failover` reports it; :class:`NoEngineLeftError` when none is left). This layer sits on
:mod:`partial_rollout.engine` and uses only its public names; the engine knows nothing of it.
"""

from partial_rollout.pool.cluster import connect as connect_ray
from partial_rollout.pool.failover import EngineDiedError, EngineStartError, Failover, NoEngineLeftError
from partial_rollout.pool.pool import EnginePool, RemoteEngine

__all__ = [
    "EngineDiedError",
    "EnginePool",
    "EngineStartError",
    "Failover",
    "NoEngineLeftError",
    "RemoteEngine",
    "connect_ray",
]
