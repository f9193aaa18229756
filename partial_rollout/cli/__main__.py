"""``python -m partial_rollout.cli``: the same as the ``partial-rollout`` command."""

import sys

from partial_rollout.cli import main

sys.exit(main())
