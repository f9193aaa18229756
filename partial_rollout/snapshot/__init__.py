"""Snapshots of in-flight rollouts: the data model and its safetensors file format.

Build a :class:`Snapshot` from live requests, :func:`save_snapshot` it into the checkpoint folder,
and :func:`load_snapshot` it on resume::

    from partial_rollout.snapshot import load_snapshot, save_snapshot

    save_snapshot(snapshot, ckpt_dir)  # writes ckpt_dir/partial_rollouts.safetensors atomically
    snapshot = load_snapshot(ckpt_dir, expect=fingerprints)
    for group, sample in snapshot.iter_samples(SampleState.IN_FLIGHT):
        ...  # re-submit group.prompt_token_ids + sample.token_ids

The file format is specified in docs/snapshot_format.md; :func:`read_header` reads a file's
checked safetensors header alone (where its bytes go, without reading a tensor).
"""

from partial_rollout.snapshot.container import read_header
from partial_rollout.snapshot.fingerprints import Fingerprints
from partial_rollout.snapshot.layout import FORMAT_VERSION
from partial_rollout.snapshot.paths import SNAPSHOT_FILENAME, find_snapshot, snapshot_path
from partial_rollout.snapshot.reader import SnapshotReader, load_snapshot
from partial_rollout.snapshot.sampling import SamplingSpec, sample_seed
from partial_rollout.snapshot.schema import GroupRecord, GroupState, SampleRecord, SampleState, Snapshot
from partial_rollout.snapshot.writer import save_snapshot

__all__ = [
    "FORMAT_VERSION",
    "SNAPSHOT_FILENAME",
    "Fingerprints",
    "GroupRecord",
    "GroupState",
    "SampleRecord",
    "SampleState",
    "SamplingSpec",
    "Snapshot",
    "SnapshotReader",
    "find_snapshot",
    "load_snapshot",
    "read_header",
    "sample_seed",
    "save_snapshot",
    "snapshot_path",
]
