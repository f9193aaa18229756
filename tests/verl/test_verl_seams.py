"""The seams probe lists every verl name ``integrations/verl/`` uses, and fails in one line on one that
is missing (no verl needed; ``test_verl_env`` runs the probe on the real verl 0.9.1 wheel)."""

from __future__ import annotations

from pathlib import Path

import pytest
import seam_names

from partial_rollout.errors import ConfigError
from partial_rollout_integrations.seams import Seam
from partial_rollout_integrations.verl import seams

REPO = Path(__file__).resolve().parents[2]
INTEGRATION = REPO / "integrations" / "verl"


def test_every_verl_name_the_integration_uses_is_probed() -> None:
    uses, overrides = seam_names.scan_files(INTEGRATION.rglob("*.py"), seams.ROOTS, REPO)
    assert any(u.chain == ("verl.trainer.main_ppo", "TaskRunnerV1", "run") for u in uses), "the scan sees super()"
    assert overrides, "the scan sees our subclasses of verl classes"
    assert seam_names.uncovered(uses, seams.SEAMS + seams.GPU_SEAMS) == []


def test_every_name_the_probe_lists_is_one_the_integration_names() -> None:
    """The other way round: a probed member nothing of ours mentions would refuse a verl release for
    a name we never use (a member we depend on without naming it is listed as ``relied_on``)."""
    sources = [p for p in INTEGRATION.rglob("*.py") if p.name != "seams.py"]
    assert seam_names.unused(seams.SEAMS + seams.GPU_SEAMS, sources, REPO) == []


def test_unused_reports_a_probed_name_no_source_mentions(tmp_path: Path) -> None:
    source = tmp_path / "ours.py"
    source.write_text('import json\njson.dumps\ngetattr(json.JSONDecoder, "raw_decode")\n')
    listed = (
        Seam("json", None, ("dumps", "loads")),
        Seam("json", "JSONDecoder", ("raw_decode", "decode"), relied_on=("scan_once",)),
    )
    assert seam_names.unused(listed, [source], tmp_path) == ["json.loads", "json.JSONDecoder.decode"]


SNIPPET = """
import transfer_queue as tq
from verl.trainer.ppo.v1.trainer_base import PPOTrainer
from verl.trainer.ppo.v1 import trainer_colocate_async as colocate

class Trainer(colocate.PPOTrainerColocateAsync):
    def _save_checkpoint(self):
        self.mine = 1
        tq.kv_list().keys()
        self.get_llm_client(self.mine)
        self._not_probed()
        return super()._also_not_probed()

PPOTrainer.fit
tq.kv_flush
"""


def test_the_scan_reports_each_name_the_probe_lacks() -> None:
    uses, overrides = seam_names.scan(SNIPPET, seams.ROOTS, "snippet.py")
    assert seam_names.uncovered(uses, seams.SEAMS) == [
        "snippet.py:11: verl.trainer.ppo.v1.trainer_colocate_async.PPOTrainerColocateAsync._not_probed",
        "snippet.py:12: verl.trainer.ppo.v1.trainer_colocate_async.PPOTrainerColocateAsync._also_not_probed",
        "snippet.py:15: transfer_queue.kv_flush",
    ]
    base = ("verl.trainer.ppo.v1", "trainer_colocate_async", "PPOTrainerColocateAsync")
    assert [(o.base, o.method) for o in overrides] == [(base, "_save_checkpoint")]


def test_a_missing_name_fails_in_one_line_naming_it_the_version_and_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in seam list on the standard library: the probe's own logic, without verl."""
    monkeypatch.setattr(seams, "SEAMS", (Seam("json", "JSONDecoder", ("decode", "parse_object", "no_such")),))
    with pytest.raises(ConfigError) as e:
        seams.check_seams()
    message = str(e.value)
    assert message.startswith("trainer.v1.partial_rollout_checkpoint.enable: this verl (")
    assert "has no JSONDecoder.no_such" in message and "(0.9.1)" in message and "turn the flag off" in message
    assert "\n" not in message
    decoder = Seam("json", "JSONDecoder", ("decode", "parse_object"))  # parse_object: set in __init__
    monkeypatch.setattr(seams, "SEAMS", (decoder, Seam("json", "JSONDecodeError", bases=("JSONDecoder",))))
    with pytest.raises(ConfigError, match="has no JSONDecodeError derived from JSONDecoder"):
        seams.check_seams()
    monkeypatch.setattr(seams, "SEAMS", (Seam("partial_rollout_no_such_module"),))
    with pytest.raises(ConfigError, match="has no module partial_rollout_no_such_module"):
        seams.check_seams()
    monkeypatch.setattr(seams, "SEAMS", (Seam("json", None, ("loads", "load_everything")),))
    with pytest.raises(ConfigError, match=r"has no json\.load_everything"):
        seams.check_seams()
