"""Re-plans revise only the implicated work: the loop's ledger against a Planner that redoes.

    python bench/replan_reuse.py                        # BFCL + AgentDojo train, fault rate 0.3
    python bench/replan_reuse.py --envs agentdojo --fault-rate 0.5

Runs the gold teacher over each environment's train split, with injected faults (so turns
re-plan), in four arms: the teacher's Planner re-plans what is left (as collections do) or
redoes the turn from its first call (``GoldTeacher(redo_passed=True)``: what a model's Planner
that ignores "do not redo SUCCESS steps" writes), each with the loop's ledger on (passed
calls and succeeded state-changing calls are kept, :mod:`heart.ledger`) or off (every step of
every plan executes, as before the ledger; the ledger still counts). Per arm: episodes valid
by the benchmark's checker, and what :func:`heart.ledger.audit_trace` reads from the trace —
steps kept (``reused_steps``), passed steps executed again, state-changing calls executed
twice in a turn. Written to ``--out`` (default ``runs/bench/replan_reuse.json``) under the
run's provenance stamp.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import heart.loop  # noqa: E402  (after the path insert)
from heart.environments import load_environment  # noqa: E402
from heart.episode import run_episode  # noqa: E402
from heart.ledger import COUNTERS, TurnLedger, audit_trace  # noqa: E402
from heart_distill.data.gold_teacher import GoldTeacher  # noqa: E402
from heart.traces import TraceWriter, read_trace  # noqa: E402
from heart_distill.eval.provenance import stamp, write_stamped_json  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "runs" / "bench" / "replan_reuse.json"
"""Where a run's result goes by default (runs/ is not tracked)."""


class CountingLedger(TurnLedger):
    """The ledger off: nothing is ever reused (the loop before it), every execution counted."""

    def reusable(self, tool, arguments):
        return None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--envs", nargs="+", default=["bfcl", "agentdojo"], choices=["bfcl", "agentdojo"])
    parser.add_argument("--split", default="train")
    parser.add_argument("--fault-rate", type=float, default=0.3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--limit", type=int, default=0, help="first N tasks per environment (0: all)")
    parser.add_argument("--out", type=Path, default=OUT, help="result JSON, stamped (default: %(default)s)")
    return parser


def run_arm(environment, task_ids: list[str], path: Path, fault_rate: float, seed: int, redo: bool,
            ledger: bool) -> dict:
    heart.loop.TurnLedger = TurnLedger if ledger else CountingLedger
    start = time.perf_counter()
    try:
        with TraceWriter(path, fsync=False) as trace:
            for task_id in task_ids:
                task = environment.load_task(task_id)
                teacher = GoldTeacher(task, environment.catalog(), fault_rate=fault_rate, seed=seed, redo_passed=redo)
                run_episode(environment, task, teacher, trace=trace, seed=seed)
    finally:
        heart.loop.TurnLedger = TurnLedger
    rows = list(read_trace(path))
    records = [r for r in rows if r["kind"] == "episode"]
    audit = audit_trace(rows)
    return {"episodes": len(records), "valid": sum(r["success"] for r in records),
            "errored": sum(r["errored"] for r in records),
            "replans": sum(sum(r["replans_used"]) for r in records),
            **{name: audit[name] for name in COUNTERS},
            "episodes_with_repeats": len(audit["episodes_with_repeats"]),
            "wall_s": round(time.perf_counter() - start, 1)}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    run_stamp = stamp(argv, __file__)
    result: dict = {"settings": {"split": args.split, "fault_rate": args.fault_rate, "seed": args.seed,
                                 "limit": args.limit}, "arms": {}}
    print(f"| env | Planner | ledger | valid | re-plans | kept (reused) | passed steps re-executed | "
          f"state-changing executed twice |\n|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.envs:
            environment = load_environment(name)
            task_ids = environment.task_ids(args.split)[:args.limit or None]
            for redo in (False, True):
                for ledger in (False, True):
                    planner = "redoes the turn" if redo else "plans what is left"
                    arm = run_arm(environment, task_ids, Path(tmp) / f"{name}-{redo}-{ledger}.jsonl",
                                  args.fault_rate, args.seed, redo, ledger)
                    result["arms"][f"{name}/{'redo' if redo else 'left'}/{'ledger' if ledger else 'no-ledger'}"] = arm
                    print(f"| {name} | {planner} | {'on' if ledger else 'off'} | {arm['valid']}/{arm['episodes']} | "
                          f"{arm['replans']} | {arm['reused_steps']} | {arm['passed_steps_reexecuted']} | "
                          f"{arm['state_changing_executed_twice']} |", flush=True)
    write_stamped_json(args.out, result, run_stamp)
    print(f"\n→ {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
