"""Partial rollouts for NeMo RL's async GRPO SingleController, without forking NeMo RL.

Turned on by ``checkpointing.partial_rollouts.enabled: true`` in a NeMo RL YAML (or the override
``++checkpointing.partial_rollouts.enabled=true``) when the run is started through this package's
entry point (``python -m partial_rollout_integrations.nemo_rl``), which mirrors NeMo RL's
``examples/run_grpo_single_controller.py``. With the flag off nothing of ours is installed.

Where each piece lives:

- :mod:`.config`: the ``checkpointing.partial_rollouts`` block, validated like NeMo RL's own
  ``extra="forbid"`` blocks (a misspelled key fails, it never silently disables durability).
- :mod:`.seams`: the NeMo RL methods we hook, checked at set-up against the tested commit.
- :mod:`.datum`: a NeMo RL ``DatumSpec`` to and from JSON (tensors included), no pickle.
- :mod:`.session`: the ledger of every prompt the loader yields, the engine requests of each
  sample, and the cut a checkpoint takes of them.
- :mod:`.generation`: the generation backend NeMo RL's rollout calls, on our resumable engines.
- :mod:`.hooks`: the loader, rollout and replay-buffer wrappers that report to the session.
- :mod:`.controller`: the SingleController subclass that cuts at save and restores at resume.
- :mod:`.cpu`: the parts a CPU-only run needs where NeMo RL needs CUDA (training step, NCCL weight
  sync), used by the tests and the demo.
"""
