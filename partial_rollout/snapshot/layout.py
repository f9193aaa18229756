"""Format version 1: its name and number, tensor names, dtypes and codes (one source for writer, reader and spec).

Every per-group and per-sample field is a flat one-dimensional tensor: ``G`` groups, ``S`` samples
in group order, ``T`` generated tokens in sample order, ``R`` version runs. Ragged fields are a flat
values tensor plus an ``int64`` offsets tensor of length ``N + 1`` whose entries ``i`` and ``i + 1``
bound item ``i``. docs/snapshot_format.md describes each one; keep the two in step.
"""

from __future__ import annotations

import re

import numpy as np

from partial_rollout.snapshot.schema import GroupState, SampleState

FORMAT_NAME = "partial-rollout-snapshot"
"""Value of the ``format`` metadata key: tells our files apart from other safetensors files."""
FORMAT_VERSION = 1
"""Version of the on-disk layout this code writes and the only one it reads (docs/snapshot_format.md)."""

GROUP_TENSORS: dict[str, type[np.generic]] = {
    "group.id_offsets": np.int64,  # [G+1] into group.id_bytes
    "group.id_bytes": np.uint8,  # UTF-8 group ids, concatenated
    "group.data_offsets": np.int64,  # [G+1] into group.data_bytes
    "group.data_bytes": np.uint8,  # UTF-8 JSON objects, concatenated
    "group.prompt_offsets": np.int64,  # [G+1] into group.prompt_tokens
    "group.prompt_tokens": np.int32,  # prompt token ids, concatenated
    "group.state": np.uint8,  # [G] GROUP_STATE_CODES
    "group.dispatch_version": np.int64,  # [G] -1 while pending
    "group.sample_offsets": np.int64,  # [G+1] into the sample.* tensors
}
SAMPLE_TENSORS: dict[str, type[np.generic]] = {
    "sample.state": np.uint8,  # [S] SAMPLE_STATE_CODES
    "sample.token_offsets": np.int64,  # [S+1] into sample.tokens / sample.logprobs
    "sample.tokens": np.int32,  # [T] generated token ids
    "sample.logprobs": np.float32,  # [T] behaviour logprob of each token
    "sample.version_run_offsets": np.int64,  # [S+1] into the version runs
    "sample.version_run_values": np.int32,  # [R] policy version of each run
    "sample.version_run_lengths": np.int32,  # [R] tokens in each run (>= 1)
    "sample.sampling_index": np.int32,  # [S] into tables.sampling
    "sample.seed": np.int64,  # [S] the sampling seed where has_seed
    "sample.has_seed": np.uint8,  # [S] 0 or 1
    "sample.finish_reason": np.int32,  # [S] into tables.finish_reasons, -1 = None
    "sample.stop_reason": np.int32,  # [S] into tables.stop_reasons, -1 = None
    "sample.inexact": np.int32,  # [S] into tables.inexact_reasons, -1 = None
    "sample.reward": np.float64,  # [S] the reward where has_reward
    "sample.has_reward": np.uint8,  # [S] 0 or 1
    "sample.sampler_state_offsets": np.int64,  # [S+1] into sample.sampler_state_bytes; empty = None
    "sample.sampler_state_bytes": np.uint8,  # opaque sampler states, concatenated
}
TENSORS = {**GROUP_TENSORS, **SAMPLE_TENSORS}
"""Every fixed tensor of version 1 and its dtype."""

LOADER_PREFIX = "loader."
LOADER_TENSOR = re.compile(r"loader\.(0|[1-9][0-9]*)")
"""Names of the loader-state tensors (referenced from the ``loader_state`` metadata)."""

PAYLOAD_TENSORS = frozenset(
    ["group.data_bytes", "group.prompt_tokens", "sample.tokens", "sample.logprobs", "sample.sampler_state_bytes"]
)
"""Tensors that grow with prompt, prefix or sampler-state size; a lazy reader slices them."""

GROUP_STATE_CODES = {GroupState.PENDING: 0, GroupState.IN_FLIGHT: 1, GroupState.READY: 2}
SAMPLE_STATE_CODES = {SampleState.NOT_STARTED: 0, SampleState.IN_FLIGHT: 1, SampleState.FINISHED: 2}
GROUP_STATES = {code: state for state, code in GROUP_STATE_CODES.items()}
SAMPLE_STATES = {code: state for state, code in SAMPLE_STATE_CODES.items()}
NO_CODE = -1
"""Code of an absent finish reason, stop reason or inexact reason."""

METADATA_KEYS = (
    "format",
    "format_version",
    "writer",
    "fingerprints",
    "trainer_step",
    "policy_version",
    "counters",
    "evicted_by_reason",
    "metadata",
    "tables",
    "loader_state",
    "checksums",
)
"""Every ``__metadata__`` key of version 1. ``format`` and ``format_version`` are plain strings,
``writer`` is free text, the others are JSON documents."""

TABLE_KEYS = ("sampling", "finish_reasons", "stop_reasons", "inexact_reasons")
"""Keys of the ``tables`` metadata object, each a JSON array indexed by a ``sample.*`` code."""
