"""The toolkit's one deterministic split of task ids into train / dev / test.

A task's split is a pure function of its environment name and task id (a SHA-256 bucket),
so it is the same on every machine, in every run, for collection, datasets and evaluation,
and adding tasks never moves an existing task to another split.
"""

from __future__ import annotations

import hashlib

SPLITS = {"train": 0.6, "dev": 0.1, "test": 0.3}
"""Fraction of task ids in each split."""


REWRITES = {("bfcl", "multi_turn_miss_param_"): "multi_turn_base_"}
"""Task families that rewrite another task (environment, id prefix → the other's id
prefix): a rewritten task takes the split of the task it rewrites, so a test task never
trains in another form. BFCL's ``multi_turn_miss_param_N`` is ``multi_turn_base_N`` with
one turn split in two (the request without a parameter, then the user's turn giving it);
no other id is affected."""


def split_of(env: str, task_id: str) -> str:
    """The split ("train", "dev" or "test") that ``task_id`` of ``env`` belongs to."""
    for (family_env, prefix), original in REWRITES.items():
        if env == family_env and task_id.startswith(prefix):
            task_id = original + task_id[len(prefix):]
    digest = hashlib.sha256(f"{env}\x00{task_id}".encode()).digest()
    bucket = int.from_bytes(digest[:8], "big") / 2**64
    edge = 0.0
    for name, fraction in SPLITS.items():
        edge += fraction
        if bucket < edge:
            return name
    return name  # float round-off at the very top of the range
