"""Tiny causal LMs and tokenizers built offline (see :mod:`partial_rollout.models.tiny`)."""
