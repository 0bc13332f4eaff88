"""The harness optimizer's positive control: a planted tool-boundary defect whose repair is known.

    python bench/optimize_control.py                                   # 8 runs, BFCL simple + multiple
    python bench/optimize_control.py --runs 1 --out runs/bench/optimize_control_1.json   # one run, to time it

The setting (docs/optimize.md, "The positive control"): the arm ``gold+primitive:<adapters>``
— the gold teacher plays Planner, Router and Verifier, the role benchmark's distilled Tool
Primitive (``docs/results/role-benchmark/adapters/primitive``, SmolLM2-135M on llama.cpp f16)
plays the Primitive — on BFCL simple and multiple. The planted defect: the Primitive's answer
schema writes scalars as text (``loop.argument_types: {primitive: string}``: integers and
numbers as numeric strings, booleans as "true"/"false", enum options upper-cased), so its
calls reach the tool boundary as ``"5"`` for an integer and ``"CELSIUS"`` for ``celsius``.
The seed harness binds arguments as given (``seed_middleware: none``): jsonschema refuses
those calls (``'5' is not of type 'integer'``, ``'CELSIUS' is not one of [...]``). The known
repair is the shipped default middleware (coercion, enum casefold): the reference arm
``distilled+default``.

Each run (one split seed: its own repair, gate and scorecard tasks) runs the search from the
seed with the deterministic proposer, then scores the seed, the reference and the selected
harness on the run's scorecard. Per run: the reference's scorecard lift over the seed (the
known repair's), the search's, and whether the search recovered at least half of it; the
search's proposal tally (gated candidates, why the others were not). Written to ``--out``
(default ``runs/bench/optimize_control.json``) under the run's provenance stamp; the
protocol's own files (logs, harnesses, recorded answers) go to ``--work``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from heart_distill.eval.optimize.cli import report  # noqa: E402  (after the path insert)
from heart_distill.eval.optimize.proposers import make_proposer  # noqa: E402
from heart_distill.eval.optimize.protocol import ProtocolConfig, World, scorecard_run, search_run  # noqa: E402
from heart_distill.eval.optimize.report import recovery  # noqa: E402
from heart_distill.eval.optimize.search import describe_tally, min_budget  # noqa: E402
from heart_distill.eval.provenance import stamp, write_stamped_json  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "runs" / "bench" / "optimize_control.json"
"""Where a run's result goes by default (runs/ is not tracked)."""
WORK = REPO / "runs" / "bench" / "optimize-control"
ADAPTERS = REPO / "docs" / "results" / "role-benchmark" / "adapters"
ARM = "distilled"


def control_config(work: Path, runs: int, slots: list[str], adapters: Path = ADAPTERS) -> ProtocolConfig:
    """The positive control as a protocol recipe (module docstring): 8 repair + 8 gate tasks
    per run, B = min_budget(8, 8, 3) = 64 (the seed plus three candidates all the way, whatever
    replay saves); scorecards of 12 tasks; one split seed per run."""
    sizes = {"repair": 4, "gate": 4, "scorecard": 6}
    return ProtocolConfig(
        out=str(work), conditions=["bfcl:simple", "bfcl:multiple"], model="smollm2-135m", engine="llamacpp:f16",
        arms={ARM: f"gold+primitive:{adapters}"}, optimize=[ARM], proposer="deterministic",
        pools={"repair": 8, "gate": 10, "scorecard": 16}, sizes=sizes, split_seeds=list(range(runs)), repeats=1,
        search={"generations": 3, "mutations": 3, "population": 5,
                "budget": min_budget(2 * sizes["repair"], 2 * sizes["gate"], 3)},
        budget_runs=[1, 2], concurrency=4, slots=slots, seed_middleware="none",
        loop={"replan_budget": 3, "max_plan_steps": 6, "argument_types": {"primitive": "string"}})


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=8, help="optimizer runs (one split seed each; default 8)")
    parser.add_argument("--slots", nargs="+", default=["middleware", "prompt", "joint"],
                        choices=["middleware", "prompt", "joint"], help="the search's mutation slots (default: all)")
    parser.add_argument("--adapters", type=Path, default=ADAPTERS, help="the Primitive's adapters folder")
    parser.add_argument("--work", type=Path, default=WORK, help="the protocol's files (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=OUT, help="result JSON, stamped (default: %(default)s)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    run_stamp = stamp(argv)
    config = control_config(args.work, args.runs, args.slots, args.adapters)
    world = World(config)
    proposer = make_proposer(config.proposer)
    per_run = {}
    started = time.perf_counter()
    for rid in config.run_ids():
        t0 = time.perf_counter()
        log = search_run(config, ARM, rid, world, proposer, log=lambda m: None)
        t1 = time.perf_counter()
        card = scorecard_run(config, rid, world, log=print)
        per_run[rid] = {"search_wall_s": round(t1 - t0, 1), "scorecard_wall_s": round(time.perf_counter() - t1, 1),
                        "selected": log["selected"],
                        "selected_harness": next(c["describe"] for c in log["candidates"] if c["id"] == log["selected"]),
                        "selected_intercepts": _intercepts(log),
                        "gate_lift": log["gate_lift"], "rollouts": log["spent"]["rollouts"],
                        "budget": config.search_config.budget, "proposals": log["proposals"],
                        "seed_diagnosis": log.get("seed_diagnosis"),
                        "scorecard": {a: sum(v["scores"].values()) / len(v["scores"]) for a, v in card["arms"].items()}}
        print(f"{rid}: selected {log['selected']} ({per_run[rid]['selected_harness']}), gate lift "
              f"{log['gate_lift']:+.1f}; {describe_tally(log['proposals'])}; search {t1 - t0:.0f} s, "
              f"scorecard {per_run[rid]['scorecard_wall_s']:.0f} s", flush=True)
    doc = report(config, argv)
    control = recovery([json.loads((args.work / "scorecard" / f"{rid}.json").read_text()) for rid in config.run_ids()],
                       ARM)
    for row in control["runs"]:
        row.update(per_run[row["run"]])
    result = {"kind": "optimize-positive-control",
              "setting": {"arm": config.arms[ARM], "conditions": config.conditions, "seed_middleware": "none",
                          "reference": "seed prompts + default middleware", "loop": config.loop,
                          "pools": config.pools, "sizes": config.sizes, "search": config.search, "slots": config.slots,
                          "proposer": config.proposer, "engine": config.engine},
              "criterion": f"the search recovers at least {100 * control['share']:.0f}% of the reference's scorecard "
                           "lift over the seed",
              "runs_reaching": control["reached"], "runs": control["n"],
              "runs_without_reference_lift": control["no_reference_lift"],
              "per_run": control["runs"], "figures": doc["figures"], "arms": doc["arms"],
              "wall_s": round(time.perf_counter() - started, 1)}
    write_stamped_json(args.out, result, run_stamp)
    print(f"{control['reached']} of {control['n']} runs recovered >= {100 * control['share']:.0f}% of the known "
          f"repair's lift; wrote {args.out}")
    return 0


def _intercepts(log: dict) -> list[str]:
    """The ids of the selected harness's intercepts (its middleware.yaml), none for the seed."""
    import yaml

    folder = Path(next(c["folder"] for c in log["candidates"] if c["id"] == log["selected"]))
    path = folder / "middleware.yaml"
    return [r["id"] for r in (yaml.safe_load(path.read_text()).get("intercepts") or [])] if path.is_file() else []


if __name__ == "__main__":
    sys.exit(main())
