"""The seams probe lists every NeMo RL name ``integrations/nemo_rl/`` uses, and the tested commit has them.

The first test reads our source (no NeMo RL needed); the second runs in NeMo RL's controller
environment against the tested commit: the controller's and the GPU path's probes pass, and every
method of ours that overrides one of NeMo RL's is on the lists (a rename upstream would otherwise
leave our override dead). The third list, NeMo RL's vLLM worker extension, imports vLLM, which that
environment lacks: it is checked where the GPU worker builds its extension.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import nemo_rl_harness as harness
import seam_names

from partial_rollout_integrations.nemo_rl import seams

REPO = Path(__file__).resolve().parents[2]
INTEGRATION = REPO / "integrations" / "nemo_rl"


def test_every_nemo_rl_name_the_integration_uses_is_probed() -> None:
    uses, overrides = seam_names.scan_files(INTEGRATION.rglob("*.py"), seams.ROOTS, REPO)
    seen = {u.chain for u in uses}
    assert ("nemo_rl.algorithms.single_controller", "SingleControllerActor", "_train_steps") in seen, (
        "the scan sees self.<name> in our subclass of NeMo RL's Ray actor class (through unwrap)"
    )
    assert {o.method for o in overrides} >= {"_save_checkpoint", "begin_finalization", "_create_engine"}
    assert seam_names.uncovered(uses, seams.SEAMS + seams.GPU_SEAMS + seams.VLLM_SEAMS) == []


def test_every_name_the_probe_lists_is_one_the_integration_names() -> None:
    """The other way round (``relied_on`` holds what we depend on without naming it)."""
    sources = [p for p in INTEGRATION.rglob("*.py") if p.name != "seams.py"]
    assert seam_names.unused(seams.SEAMS + seams.GPU_SEAMS + seams.VLLM_SEAMS, sources, REPO) == []


PROBE = """
import json
from pathlib import Path
import seam_names
from partial_rollout_integrations.nemo_rl import seams
seams.check_seams()
seams.check_gpu_seams()
repo = Path(seam_names.__file__).resolve().parents[1]
_, overrides = seam_names.scan_files((repo / "integrations" / "nemo_rl").rglob("*.py"), seams.ROOTS, repo)
overriding = seam_names.overriding(overrides)
print(json.dumps({
    "overriding": sorted(".".join(u.chain[1:]) for u in overriding),
    "unprobed": seam_names.uncovered(overriding, seams.SEAMS + seams.GPU_SEAMS + seams.VLLM_SEAMS),
}))
"""


@harness.needs_nemo_rl
def test_the_tested_commit_has_every_probed_name_and_each_override_is_probed() -> None:
    out = subprocess.run(
        [str(harness.controller_python()), "-c", PROBE],
        env=harness.controller_env([harness.nemo_rl_src(), REPO / "tests"]),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    facts = json.loads(out.stdout.splitlines()[-1])
    print(f"overrides of NeMo RL methods: {facts['overriding']}")
    assert facts["unprobed"] == []
    assert {
        "SingleControllerActor._save_checkpoint",
        "SingleControllerActor._maybe_restore_replay_buffer",
        "AsyncRolloutImpl._run_single_rollout",
        "TQReplayBuffer.remove",
        "CheckpointManager.begin_finalization",
        "VllmAsyncGenerationWorkerImpl._create_engine",
    } <= set(facts["overriding"])
