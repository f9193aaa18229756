"""One seed rule for every trainer: a sample's seed is a function of its identity, the library's."""

from __future__ import annotations

from partial_rollout.snapshot import sample_seed
from partial_rollout.snapshot._checks import INT64_MAX
from partial_rollout_integrations.reference_grpo import task
from partial_rollout_integrations.verl.server import sampling_spec
from partial_rollout_integrations.verl.wire import sample_key


def test_the_seed_is_the_identitys_and_fits_a_signed_64_bit_seed() -> None:
    # Pinned: a snapshot's continuation is exact only if a regenerated sample draws the same seed in
    # another process, Python version or release of this library.
    assert sample_seed(0, "e0:1", 0) == 5925336113700970492
    assert sample_seed(7, "uid", 1, 2) == 2417231033481472753
    assert sample_seed(7, "uid", 1, 0) == sample_seed(7, "uid", 1), "turn 0 is the single-turn seed"
    seeds = {
        sample_seed(run, group, index, turn)
        for run in (0, 1)
        for group in ("a", "b")
        for index in (0, 1)
        for turn in (0, 1)
    }
    assert len(seeds) == 16
    assert all(0 <= s <= INT64_MAX for s in seeds)


def test_every_trainer_seeds_with_it() -> None:
    item = {"max_tokens": 64}
    specs = task.sampling_specs(item, "e0:3", n=4, temperature=1.0, seed=11, min_tokens=1)
    assert [s.seed for s in specs] == [sample_seed(11, "e0:3", i) for i in range(4)]
    # verl sends no seed: its server seeds each sample from verl's uid and the sample's index.
    spec = sampling_spec({"temperature": 1.0}, key=sample_key("0f3c", 1), seed=11, response_length=8)
    assert spec.seed == sample_seed(11, "0f3c", 1)
    # A seed verl does send is kept; a greedy request gets none.
    assert sampling_spec({"seed": 5}, key=sample_key("0f3c", 1), seed=11, response_length=8).seed == 5
    assert sampling_spec({"temperature": 0.0}, key=sample_key("0f3c", 1), seed=11, response_length=8).seed is None
