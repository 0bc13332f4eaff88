"""Per-step vs whole-attempt verification, side by side on the same tasks and faults.

Runs the fault-injecting gold teacher through the loop twice per (task, seed) — once with
``LoopConfig(verify="step")`` (Algorithm 1: the Verifier judges each step right after it
runs) and once with ``verify="attempt"`` (all steps run, then one Verifier call) — and
prints, per variant: episodes the benchmark's checker accepts, turns passed, role calls per
role and prompt tokens (SmolLM2 tokenizer over the exact messages sent; whitespace words if
it is not prepared). The teacher is seeded per task, so both variants meet the same faults.

    python bench/verify_modes.py [--env bfcl] [--split dev] [--tasks 20] [--fault-rate 0.3] [--seeds 0 1 2]

What it prints also goes to ``--out`` (default ``runs/bench/verify_modes.txt``) under the run's
provenance stamp; curated results live in ``bench/results/``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from heart_distill.eval.provenance import add_printed_out_argument, stamp, stamped_stdout  # noqa: E402  (after the path insert)

OUT = Path(__file__).resolve().parents[1] / "runs" / "bench" / "verify_modes.txt"
"""Where a run's output goes by default (runs/ is not tracked)."""


def run_variant(environment, task_ids, verify: str, fault_rate: float, seeds: list[int], trace_path: Path):
    from heart_distill.data.gold_teacher import GoldTeacher
    from heart.episode import run_episode
    from heart.loop import LoopConfig
    from heart.traces import TraceWriter, read_trace

    with TraceWriter(trace_path, fsync=False) as trace:
        for seed in seeds:
            for task_id in task_ids:
                task = environment.load_task(task_id)
                teacher = GoldTeacher(task, environment.catalog(), fault_rate=fault_rate, seed=seed)
                run_episode(environment, task, teacher, trace=trace, seed=seed, config=LoopConfig(verify=verify))
    return list(read_trace(trace_path))


def summarize(rows, counter) -> dict:
    events = [r for r in rows if r["kind"] == "event"]
    records = [r for r in rows if r["kind"] == "episode"]
    missed = {e["episode_id"] for e in events if e["extra"].get("retrieval_miss")}
    calls = Counter(e["role"] for e in events)
    tokens = counter.count([e["messages"] for e in events])
    return {
        "episodes": len(records),
        "valid": sum(r["success"] for r in records),
        "without_miss": sum(r["episode_id"] not in missed for r in records),
        "valid_without_miss": sum(r["success"] for r in records if r["episode_id"] not in missed),
        "turns": sum(len(r["verdicts"]) for r in records),
        "turns_passed": sum(v == "PASS" for r in records for v in r["verdicts"]),
        "replans": sum(sum(r["replans_used"]) for r in records),
        "calls": calls,
        "prompt_tokens": sum(tokens),
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="bfcl", choices=["bfcl", "agentdojo"])
    parser.add_argument("--split", default="dev")
    parser.add_argument("--tasks", type=int, default=20)
    parser.add_argument("--fault-rate", type=float, default=0.3)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--tokenizer", default="default", help="'default' (SmolLM2), 'whitespace', or a tokenizer")
    add_printed_out_argument(parser, OUT)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    with stamped_stdout(args.out, stamp(argv, __file__)):
        return measure(args)


def measure(args: argparse.Namespace) -> int:

    from heart_distill.data.card import load_token_counter
    from heart.environments import load_environment

    environment = load_environment(args.env)
    task_ids = environment.task_ids(args.split)[: args.tasks]
    counter = load_token_counter(args.tokenizer)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for verify in ("step", "attempt"):
            rows = run_variant(environment, task_ids, verify, args.fault_rate, args.seeds, Path(tmp) / f"{verify}.jsonl")
            results[verify] = summarize(rows, counter)

    print(f"{args.env} {args.split}: {len(task_ids)} tasks × seeds {args.seeds}, gold teacher with fault rate "
          f"{args.fault_rate:g}; prompt tokens counted as {counter.name}")
    print()
    print("| verify | episodes valid | valid w/o retrieval miss | turns passed | re-plans | planner | router "
          "| primitive | verifier | role calls | prompt tokens |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for verify, r in results.items():
        c = r["calls"]
        print(f"| {verify} | {r['valid']}/{r['episodes']} | {r['valid_without_miss']}/{r['without_miss']} "
              f"| {r['turns_passed']}/{r['turns']} | {r['replans']} "
              f"| {c['planner']} | {c['router']} | {c['primitive']} | {c['verifier']} | {sum(c.values())} "
              f"| {r['prompt_tokens']:,} |")
    step, attempt = results["step"], results["attempt"]
    print()
    print(f"step / attempt: role calls {sum(step['calls'].values()) / max(1, sum(attempt['calls'].values())):.2f}×, "
          f"prompt tokens {step['prompt_tokens'] / max(1, attempt['prompt_tokens']):.2f}×")
    return 0


if __name__ == "__main__":
    sys.exit(main())
