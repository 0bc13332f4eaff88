"""Mine the result shapes the carried validation checks: per tool, what its successful results look like.

    python bench/result_shapes.py --out heart/result_shapes.json   # the shipped table: BFCL + AgentDojo train
    python bench/result_shapes.py --envs agentdojo                 # → runs/bench/result_shapes.json

Runs the gold teacher over each environment's train split (no model; the loop with
messages and post-execution checks off, so the table does not check itself), keeps the
SUCCESS envelopes of tool steps in episodes the benchmark's checker accepted, and builds one
JSON Schema per tool from their results with ``genson`` (types, properties, and as
``required`` the keys every result had), cut below ``--depth`` levels to their types: a
shape, not a copy of the data. Results cut for size are left out. Writes the versioned table
(:func:`heart.validation.shapes_document`, the run's provenance stamp as its ``source``) that
:mod:`heart.validation` loads at run time, and prints per environment the episodes, the
tools and results mined.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from genson import SchemaBuilder  # noqa: E402

from heart.environments import load_environment  # noqa: E402
from heart.environments.splits import split_of  # noqa: E402
from heart.episode import run_episode  # noqa: E402
from heart.families import CODE_PRIMITIVE  # noqa: E402
from heart.loop import LoopConfig  # noqa: E402
from heart_distill.data.gold_teacher import GoldTeacher  # noqa: E402
from heart.validation import CUT_MARKER, shapes_document  # noqa: E402
from heart_distill.eval.provenance import stamp, write_stamped_json  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "runs" / "bench" / "result_shapes.json"
"""Where a run's table goes by default (runs/ is not tracked); ``--out heart/result_shapes.json``
replaces the shipped one."""
MINING = LoopConfig(messages=False, validation="none")
"""The loop the table is mined with: nothing of what it mines takes part."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--envs", nargs="+", default=["bfcl", "agentdojo"], choices=["bfcl", "agentdojo"])
    parser.add_argument("--depth", type=int, default=3, help="levels of structure kept (default: %(default)s)")
    parser.add_argument("--limit", type=int, default=0, help="first N train tasks per environment (0: all)")
    parser.add_argument("--out", type=Path, default=OUT, help="the table (default: %(default)s)")
    return parser


def types_of(schema: dict) -> dict:
    """Only the type(s) of a schema: what a level below the kept depth keeps."""
    if "anyOf" in schema:
        kinds = sorted({k for s in schema["anyOf"] for k in _listed(types_of(s).get("type"))})
        return {"type": kinds if len(kinds) > 1 else kinds[0]} if kinds else {}
    return {"type": schema["type"]} if "type" in schema else {}


def _listed(kind) -> list:
    return kind if isinstance(kind, list) else [kind] if kind else []


def cut(schema: dict, depth: int) -> dict:
    """``schema`` with its structure kept ``depth`` levels deep, types only below."""
    if depth <= 0:
        return types_of(schema)
    out = {k: v for k, v in schema.items() if k not in ("$schema", "properties", "items", "anyOf")}
    if "properties" in schema:
        out["properties"] = {k: cut(v, depth - 1) for k, v in schema["properties"].items()}
    if isinstance(schema.get("items"), dict):
        out["items"] = cut(schema["items"], depth - 1)
    if "anyOf" in schema:
        out["anyOf"] = [cut(s, depth) for s in schema["anyOf"]]
    return out


def mine(name: str, limit: int, builders: dict[str, SchemaBuilder], counts: dict[str, int]) -> dict:
    environment = load_environment(name)
    task_ids = [t for t in environment.task_ids("train") if split_of(name, t) == "train"][:limit or None]
    episodes = valid = 0
    for task_id in task_ids:
        task = environment.load_task(task_id)
        results: list[tuple[str, object]] = []

        def observe(kind: str, payload: dict) -> None:
            envelope = payload.get("envelope") if kind == "result" else None
            if envelope is not None and envelope.ok and not envelope.reused and envelope.tool != CODE_PRIMITIVE:
                results.append((envelope.tool, envelope.result))

        outcome = run_episode(environment, task, GoldTeacher(task, environment.catalog()), config=MINING,
                              observe=observe)
        episodes += 1
        if not outcome.record.success:  # only what the benchmark's checker accepted
            continue
        valid += 1
        for tool, result in results:
            if isinstance(result, str) and CUT_MARKER in result:
                continue
            builders.setdefault(tool, SchemaBuilder()).add_object(result)
            counts[tool] += 1
    return {"episodes": episodes, "valid": valid}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    run_stamp = stamp(argv, __file__)
    builders: dict[str, SchemaBuilder] = {}
    counts: dict[str, int] = defaultdict(int)
    print("| env | train episodes | valid (mined) | tools | results |\n|---|---|---|---|---|")
    per_env = {}
    for name in args.envs:
        start = time.perf_counter()
        before = (set(builders), sum(counts.values()))
        per_env[name] = mine(name, args.limit, builders, counts)
        tools = len(set(builders) - before[0])
        print(f"| {name} | {per_env[name]['episodes']} | {per_env[name]['valid']} | {tools} | "
              f"{sum(counts.values()) - before[1]} | ({time.perf_counter() - start:.0f} s)", flush=True)
    schemas = {tool: {**cut(b.to_schema(), args.depth), "x-results": counts[tool]} for tool, b in builders.items()}
    document = shapes_document(schemas, {"split": "train", "environments": per_env, "depth": args.depth})
    write_stamped_json(args.out, document, run_stamp)
    print(f"\n{len(schemas)} tools → {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
