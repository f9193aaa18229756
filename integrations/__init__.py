"""Trainers that use partial-rollout; the library under ``partial_rollout/`` knows none of them."""
