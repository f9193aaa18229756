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
from typing import Any

from partial_rollout.errors import EXIT_BAD_INPUT, BadInputError


def parse(overrides: list[str]) -> Any:
    """SkyRL's config with our block, from SkyRL's overrides, checked; a refusal exits 3 with one line."""
    from skyrl.train.utils import validate_cfg

    from partial_rollout_integrations.skyrl.config import PartialRolloutTrainConfig
    from partial_rollout_integrations.skyrl.experiment import check_supported
    from partial_rollout_integrations.skyrl.seams import check_seams

    try:
        cfg = PartialRolloutTrainConfig.from_cli_overrides(overrides)
        if cfg.trainer.fully_async.partial_rollout_checkpoint.enable:
            check_supported(cfg)
            check_seams()
    except (BadInputError, ValueError) as e:
        print(f"partial-rollout: {e}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
    validate_cfg(cfg)
    return cfg


def main(argv: list[str] | None = None) -> None:
    from skyrl.train.utils.utils import initialize_ray

    from partial_rollout_integrations.skyrl.experiment import PartialRolloutExp

    cfg = parse(sys.argv[1:] if argv is None else argv)
    initialize_ray(cfg)
    PartialRolloutExp(cfg).run()


if __name__ == "__main__":
    main()
