"""Messages between primitives and carried validation, counted in a collection's traces.

    python bench/primitive_evidence.py                         # gold teacher, BFCL + AgentDojo train
    python bench/primitive_evidence.py --runs runs/<name> ...  # count existing collections instead

Without ``--runs`` it runs the gold teacher over each environment's train split (no model;
the loop's defaults: messages on, carried validation with the shipped result shapes) and
counts, per environment, from the traces: episodes and those valid by the benchmark's
checker; messages-mode calls, their answers that parsed, the messages sent (with a note,
and those whose field named nothing in the result) and the dependent steps whose Primitive
was shown one; tool SUCCESS envelopes by result ``shape`` and by ``state_change``
(:mod:`heart.validation`), with the tools behind each outcome that is not ok. Written to
``--out`` (default ``runs/bench/primitive_evidence.json``) under the run's provenance stamp.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from heart.environments import load_environment  # noqa: E402
from heart.episode import run_episode  # noqa: E402
from heart.roles import primitive_messages  # noqa: E402
from heart.roles.common import role_input  # noqa: E402
from heart_distill.data.gold_teacher import GoldTeacher  # noqa: E402
from heart.traces import TraceWriter, read_trace  # noqa: E402
from heart_distill.eval.provenance import stamp, write_stamped_json  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "runs" / "bench" / "primitive_evidence.json"
"""Where a run's result goes by default (runs/ is not tracked)."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--envs", nargs="+", default=["bfcl", "agentdojo"], choices=["bfcl", "agentdojo"])
    parser.add_argument("--split", default="train")
    parser.add_argument("--runs", nargs="+", type=Path, default=[],
                        help="collection run folders to count (their traces/*.jsonl) instead of running the gold teacher")
    parser.add_argument("--out", type=Path, default=OUT, help="result JSON, stamped (default: %(default)s)")
    return parser


def gold_collection(name: str, split: str, path: Path) -> Path:
    environment = load_environment(name)
    with TraceWriter(path, fsync=False) as trace:
        for task_id in environment.task_ids(split):
            task = environment.load_task(task_id)
            run_episode(environment, task, GoldTeacher(task, environment.catalog()), trace=trace)
    return path


def count(paths: list[Path]) -> dict[str, dict]:
    """Per environment: the counts the module docstring lists."""
    by_env: dict[str, dict] = defaultdict(lambda: {
        "episodes": 0, "valid": 0, "messages_calls": 0, "messages_parsed": 0, "messages_sent": 0,
        "messages_with_note": 0, "messages_unresolved": 0, "dependents_shown_messages": 0,
        "tool_successes": 0, "shape": Counter(), "state_change": Counter(), "not_ok": defaultdict(Counter)})
    for path in paths:
        for row in read_trace(path):
            counts = by_env[row["env"]]
            if row["kind"] == "episode":
                counts["episodes"] += 1
                counts["valid"] += bool(row["success"])
                continue
            if row["role"] != "primitive":
                continue
            extra = row.get("extra") or {}
            envelope = extra.get("envelope") or {}
            if extra.get("mode") == primitive_messages.MODE:
                counts["messages_calls"] += 1
                counts["messages_parsed"] += row["parse_error"] is None
                sent = envelope.get("messages", [])
                counts["messages_sent"] += len(sent)
                counts["messages_with_note"] += sum(bool(m.get("note")) for m in sent)
                counts["messages_unresolved"] += len(extra.get("unresolved_messages", []))
                continue
            if extra.get("mode"):  # another mode (relevance): no envelope
                continue
            payload = role_input(row["messages"])
            counts["dependents_shown_messages"] += any("messages" in u for u in payload.get("upstream_context", []))
            validation = envelope.get("validation")
            if envelope.get("status") == "SUCCESS" and validation:
                counts["tool_successes"] += 1
                for check in ("shape", "state_change"):
                    outcome = validation.get(check, "absent")
                    counts[check][outcome] += 1
                    if outcome not in ("ok", "n/a"):
                        counts["not_ok"][f"{check}={outcome}"][envelope.get("tool")] += 1
    return {env: {**c, "shape": dict(c["shape"]), "state_change": dict(c["state_change"]),
                  "not_ok": {k: dict(v.most_common()) for k, v in c["not_ok"].items()}}
            for env, c in sorted(by_env.items())}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    run_stamp = stamp(argv, __file__)
    with tempfile.TemporaryDirectory() as tmp:
        if args.runs:
            paths = sorted(p for run in args.runs for p in (run / "traces").glob("*.jsonl"))
            if not paths:
                print(f"no traces/*.jsonl under {', '.join(map(str, args.runs))}", file=sys.stderr)
                return 2
        else:
            paths = [gold_collection(name, args.split, Path(tmp) / f"{name}.jsonl") for name in args.envs]
        result = count(paths)
    print("| env | valid | messages calls (parsed) | messages sent (with note, unresolved) | dependents shown one "
          "| tool successes | shape ok/mismatch/unknown | state change ok/unmatched/none/n-a |\n"
          "|---|---|---|---|---|---|---|---|")
    for env, c in result.items():
        shape, change = c["shape"], c["state_change"]
        print(f"| {env} | {c['valid']}/{c['episodes']} | {c['messages_calls']} ({c['messages_parsed']}) | "
              f"{c['messages_sent']} ({c['messages_with_note']}, {c['messages_unresolved']}) | "
              f"{c['dependents_shown_messages']} | {c['tool_successes']} | "
              f"{shape.get('ok', 0)}/{shape.get('mismatch', 0)}/{shape.get('unknown', 0)} | "
              f"{change.get('ok', 0)}/{change.get('unmatched', 0)}/{change.get('none', 0)}/{change.get('n/a', 0)} |")
    write_stamped_json(args.out, {"settings": {"split": args.split, "runs": [str(r) for r in args.runs]},
                                  "environments": result}, run_stamp)
    print(f"\n→ {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
