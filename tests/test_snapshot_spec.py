"""docs/snapshot_format.md is a spec others implement from: keep it true to the code."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
import zlib
from pathlib import Path

from snapshot_helpers import example_snapshot

from partial_rollout.snapshot import (
    SNAPSHOT_FILENAME,
    SampleState,
    SamplingSpec,
    SnapshotReader,
    layout,
    load_snapshot,
    save_snapshot,
)
from partial_rollout.snapshot.summary import summarize

SPEC = (Path(__file__).resolve().parents[1] / "docs" / "snapshot_format.md").read_text(encoding="utf-8")


def test_spec_example_writer_produces_a_valid_snapshot(tmp_path: Path) -> None:
    """The spec's standalone writer (numpy + safetensors only) writes a file our reader accepts."""
    block = SPEC.split("<!-- spec-example")[1].split("```python\n", 1)[1].split("```", 1)[0]
    subprocess.run([sys.executable, "-c", block], cwd=tmp_path, check=True, timeout=120)
    snap = load_snapshot(tmp_path / SNAPSHOT_FILENAME)
    ((group, sample),) = snap.iter_samples()
    assert group.group_id == "q-1" and group.data == {"answer": "56"} and group.prompt_token_ids.tolist() == [1, 2, 3]
    assert sample.state is SampleState.IN_FLIGHT and sample.token_ids.tolist() == [7, 8]
    assert sample.versions.tolist() == [4, 5] and sample.sampling.seed == 42 and sample.sampling.max_tokens == 256
    assert snap.trainer_step == 10 and snap.policy_version == 5 and snap.counters == {"yielded": 1}


def test_spec_names_every_tensor_and_key() -> None:
    documented = set(re.findall(r"^\| `([a-z_.]+)` \|", SPEC, flags=re.M))
    assert set(layout.TENSORS) <= documented
    assert set(layout.METADATA_KEYS) <= documented
    for key in layout.TABLE_KEYS:
        assert f"`{key}`" in SPEC
    sampling_fields = {f.name for f in dataclasses.fields(SamplingSpec)} - {"seed"}
    assert sampling_fields <= documented


def test_spec_documents_every_dump_json_key(tmp_path: Path) -> None:
    save_snapshot(example_snapshot(), tmp_path)
    with SnapshotReader(tmp_path) as reader:
        report = summarize(reader, limit=0)
    json_section = SPEC.split("### 10.1")[1]
    keys = (
        set(report)
        | set(report["counts"])
        | set(report["size"])
        | set(report["in_flight"])
        | set(report["in_flight"]["rows"][0])
    )
    keys |= set(report["policy_versions"])
    missing = sorted(k for k in keys if f'"{k}"' not in json_section)
    assert not missing


def test_spec_crc_check_value() -> None:
    assert f"{zlib.crc32(b'123456789'):08x}" == "cbf43926" and "cbf43926" in SPEC
