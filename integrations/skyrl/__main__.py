"""Run SkyRL's fully async trainer, with partial rollouts when the config turns them on.

Usage (in SkyRL's environment, ``.venv-skyrl``: ``bash scripts/setup_skyrl.sh``), with SkyRL's own
``key.path=value`` overrides::

    python -m partial_rollout_integrations.skyrl trainer.fully_async.enabled=true \\
        generator.inference_engine.run_engines_locally=false \\
        generator.inference_engine.external_proxy_url=http://host:8000 \\
        generator.inference_engine.external_server_urls='["http://host:8000"]' \\
        trainer.fully_async.partial_rollout_checkpoint.enable=true ...

It stands where SkyRL's fully async example entry point stands (a ``BasePPOExp`` whose trainer is
``FullyAsyncRayPPOTrainer``): with the flag off, that is what runs, nothing of ours installed. With
it on, the settings are checked first (each refusal one line naming the key, exit status 3), then
that this SkyRL has every name the integration uses (:mod:`.seams`), and the
trainer is :class:`~.trainer.PartialRolloutTrainer`; the servers are the durable servers of
:mod:`.server`, named as SkyRL's external servers.

``python -m partial_rollout_integrations.skyrl.cpu`` (tests and the demo) runs the same experiment with
training stood in for on CPU.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> None:
    from skyrl.train.utils.utils import initialize_ray

    from partial_rollout_integrations.skyrl.experiment import PartialRolloutExp, parse

    cfg = parse(sys.argv[1:] if argv is None else argv)
    initialize_ray(cfg)
    PartialRolloutExp(cfg).run()


if __name__ == "__main__":
    main()
