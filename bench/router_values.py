"""Where the Router's wrong values come from, on the whole-loop benchmark's one-call BFCL tasks.

    python bench/router_values.py --bench docs/results/e2e-benchmark --arm planner-simple --arm distilled-1206b \
        --out bench/results/router_values.json

For each failed episode of ``bfcl-simple`` and ``bfcl-multiple`` (one gold call) whose first
plan's Router bindings fail BFCL's checker (the ``router_binding`` failure point of
:mod:`heart_distill.eval.bench_e2e`), each bound argument is judged alone: the gold call with
that one argument replaced by the Router's (as the tool boundary binds it) is put to the
checker. A rejected value is then sorted by where it could have come from: the request's text
(:mod:`heart.grounding`: the value occurs there as written; a short number may occur by
chance), only the Planner's step objective, or neither (made up or transformed); an argument
left out counts as missing where the checker rejects the gold call without it. Counts per arm
and condition, with a few examples each, beside the same sort of the gold calls' own values
(how many "bind only what the request says" would refuse).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from heart.environments import load_environment  # noqa: E402  (after the path insert)
from heart.environments.base import ToolCall  # noqa: E402
from heart.grounding import grounded  # noqa: E402
from heart.settings import LoopConfig  # noqa: E402
from heart_distill.eval.bench_e2e import bindings_accepted, failure_point, router_calls, task_events  # noqa: E402
from heart_distill.eval.provenance import stamp, write_stamped_json  # noqa: E402

CONDITIONS = {"bfcl-simple": "simple", "bfcl-multiple": "multiple"}
EXAMPLES = 4
REPLAN_BUDGET = LoopConfig().replan_budget  # not read before router_binding is decided


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bench", default="docs/results/e2e-benchmark", help="the e2e benchmark's ledger folder")
    parser.add_argument("--arm", action="append", default=[], help="an arm of the ledger (repeatable)")
    parser.add_argument("--out", default="runs/bench/router_values.json")
    return parser


def objectives(events: list[dict]) -> str:
    """The step objectives of the first turn's first plan, as one text."""
    plan = next((e["parsed"]["plan"] for e in events if e.get("role") == "planner" and e.get("turn", 0) == 0
                 and (e.get("parsed") or {}).get("plan")), [])
    return " ".join(str(step.get("objective", "")) for step in plan)


def origin(value, request: str, plan_text: str) -> str:
    if grounded(value, request):
        return "in the request"
    return "only in the plan's objective" if grounded(value, plan_text) else "in neither"


def arm_figures(bench: Path, condition: str, arm: str) -> dict:
    environment = load_environment("bfcl", CONDITIONS[condition])
    counts, examples, episodes = Counter(), [], {}
    for folder in sorted((bench / condition).glob(f"chunk-*/{arm}")):
        rows = [json.loads(line) for line in (folder / "episodes.jsonl").read_text().splitlines() if line.strip()]
        failed = {r["task_id"]: r for r in rows if not r.get("errored") and not r["success"]}
        episodes.update(failed)
        for task_id, events in task_events(folder, failed).items():
            task = environment.load_task(task_id)
            accepts = functools.partial(bindings_accepted, environment, task_id)
            if failure_point(events, failed[task_id], task.gold, REPLAN_BUDGET, accepts) != "router_binding":
                continue  # it broke elsewhere first (the plan), or later
            counts["router_binding episodes"] += 1
            (bound,), (gold,) = router_calls(events), task.gold[0]
            request, plan_text = task.turns[0], objectives(events)
            for name, value in gold.arguments.items():
                if name not in bound.arguments:  # left out: wrong only where the checker wants it
                    left_out = {k: v for k, v in gold.arguments.items() if k != name}
                    counts["argument missing"] += not accepts([ToolCall(gold.name, left_out)])
                    continue
                alone = ToolCall(gold.name, {**gold.arguments, name: bound.arguments[name]})
                if not accepts([alone]):
                    where = origin(bound.arguments[name], request, plan_text)
                    counts[f"wrong value, {where}"] += 1
                    if sum(e["origin"] == where for e in examples) < EXAMPLES:
                        examples.append({"task": task_id, "argument": name, "bound": bound.arguments[name],
                                         "gold": value, "origin": where})
    return {"failed": len(episodes), **dict(sorted(counts.items())), "examples": examples}


def gold_figures(condition: str) -> dict:
    """The same sort applied to the gold calls' values over the condition's test tasks: how
    many a rule "bind only what the request says" would keep (the baseline of the origins)."""
    environment = load_environment("bfcl", CONDITIONS[condition])
    counts = Counter()
    for task_id in environment.task_ids("test"):
        task = environment.load_task(task_id)
        (gold,) = task.gold[0]
        outside = [name for name, value in gold.arguments.items() if not grounded(value, task.turns[0])]
        counts["tasks"] += 1
        counts["tasks with a gold value not in the request"] += bool(outside)
        counts["gold values"] += len(gold.arguments)
        counts["gold values not in the request"] += len(outside)
    return dict(counts)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    bench = Path(args.bench)
    if not args.arm:
        print("router_values: name at least one --arm", file=sys.stderr)
        return 2
    missing = [arm for arm in args.arm if not list((bench / "bfcl-simple").glob(f"chunk-*/{arm}"))]
    if missing:
        print(f"router_values: {bench}/bfcl-simple has no chunk for arm(s) {missing}", file=sys.stderr)
        return 2
    result = {condition: {"gold": gold_figures(condition),
                          **{arm: arm_figures(bench, condition, arm) for arm in args.arm}} for condition in CONDITIONS}
    for condition, arms in result.items():
        for arm, figures in arms.items():
            print(condition, arm, {k: v for k, v in figures.items() if k != "examples"})
    write_stamped_json(args.out, result, stamp(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
