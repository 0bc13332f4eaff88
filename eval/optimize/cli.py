"""``heart optimize``: run the protocol of a recipe, stage by stage, resumably.

    heart optimize --recipe recipes/smollm2-135m/optimize.yaml
    heart optimize --recipe R --stage search --arm base --runs s0r0 s0r1     one piece
    heart optimize --recipe R --stage report                                 figures only

Each finished piece (an arm's search of one run, one run's scorecard) is a file under the
recipe's ``out`` and is skipped when run again; ``--max-minutes`` stops after the piece that
crosses it, so a long protocol runs as several short commands. The report goes to
``<out>/optimize.json`` and ``<out>/optimize.md`` (``--report-out`` also writes the JSON there).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any



def add_arguments(parser: argparse.ArgumentParser) -> None:
    from heart_distill.arguments import optimize_arguments

    optimize_arguments(parser)


def main(args: argparse.Namespace, argv: list[str] | None = None) -> int:
    from heart_distill.eval.optimize.proposers import make_proposer
    from heart_distill.eval.optimize.protocol import World, load_recipe, scorecard_run, search_run

    overrides = {k: v for k, v in (("out", args.out), ("proposer", args.proposer), ("slots", args.slots),
                                   ("answers", args.answers),
                                   ("seed_middleware", getattr(args, "seed_middleware", None))) if v}
    try:
        config = load_recipe(args.recipe, overrides)
        proposer = make_proposer(config.proposer)
    except (OSError, ValueError) as err:
        print(f"heart optimize: error: {err}", file=sys.stderr)
        return 2
    runs = args.runs or config.run_ids()
    unknown = [r for r in runs if r not in config.run_ids()]
    if unknown:
        print(f"heart optimize: error: --runs {unknown} are not runs of the recipe ({config.run_ids()})", file=sys.stderr)
        return 2
    arms = args.arm or config.optimize
    started = time.perf_counter()
    world = World(config)

    def out_of_time() -> bool:
        if args.max_minutes is not None and time.perf_counter() - started > 60 * args.max_minutes:
            print(f"heart optimize: stopping after {args.max_minutes} min; run the same command again to resume")
            return True
        return False

    try:
        if args.stage in ("search", "all"):
            for rid in runs:
                for arm in arms:
                    log = search_run(config, arm, rid, world, proposer)
                    print(f"search {arm} {rid}: selected {log['selected']} (gate lift {log['gate_lift']:+.1f}), "
                          f"{log['spent']['rollouts']} rollouts; {proposals_line(log)}")
                    if out_of_time():
                        return 0
        if args.stage in ("scorecard", "all"):
            for rid in runs:
                scorecard_run(config, rid, world)
                if out_of_time():
                    return 0
        if args.stage in ("report", "all"):
            doc = report(config, argv)
            print("\n".join(doc["markdown"]))
            if args.report_out:
                from heart_distill.eval.provenance import stamp, write_stamped_json

                stamped = stamp(argv)
                if argv is not None:  # the command as a user types it, not the interpreter's view
                    stamped["command"] = "heart " + shlex.join(argv)
                write_stamped_json(args.report_out, {k: v for k, v in doc.items() if k != "markdown"}, stamped)
                print(f"wrote {args.report_out}")
    except ValueError as err:
        print(f"heart optimize: error: {err}", file=sys.stderr)
        return 2
    return 0


def proposals_line(log: dict[str, Any]) -> str:
    """What the run proposed and gated (a log written before the count was kept says so)."""
    from heart_distill.eval.optimize.search import describe_tally

    return describe_tally(log["proposals"]) if log.get("proposals") else "proposals not counted in this log"


def report(config: Any, argv: list[str] | None = None) -> dict[str, Any]:
    """Gather every finished run into the figures; written to <out>/optimize.json and .md."""
    from heart.atomic import publish_text
    from heart_distill.eval.optimize import report as figures_of
    from heart_distill.eval.provenance import provenance

    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    scorecards = [json.loads((out / "scorecard" / f"{rid}.json").read_text()) for rid in config.run_ids()
                  if (out / "scorecard" / f"{rid}.json").is_file()]
    logs = {}
    for arm in config.optimize:
        for rid in config.run_ids():
            path = out / "runs" / arm / rid / "log.json"
            if path.is_file():
                log = json.loads(path.read_text())
                logs[f"{arm}/{rid}"] = {"selected": log["selected"], "gate_lift": log["gate_lift"],
                                        "seed_gate_pass": log["seed_gate_pass"], "spent": log["spent"],
                                        "budget": config.search_config.budget,
                                        "proposals": log.get("proposals"),
                                        "wall_s": log.get("wall_s"), "computed_role_calls": log.get("computed_role_calls"),
                                        "seed_diagnosis": log.get("seed_diagnosis"),
                                        "selected_harness": next(c["describe"] for c in log["candidates"]
                                                                 if c["id"] == log["selected"])}
    doc = {"kind": "optimize", "recipe": {k: v for k, v in vars(config).items()},
           "runs_done": [s["run"] for s in scorecards],
           "arms": figures_of.arm_scores(scorecards),
           "figures": figures_of.figures(scorecards, config.optimize, config.budget_runs, config.resamples),
           "searches": logs,
           "seed": config.seed_harness().describe(),
           "recovery": ({arm: figures_of.recovery(scorecards, arm) for arm in config.optimize}
                        if config.reference_harness() is not None else {}),
           "scorecard_cost": {s["run"]: {a: {"rollouts": v.get("rollouts"), "tokens": v.get("tokens")}
                                         for a, v in s["arms"].items()} for s in scorecards},
           "provenance": provenance(argv)}
    doc["markdown"] = figures_of.markdown(doc)
    publish_text(out / "optimize.json", json.dumps({k: v for k, v in doc.items() if k != "markdown"}, indent=1,
                                                   default=str) + "\n")
    publish_text(out / "optimize.md", "\n".join(doc["markdown"]) + "\n")
    return doc
