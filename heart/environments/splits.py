"""The toolkit's one deterministic split of task ids into train / dev / test.

A task's split is a pure function of its environment name and its task's *content group*
(a SHA-256 bucket of the group's canonical id), so it is the same on every machine, in every
run, for collection, datasets and evaluation, and adding tasks never moves an existing task
to another split.

A content group holds the tasks that ask the same thing in another form. BFCL builds several
categories by rewriting others: ``multi_turn_long_context_N``, ``multi_turn_miss_func_N`` and
``multi_turn_miss_param_N`` ask the questions of ``multi_turn_base_N`` (the first user turn is
identical for 200/200 and 182/200; miss_param splits a turn in two), and 96 of the 200
``multiple`` tasks are ``simple_python`` queries with distractor functions added. Splitting by
id alone would let a test task train in another form, so every BFCL task takes the split of
the first task of its group (:data:`BFCL_GROUP_ORDER`): tasks of one id family (same N) and
tasks whose first user turn is the same text are one group.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
from functools import lru_cache
from pathlib import Path

SPLITS = {"train": 0.6, "dev": 0.1, "test": 0.3}
"""Fraction of task ids in each split."""

SPLITS_VERSION = 2
"""Bumped whenever a task may change split (2: BFCL content groups across categories), so
content-addressed stages that read a split (collections, datasets, held-out sets) rerun."""

BFCL_GROUP_ORDER = (
    "multi_turn_base", "multi_turn_long_context", "multi_turn_miss_func", "multi_turn_miss_param",
    "simple_python", "multiple", "parallel", "parallel_multiple",
)
"""BFCL test categories grouped by content, in the order that picks a group's canonical task
(the first category, then the lowest number): every category the toolkit runs, and
miss_func, which rewrites base tasks too."""

BFCL_REWRITES = {"multi_turn_long_context_": "multi_turn_base_", "multi_turn_miss_func_": "multi_turn_base_",
                 "multi_turn_miss_param_": "multi_turn_base_"}
"""Id families that rewrite another task of the same number (prefix → the rewritten task's
prefix): grouped even where the first turn differs (miss_param withholds a parameter)."""

_NUMBER = re.compile(r"(\d+)$")


def _bfcl_first_turns() -> dict[str, str]:
    """Task id → its first user turn, for every task of :data:`BFCL_GROUP_ORDER` (read from
    the installed ``bfcl_eval`` data without importing the package)."""
    spec = importlib.util.find_spec("bfcl_eval")
    if spec is None:  # no BFCL installed: no BFCL tasks to group
        return {}
    data = Path(spec.submodule_search_locations[0]) / "data"
    turns: dict[str, str] = {}
    for category in BFCL_GROUP_ORDER:
        with (data / f"BFCL_v4_{category}.json").open() as handle:
            for line in handle:
                if line.strip():
                    entry = json.loads(line)
                    turns[entry["id"]] = "\n".join(m["content"] for m in entry["question"][0]
                                                   if m["role"] == "user").strip()
    return turns


def _order(task_id: str) -> tuple[int, int]:
    category = next(i for i, c in enumerate(BFCL_GROUP_ORDER) if _NUMBER.sub("", task_id) == c + "_")
    return category, int(_NUMBER.search(task_id).group(1))


@lru_cache(maxsize=1)
def bfcl_canonical_ids() -> dict[str, str]:
    """BFCL task id → the canonical id of its content group (only ids that differ from it)."""
    turns = _bfcl_first_turns()
    parent = {task_id: task_id for task_id in turns}

    def root(task_id: str) -> str:
        while parent[task_id] != task_id:
            parent[task_id] = parent[parent[task_id]]
            task_id = parent[task_id]
        return task_id

    def join(a: str, b: str) -> None:
        a, b = root(a), root(b)
        if a != b:
            first, second = sorted((a, b), key=_order)
            parent[second] = first

    by_turn: dict[str, str] = {}
    for task_id in sorted(turns, key=_order):
        for prefix, original in BFCL_REWRITES.items():
            if task_id.startswith(prefix) and original + task_id[len(prefix):] in parent:
                join(task_id, original + task_id[len(prefix):])
        join(task_id, by_turn.setdefault(turns[task_id], task_id))
    return {task_id: root(task_id) for task_id in turns if root(task_id) != task_id}


def group_id(env: str, task_id: str) -> str:
    """The canonical id of the content group ``task_id`` of ``env`` belongs to."""
    if env == "bfcl":
        return bfcl_canonical_ids().get(task_id, task_id)
    return task_id


def split_of(env: str, task_id: str) -> str:
    """The split ("train", "dev" or "test") that ``task_id`` of ``env`` belongs to."""
    digest = hashlib.sha256(f"{env}\x00{group_id(env, task_id)}".encode()).digest()
    bucket = int.from_bytes(digest[:8], "big") / 2**64
    edge = 0.0
    for name, fraction in SPLITS.items():
        edge += fraction
        if bucket < edge:
            return name
    return name  # float round-off at the very top of the range
