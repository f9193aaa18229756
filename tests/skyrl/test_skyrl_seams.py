"""The seams probe lists every SkyRL name ``integrations/skyrl/`` uses, and nothing else (no SkyRL
needed; ``test_skyrl_config`` runs the probe on the real SkyRL 0.4.0 wheel)."""

from __future__ import annotations

from pathlib import Path

import seam_names

from partial_rollout_integrations.skyrl import seams

REPO = Path(__file__).resolve().parents[2]
INTEGRATION = REPO / "integrations" / "skyrl"


def test_every_skyrl_name_the_integration_uses_is_probed() -> None:
    uses, overrides = seam_names.scan_files(INTEGRATION.rglob("*.py"), seams.ROOTS, REPO)
    chains = {u.chain for u in uses}
    assert ("skyrl.train.trainer", "RayPPOTrainer", "save_checkpoints") in chains, "the scan sees the base save"
    assert overrides, "the scan sees our subclasses of SkyRL classes"
    assert seam_names.uncovered(uses, seams.SEAMS + seams.CPU_SEAMS) == []


def test_every_name_the_probe_lists_is_one_the_integration_names() -> None:
    sources = [p for p in INTEGRATION.rglob("*.py") if p.name != "seams.py"]
    assert seam_names.unused(seams.SEAMS + seams.CPU_SEAMS, sources, REPO) == []
