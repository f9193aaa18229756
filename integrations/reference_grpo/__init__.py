"""The reference async GRPO trainer: NeMo RL's SingleController loop in miniature, on a CPU.

Run it with ``partial-rollout train CONFIG [key=value ...] [--resume]`` or
``python -m integrations.reference_grpo CONFIG ...``; ``configs/demo.yaml`` is what
``partial-rollout demo`` trains, ``configs/fast.yaml`` what the tests train.
"""

from integrations.reference_grpo.config import CONFIG_DIR, MasterConfig, load_config
from integrations.reference_grpo.controller import CapturingEngine, GRPOLoop, RolloutEngine, run_training

__all__ = ["CONFIG_DIR", "CapturingEngine", "GRPOLoop", "MasterConfig", "RolloutEngine", "load_config", "run_training"]
