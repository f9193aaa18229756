"""The CPU harness's reward: 1 when the reply's length in characters has the prompt's parity, else 0.

A rule-based reward function in the form verl's ``reward.custom_reward_function.path`` loads.
"""

from __future__ import annotations

from typing import Any


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None, **_: Any) -> float:
    del data_source, extra_info
    return float(len(solution_str) % 2 == int(ground_truth))
