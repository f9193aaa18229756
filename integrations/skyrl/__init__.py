"""Partial rollouts for SkyRL's fully async trainer (``skyrl`` 0.4.0).

SkyRL's trainer reaches its inference servers over HTTP only, so the two halves live in different
environments: the servers where vLLM is (the project's ``.venv``), SkyRL's controller in
``.venv-skyrl`` (``scripts/setup_skyrl.sh``).

Where each piece lives:

- :mod:`.server`: the inference server SkyRL's client talks to, on our engine adapter; samples kept
  by SkyRL's session id, cut and handed back (runs in ``.venv``, imports no SkyRL).
- :mod:`.checkpoint`: the trainer's side of a save and a resume: one cut of the servers, one
  snapshot file, and the samples handed back (imports no SkyRL or vLLM).
- :mod:`.wire`: what crosses between them (a held sample as JSON, SkyRL's session ids).
- ``requirements-controller.txt``: SkyRL's controller environment, pinned.
"""
