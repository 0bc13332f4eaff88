"""Score a per-role evaluation's recorded answers again, under the metrics as they are now.

    heart eval rescore docs/results/role-benchmark/eval/roles-distilled [--data DIR]

A metric's definition changes (a stratum told apart more finely, a baseline added); the
answers a model gave do not. Re-scoring reads ``roles_examples.jsonl`` (each answer as it was
decoded) and the held-out rows it answered (``config.data`` of ``roles.json``, or ``--data``),
scores every answer with :func:`heart_distill.eval.roles.score_row`, recomputes the figures
with the run's own seed, and rewrites both files. Nothing is decoded, so the answers, tokens
and latencies stay as measured; ``roles.json`` keeps the run's provenance and gains a
``rescored`` record (this command's stamp: command, commit, date, machine; and each figure
whose value changed, old and new), so a reader sees which numbers a later definition gives.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from heart.atomic import publish_text
from heart_distill.eval.roles import EXAMPLES, RESULTS, score_row


def row_key(row: dict[str, Any]) -> tuple:
    """What ties a recorded answer to the held-out row it answered."""
    return row["episode_id"], row["turn"], row["attempt"], row["step"]


def recorded_scores(role: str, row: dict[str, Any], record: dict[str, Any]) -> dict[str, Any]:
    """The scores of ``record``'s recorded answer to ``row``, under the checkout's metrics."""
    from heart.runtime.base import Generation

    generation = Generation(text=record["output"], backend="recorded", prompt_tokens=record["prompt_tokens"],
                            completion_tokens=record["completion_tokens"], latency_s=record["latency_s"])
    return score_row(role, row, generation)


def held_out_rows(data: Path, role: str, split: str) -> dict[tuple, dict[str, Any]]:
    from datasets import load_from_disk

    folder = data / role
    if not folder.is_dir():
        raise FileNotFoundError(f"no held-out rows for {role} at {folder} (pass --data)")
    return {row_key(r): r for r in load_from_disk(str(folder))[split]}


def rescore(folder: Path, data: Path | None = None, argv: list[str] | None = None) -> dict[str, Any]:
    """Re-score the evaluation in ``folder`` in place; returns the ``rescored`` record."""
    from heart_distill.eval.metrics import summarize
    from heart_distill.eval.provenance import stamp

    results = json.loads((folder / RESULTS).read_text())
    records = [json.loads(line) for line in (folder / EXAMPLES).open(encoding="utf-8")]
    config = results["config"]
    data = data or Path(config["data"])
    rows = {role: held_out_rows(data, role, config["split"]) for role in results["figures"]}
    rescored, changed = [], {}
    for record in records:
        role = record["role"]
        if record["errored"]:
            rescored.append(record)
            continue
        key = row_key(record)
        if key not in rows[role]:
            # episode ids hash the episode: another collection's rows under the same path match none
            raise ValueError(f"{folder / EXAMPLES}: {role} answer {key} has no held-out row in {data / role} "
                             "(pass --data: the rows this run answered)")
        rescored.append({**record, **recorded_scores(role, rows[role][key], record)})
    for role, old in results["figures"].items():
        scored = [r for r in rescored if r["role"] == role and not r["errored"]]
        new = {name: e.to_dict() for name, e in summarize(role, scored, config.get("seed", 0)).items()}
        changed[role] = {name: {"was": old.get(name), "now": figure} for name, figure in new.items()
                         if (old.get(name) or {}).get("value") != figure["value"]
                         or (old.get(name) or {}).get("n") != figure["n"]}
        results["figures"][role] = new
    command = shlex.join(["heart", *argv]) if argv is not None else None
    record = {**stamp(), **({"command": command} if command else {}),
              "changed": {role: c for role, c in changed.items() if c}}
    results.setdefault("rescored", []).append(record)
    publish_text(folder / EXAMPLES, "".join(json.dumps(r, ensure_ascii=False, default=str) + "\n" for r in rescored))
    publish_text(folder / RESULTS, json.dumps(results, indent=2, default=str) + "\n")
    return record


def main(argv: list[str], full_argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="heart eval rescore", description=__doc__.split("\n")[0])
    parser.add_argument("folders", nargs="+", type=Path, help="heart eval roles output folders (roles.json)")
    parser.add_argument("--data", type=Path, help="held-out role datasets (default: the folder roles.json names)")
    args = parser.parse_args(argv)
    for folder in args.folders:
        if not (folder / RESULTS).is_file() or not (folder / EXAMPLES).is_file():
            print(f"heart eval rescore: error: {folder} holds no {RESULTS} and {EXAMPLES}", file=sys.stderr)
            return 2
    for folder in args.folders:
        try:
            record = rescore(folder, args.data, full_argv)
        except (FileNotFoundError, ValueError, KeyError) as err:
            print(f"heart eval rescore: error: {err}", file=sys.stderr)
            return 2
        moved = [f"{role}.{name} {c['was']['value'] if c['was'] else None} -> {c['now']['value']}"
                 for role, names in record["changed"].items() for name, c in names.items()]
        print(f"{folder}: " + ("; ".join(moved) if moved else "every figure as recorded"))
    return 0
