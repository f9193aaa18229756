"""Partial rollouts for verl's V1 async trainer (``colocate_async``, ``separate_async``), without forking verl.

Turned on by ``trainer.v1.partial_rollout_checkpoint.enable=true`` when the run is started through
this package's entry point (``python -m partial_rollout_integrations.verl``, in ``.venv-verl``),
which mirrors ``python -m verl.trainer.main_ppo``. With the flag off nothing of ours is installed.

Where each piece lives:

- :mod:`.config`: the ``trainer.v1.partial_rollout_checkpoint`` block (unknown keys refused), and
  ``configs/partial_rollout_checkpoint.yaml``, verl's ``ppo_trainer`` with the block added.
- :mod:`.setup_checks`: the verl settings partial rollouts support, refused at set-up otherwise.
- :mod:`.seams`: the tested verl versions and every verl name the integration uses, probed at set-up.
- :mod:`.runner`: verl's ``TaskRunnerV1``, training with our trainer classes.
- ``requirements-controller.txt``: verl's controller environment, pinned (``scripts/setup_verl.sh``).
"""
