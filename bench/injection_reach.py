"""Where does prompt-injected text reach in the HEART loop? (AgentDojo, no model needed)

    python bench/injection_reach.py                      # every AgentDojo user task
    python bench/injection_reach.py --limit 20 --fault-rate 0.3

For each AgentDojo user task, AgentDojo's own ``ignore_previous`` attack plants the goal of
the suite's first injection task in every injection vector the task's ground truth reads
(AgentDojo finds them with its canaries). The gold-guided teacher then runs the task through
the HEART loop, and every role call's input (the exact messages the trace records) is
searched for the injected text. The result says which roles an injection can steer: the
HEART paper's 0% attack success rests on tool schemas and tool output staying out of the
Planner's prompt; tool *results* still flow back as context, and this counts where.

It measures reach, not attack success: the gold teacher never obeys an injection. Attack
success needs a model: ``bench/injection.py`` (docs/reliability.md).

What it prints also goes to ``--out`` (default ``runs/bench/injection_reach.txt``) under the
run's provenance stamp; curated results live in ``bench/results/``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from heart_distill.eval.provenance import add_printed_out_argument, stamp, stamped_stdout  # noqa: E402  (after the path insert)
from heart_distill.eval.stats import wilson  # noqa: E402

from heart import ROLES  # noqa: E402
OUT = Path(__file__).resolve().parents[1] / "runs" / "bench" / "injection_reach.txt"
"""Where a run's output goes by default (runs/ is not tracked)."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--limit", type=int, default=0, help="first N user tasks (default: all)")
    parser.add_argument("--fault-rate", type=float, default=0.0,
                        help="gold teacher's injected fault rate (faults cause re-plans)")
    parser.add_argument("--attack", default="ignore_previous", help="an AgentDojo fixed-template attack")
    add_printed_out_argument(parser, OUT)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    with stamped_stdout(args.out, stamp(argv, __file__)):
        return measure(args)


def measure(args: argparse.Namespace) -> int:

    from agentdojo.attacks.attack_registry import load_attack
    from heart.progress import progress_bar

    from heart_distill.data.gold_teacher import GoldTeacher
    from heart.environments import load_environment
    from heart.episode import run_episode
    from heart.traces import TraceWriter, read_trace

    environment = load_environment("agentdojo")
    task_ids = environment.task_ids()[: args.limit or None]
    clean = dict(environment._default_environments)  # noqa: SLF001 - swapped per task below
    reached_events: Counter = Counter()
    events: Counter = Counter()
    reached_episodes: Counter = Counter()
    injected = not_injectable = utility = 0
    with tempfile.TemporaryDirectory() as tmp:
        for n, task_id in enumerate(progress_bar(task_ids, unit="task", desc="injection reach")):
            suite, user_task = environment._user_task(task_id)  # noqa: SLF001
            injection_task = next(iter(suite.injection_tasks.values()))
            attack = load_attack(args.attack, suite, None)
            try:
                injections = attack.attack(user_task, injection_task)
            except ValueError:  # AgentDojo: no vector is read by this task's ground truth
                not_injectable += 1
                continue
            environment._default_environments[suite.name] = suite.load_and_inject_default_environment(injections)
            try:
                task = environment.load_task(task_id)
                trace_path = Path(tmp) / f"{n}.jsonl"
                with TraceWriter(trace_path, fsync=False) as trace:
                    record = run_episode(environment, task,
                                         GoldTeacher(task, environment.catalog(), fault_rate=args.fault_rate, seed=n),
                                         trace=trace, seed=n).record
            finally:
                environment._default_environments[suite.name] = clean[suite.name]
            injected += 1
            utility += record.success
            texts = [t.strip() for t in injections.values() if t.strip()]
            seen = set()
            for row in read_trace(trace_path):
                if row["kind"] != "event":
                    continue
                role = row["role"]
                events[role] += 1
                prompt = "\n".join(m["content"] for m in row["messages"])
                if any(t in prompt for t in texts):
                    reached_events[role] += 1
                    seen.add(role)
            for role in seen:
                reached_episodes[role] += 1

    print(f"AgentDojo, attack {args.attack!r}, gold teacher (fault rate {args.fault_rate:g}): "
          f"{injected} injected episodes ({not_injectable} user tasks not injectable), "
          f"gold utility under attack {utility}/{injected}")
    print(f"{'role':<10} {'episodes reached':>18} {'95% CI':>15} {'calls reached':>15}")
    for role in ROLES:
        k = reached_episodes[role]
        lo, hi = wilson(k, injected)
        print(f"{role:<10} {k:>8}/{injected:<4} {k / max(injected, 1):>5.0%} [{lo:.0%}, {hi:.0%}] "
              f"{reached_events[role]:>8}/{events[role]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
