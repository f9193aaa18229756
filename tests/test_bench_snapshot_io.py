"""The snapshot I/O benchmark runs end to end at a tiny size (its numbers come from the full size, not from here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_frozen_window_and_io_measurements_run_and_write_json(tmp_path: Path) -> None:
    for extra, out in (([], tmp_path / "io.json"), (["--cut-only"], tmp_path / "cut.json")):
        command = [sys.executable, "-m", "benchmarks.snapshot_io", "--samples", "24", "--tokens", "16"]
        command += ["--repeats", "1", "--dir", str(tmp_path), "--out", str(out), *extra]
        proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        result = json.loads(out.read_text())
        window = result["frozen_window"]
        assert (
            set(window["seconds"])
            == set(window["cpu_seconds"])
            == {"engine_records", "ledger_capture_and_cut", "total"}
        )
        assert window["seconds"]["total"] > 0 and result["samples"] == 24
    assert "save" in json.loads((tmp_path / "io.json").read_text())["seconds"]
