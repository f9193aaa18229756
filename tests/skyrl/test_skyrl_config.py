"""The flag in SkyRL's own config, the settings partial rollouts refuse at set-up, and the seams probe, on
SkyRL 0.4.0.

One interpreter of SkyRL's environment (``.venv-skyrl``) parses each case with the entry point's own
:func:`~partial_rollout_integrations.skyrl.experiment.parse` (SkyRL's import costs about 15 s of CPU,
so the cases share it) and reports how each ended: the config, or the exit status and the one line
printed.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from partial_rollout_integrations.skyrl import seams

ROOT = Path(__file__).resolve().parents[2]
PYTHON = ROOT / ".venv-skyrl" / "bin" / "python"

VALID = [
    "trainer.fully_async.enabled=true",
    "generator.inference_engine.run_engines_locally=false",
    "generator.inference_engine.external_proxy_url=http://127.0.0.1:8000",
    'generator.inference_engine.external_server_urls=["http://127.0.0.1:8000"]',
    "trainer.train_batch_size=2",
    "trainer.policy_mini_batch_size=2",
    "trainer.fully_async.num_parallel_generation_workers=2",
    "trainer.algorithm.policy_loss_type=rollout_is",
    "trainer.logger=console",
    "trainer.placement.colocate_all=false",
]
ON = "trainer.fully_async.partial_rollout_checkpoint.enable=true"

CASES: dict[str, list[str]] = {
    "on": [*VALID, ON],
    "off": VALID,
    "misspelled": [*VALID, "trainer.fully_async.partial_rollout_checkpoint.enabel=true"],
    "plus": [*VALID, "+trainer.fully_async.partial_rollout_checkpoint.enable=true"],
    "not_async": [*VALID[1:], "trainer.fully_async.enabled=false", ON],
    "local_engines": [*VALID[:1], *VALID[4:], ON],
    "multi_turn": [*VALID, ON, "generator.max_turns=3"],
    "lora": [*VALID, ON, "trainer.policy.model.lora.rank=8"],
    "remote_ckpt": [*VALID, ON, "trainer.ckpt_path=s3://bucket/ckpt"],
    "from_path": [*VALID, ON, "trainer.resume_mode=from_path"],
    "bad_timeout": [*VALID, ON, "trainer.fully_async.partial_rollout_checkpoint.request_timeout_s=0"],
}

SCRIPT = """
import contextlib, io, json, sys
from partial_rollout_integrations.skyrl.experiment import parse
results = {}
for name, overrides in json.loads(sys.argv[1]).items():
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            cfg = parse(overrides)
        block = cfg.trainer.fully_async.partial_rollout_checkpoint
        results[name] = {"enable": block.enable, "timeout": block.request_timeout_s}
    except SystemExit as e:
        results[name] = {"exit": e.code, "stderr": err.getvalue()}
from partial_rollout_integrations.skyrl import seams
seams.check_seams()
seams.check_cpu_seams()
results["seams"] = seams.installed_version()
print("RESULTS " + json.dumps(results))
"""


def test_the_flag_parses_in_skyrls_config_and_what_it_cannot_serve_is_refused_by_key() -> None:
    """Also: the seams probe passes on the installed SkyRL (:mod:`partial_rollout_integrations.skyrl.seams`)."""
    assert PYTHON.is_file(), f"{PYTHON} is missing: run bash scripts/setup_skyrl.sh"
    out = subprocess.run(
        [str(PYTHON), "-c", SCRIPT, json.dumps(CASES)], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULTS ")]
    assert out.returncode == 0 and lines, out.stdout[-3000:] + out.stderr[-3000:]
    results = json.loads(lines[-1].removeprefix("RESULTS "))

    assert results["seams"] in seams.TESTED_VERSIONS, "every SkyRL name the integration uses is in this SkyRL"
    assert results["on"] == {"enable": True, "timeout": 300.0}
    assert results["off"] == {"enable": False, "timeout": 300.0}
    refused = {
        "misspelled": "enabel",
        "plus": "+trainer.fully_async.partial_rollout_checkpoint.enable",
        "not_async": "trainer.fully_async.enabled",
        "local_engines": "generator.inference_engine.external_server_urls",
        "multi_turn": "generator.max_turns",
        "lora": "trainer.policy.model.lora.rank",
        "remote_ckpt": "trainer.ckpt_path",
        "from_path": "trainer.resume_mode",
        "bad_timeout": "trainer.fully_async.partial_rollout_checkpoint.request_timeout_s",
    }
    for case, key in refused.items():
        result = results[case]
        assert result.get("exit") == 3, f"{case}: not refused ({result})"
        lines = result["stderr"].strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("partial-rollout: "), f"{case}: {result['stderr']!r}"
        assert key in lines[0], f"{case}: the refusal does not name {key}: {lines[0]}"
