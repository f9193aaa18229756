"""The README's "Add partial rollouts to your trainer" example runs as written, on a real engine."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from partial_rollout.ledger import audit, read_events

pytestmark = pytest.mark.engine

README = Path(__file__).resolve().parent.parent / "README.md"


def _example() -> str:
    section = README.read_text().split("## Add partial rollouts to your trainer", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "the section has a python block"
    return match.group(1)


def test_readme_trainer_example_loses_nothing(tmp_path: Path, tiny_llama: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(
        _example() + "\n\nif __name__ == '__main__':\n"
        "    import sys, json\n"
        "    print(json.dumps(asyncio.run(main(sys.argv[1], Path(sys.argv[2])))))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
    proc = subprocess.run(
        [sys.executable, str(script), str(tiny_llama), str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(out["saved"]) == 4, "every yielded prompt is in the checkpoint"
    assert "in_flight" in out["saved"].values()
    assert out["consumed"] == 4, "after the resume every group finished and was trained on"
    assert out["continued_tokens"] > 0
    assert out["loader_state"] is not None, "the cut holds the loader's cursor"

    # The example's own event log, audited: nothing lost or duplicated, the resume recorded against
    # the save it resumed from, every saved write logged, and the continued tokens counted there too.
    events = tmp_path / "run" / "events.jsonl"
    report = audit(events)
    assert report.complete and report.clean, (report.lost_ids, report.duplicated_ids, report.stranded_ids)
    assert report.yielded == 4 and report.trained == 4 and report.lost == 0 and report.duplicated == 0
    (resume,) = report.resumes
    kinds = [e["event"] for e in read_events(events)]
    save = next(e for e in read_events(events) if e["event"] == "save")
    assert resume["save_id"] == save["save_id"]
    assert kinds.count("save_written") == 1 and "save_failed" not in kinds
    assert report.tokens_continued == out["continued_tokens"]
