"""partial-rollout: lose nothing at a checkpoint in asynchronous RL post-training."""

__version__ = "0.1.0"
