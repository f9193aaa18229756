"""Print what verl's TransferQueue checkpoint of one ``global_step_N`` holds: each key's tag, as JSON.

Usage: ``.venv-verl/bin/python tests/verl/tq_checkpoint.py GLOBAL_STEP_DIR [PARTITION]``

verl's ``_save_checkpoint`` writes ``global_step_N/transfer_queue/`` with TransferQueue 0.1.11's
``tq.save_checkpoint``: the controller's state is a pickle of its partitions, each mapping a key to
a global index (``keys_mapping``) and an index to its tag (``custom_meta``), the same key-to-tag
view ``tq.kv_list`` gives a running TransferQueue. Read here, in verl's environment (TQ's classes
unpickle only there), so a test in ``.venv`` can set it beside our snapshot of the same step.
"""

from __future__ import annotations

import json
import pickle
import sys
from pathlib import Path

CONTROLLER_STATE = Path("transfer_queue") / "controller_state.pkl"


def tags(step_dir: Path, partition_id: str = "train") -> dict[str, dict]:
    with (step_dir / CONTROLLER_STATE).open("rb") as f:
        state = pickle.load(f)  # verl's own file, read in verl's environment; nothing of ours is a pickle
    partition = state["partitions"][partition_id]
    return {key: dict(partition.custom_meta.get(index, {})) for key, index in partition.keys_mapping.items()}


if __name__ == "__main__":
    step_dir = Path(sys.argv[1])
    print(json.dumps(tags(step_dir, *sys.argv[2:3]), sort_keys=True))
