"""Held-out role inputs: one role dataset per role from a run's *test*- (or dev-) split episodes.

``heart datasets build`` keeps test-split tasks out of every dataset a recipe trains on.
Evaluating a role needs the opposite: the teacher's answers on held-out tasks. This module
runs the very same trace reading and filters (:mod:`data.build`, :mod:`data.filters`) over
a collection of a held-out split and keeps only that split's examples, saved in the same
shape (``<out>/<role>``, a ``DatasetDict`` with one split named after it)::

    heart collect --env bfcl --split test --teacher gold --out runs/NAME-test
    python -m heart_distill.eval.heldout runs/NAME-test --out runs/NAME-test/datasets --split test
    heart eval roles --data runs/NAME-test/datasets --split test --roles base
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from heart_distill.data.build import features_for, read_shards, to_dataset
from heart_distill.data.filters import ROLES, dedupe
from heart.environments.splits import split_of


def build_heldout(run_dir: str | Path, out_dir: str | Path, split: str = "test",
                  overwrite: bool = False) -> dict[str, int]:
    """Write ``<out_dir>/<role>`` with the ``split`` examples of ``run_dir``'s traces;
    returns the example count per role."""
    from datasets import DatasetDict

    if split not in ("dev", "test"):
        raise ValueError(f"held-out split must be 'dev' or 'test', got {split!r}")
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    files = sorted((run_dir / "traces").glob("*.jsonl"))
    if not files:
        raise FileNotFoundError(f"no trace files: {run_dir / 'traces'}/*.jsonl matches nothing")
    existing = [out_dir / role for role in ROLES if (out_dir / role).exists()]
    if existing and not overwrite:
        raise FileExistsError(f"{', '.join(map(str, existing))} already exist(s): pass --overwrite")
    collector, _ = read_shards(files, ROLES)
    counts = {}
    for role in ROLES:
        rows = [e for e in collector.examples[role] if split_of(e["env"], e["task_id"]) == split]
        rows, _ = dedupe(rows)
        counts[role] = len(rows)
        dataset = to_dataset(rows, features_for(role))  # an empty split keeps its columns
        DatasetDict({split: dataset}).save_to_disk(str(out_dir / role))
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m heart_distill.eval.heldout", description=__doc__.split("\n")[0])
    parser.add_argument("run", help="a collection run folder (with traces/) of held-out tasks")
    parser.add_argument("--out", required=True, help="output folder: <out>/<role>")
    parser.add_argument("--split", default="test", choices=["dev", "test"])
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args(argv)
    try:
        counts = build_heldout(args.run, args.out, args.split, args.overwrite)
    except (FileNotFoundError, FileExistsError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for role, n in counts.items():
        print(f"  {role:<9} {args.split} {n}")
    if not any(counts.values()):
        print(f"error: no {args.split}-split example in {args.run}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
