"""The README's "Add partial rollouts to your trainer" example runs as written, on a real engine."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

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
