"""Where engines in Ray actors run: a local Ray cluster started here, or an existing one joined.

Users run Ray one of two ways: a laptop or a single box where the trainer starts its own cluster,
and a multi-node cluster started beforehand (``ray start --head`` / ``ray start --address``) that
the trainer joins. :func:`connect` does both: no address starts a local cluster, an address (given,
or in ``RAY_ADDRESS``) joins that cluster. Ray itself waits minutes, retrying, when the address is
wrong; this module first opens a TCP connection to it and fails at once with one line naming it.

Each engine's actor is placed by :func:`placements`: on a GPU build of vLLM it asks Ray for its
GPUs; on CPU it is pinned to its own group of cores (:func:`core_groups`), so engines on one
machine do not share cores and slow each other down in every step.
"""

from __future__ import annotations

import os
import socket
import warnings
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from partial_rollout.errors import ConfigError

ADDRESS_ENV = "RAY_ADDRESS"
"""Ray's own variable for the cluster to join; read when no address is given."""
LOCAL = "local"
"""The address that starts a new local cluster, as in ``ray.init(address="local")``."""
PROBE_TIMEOUT_S = 5.0
"""How long to wait for the cluster's port to accept a connection before calling it unreachable."""


def resolve_address(address: str | None) -> tuple[str | None, str]:
    """The address to join (``None``: start a local cluster) and where it came from, for error messages."""
    if address:
        return (None if address == LOCAL else address), "ray.address"
    env = os.environ.get(ADDRESS_ENV)
    if env:
        return (None if env == LOCAL else env), ADDRESS_ENV
    return None, "ray.address"


def connect(address: str | None = None, *, field: str = "ray.address", **local_options: Any) -> str | None:
    """Join the Ray cluster at ``address`` (else ``RAY_ADDRESS``), or start a local one; idempotent.

    Args:
        address: ``host:port`` of a cluster's head (its GCS port, 6379 by default), ``ray://host:port``
            for Ray Client, ``auto`` for a cluster already running on this machine, ``local`` or
            ``None`` for a new local cluster (unless ``RAY_ADDRESS`` names one).
        field: the configuration key the address came from, named in errors.
        local_options: ``ray.init`` arguments for a local cluster (``num_cpus``,
            ``object_store_memory``); ignored, with a warning, when joining.

    Returns:
        The address joined, or ``None`` for a local cluster.

    Raises:
        ConfigError: the address cannot be reached, or Ray refuses to join it.
    """
    import ray

    target, source = resolve_address(address)
    source = field if source == "ray.address" else source
    if ray.is_initialized():
        return target
    if target is None:
        ray.init(address=LOCAL, include_dashboard=False, **local_options)
        return None
    if local_options:
        warnings.warn(
            f"joining the Ray cluster at {target}: {sorted(local_options)} apply to a local cluster only", stacklevel=2
        )
    if target != "auto":
        _probe(target, source)
    try:
        ray.init(address=target)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        why = exc.__cause__ or exc  # Ray's own cause (an authentication token missing) says most
        first = str(why).splitlines()[0] if str(why) else type(why).__name__
        raise ConfigError(
            f"cannot join the Ray cluster at {target!r}: {first}",
            field=source,
            fix="Start it first (`ray start --head`), or leave the address unset to start a local cluster",
        ) from None
    return target


def _probe(address: str, source: str) -> None:
    """Open (and close) a TCP connection to the cluster's port, so a wrong address fails in seconds."""
    parts = urlsplit(address if "://" in address else f"//{address}")
    try:
        host, port = parts.hostname, parts.port
    except ValueError:
        host, port = None, None
    if not host or port is None:
        raise ConfigError(
            f"{address!r} is not host:port (or ray://host:port)",
            field=source,
            fix="Write e.g. 10.0.0.1:6379, the address `ray start --head` printed",
        )
    try:
        socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S).close()
    except OSError as exc:
        raise ConfigError(
            f"cannot reach the Ray cluster at {address!r} ({exc.strerror or exc})",
            field=source,
            fix="Check the address and that the cluster is up (`ray status`), or unset it to start a local cluster",
        ) from None


def core_groups(num_engines: int, cores: Sequence[int] | None = None) -> list[list[int]]:
    """Split this machine's usable cores into one group per engine (contiguous, sizes differ by at most one).

    With more engines than cores, engines share: engine ``i`` gets core ``i % len(cores)``, and a
    warning says so.
    """
    if num_engines <= 0:
        raise ValueError(f"num_engines must be positive, got {num_engines}")
    usable = sorted(os.sched_getaffinity(0) if cores is None else cores)
    if num_engines > len(usable):
        warnings.warn(
            f"{num_engines} engines on {len(usable)} cores: engines share cores and slow each other down",
            stacklevel=2,
        )
        return [[usable[i % len(usable)]] for i in range(num_engines)]
    size, extra = divmod(len(usable), num_engines)
    groups, start = [], 0
    for i in range(num_engines):
        end = start + size + (i < extra)
        groups.append(usable[start:end])
        start = end
    return groups


def placements(
    num_engines: int,
    *,
    tensor_parallel_size: int = 1,
    pin_cpus: bool = True,
    overrides: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Ray actor options for each of ``num_engines`` engines: GPUs on a GPU cluster, a core group on CPU.

    A cluster with GPUs gives every engine ``tensor_parallel_size`` of them (Ray sets the actor's
    ``CUDA_VISIBLE_DEVICES``). On a CPU cluster each engine gets its own core group of this machine
    (:func:`core_groups`), passed as environment variables of the actor's process: the thread count
    torch and OpenMP use, vLLM's own OpenMP binding (used when its worker runs in a process of its
    own), and :data:`PIN_ENV`, which the actor applies to itself before vLLM starts (:func:`pin`)
    so that the engine core's processes inherit it. ``overrides`` (the caller's own actor options)
    win over these; their ``runtime_env`` environment variables are merged with ours.
    """
    import ray

    gpu = ray.cluster_resources().get("GPU", 0) > 0
    if gpu:
        base: list[dict[str, Any]] = [{"num_cpus": 0, "num_gpus": tensor_parallel_size} for _ in range(num_engines)]
    elif pin_cpus:
        base = [_pinned(cores) for cores in core_groups(num_engines)]
    else:
        base = [{"num_cpus": 0} for _ in range(num_engines)]
    return [_merge(b, overrides or {}) for b in base]


def _pinned(cores: Sequence[int]) -> dict[str, Any]:
    listed = ",".join(str(c) for c in cores)
    env = {"OMP_NUM_THREADS": str(len(cores)), "VLLM_CPU_OMP_THREADS_BIND": listed, PIN_ENV: listed}
    return {"num_cpus": 0, "runtime_env": {"env_vars": env}}


def _merge(ours: dict[str, Any], theirs: dict[str, Any]) -> dict[str, Any]:
    merged = {**ours, **theirs}
    if "runtime_env" in ours and "runtime_env" in theirs:
        env = {**ours["runtime_env"].get("env_vars", {}), **theirs["runtime_env"].get("env_vars", {})}
        merged["runtime_env"] = {**ours["runtime_env"], **theirs["runtime_env"], "env_vars": env}
    return merged


PIN_ENV = "PARTIAL_ROLLOUT_CPU_CORES"
"""Cores an engine actor pins itself to (comma-separated ids), set by :func:`placements`."""


def pin() -> list[int] | None:
    """Pin this process to the cores in :data:`PIN_ENV` (inside an engine's actor, before vLLM starts).

    Returns the cores pinned to, or ``None`` when there is nothing to pin (GPU, or pinning off). The
    cores were chosen on the driver's machine; an actor on a node without them is not pinned
    (warning), as is one whose cores are outside its allowed set.
    """
    listed = os.environ.get(PIN_ENV)
    if not listed:
        return None
    wanted = {int(c) for c in listed.split(",")}
    allowed = os.sched_getaffinity(0)
    if not wanted <= allowed:
        warnings.warn(
            f"engine not pinned: cores {sorted(wanted)} are not all usable here (allowed {sorted(allowed)})",
            stacklevel=2,
        )
        return None
    # Affinity is per thread on Linux: pin every thread the process has now (Ray's async actors run
    # their methods on another thread than the main one); threads and processes started later
    # inherit it from whichever thread starts them.
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), wanted)
        except ProcessLookupError:  # a thread that ended meanwhile
            pass
    return sorted(wanted)
