"""Benchmark: how fast traces become role datasets.

    python bench/dataset_build.py                 # 20,000 episodes (~200k trace rows)
    python bench/dataset_build.py --episodes 2000 # a quick look

Writes a synthetic collection run (two shards, episodes interleaved as concurrent
collection writes them, every role call in its real format (Appendix D inputs and answers,
per-step verification) under long fixed system prompts; re-plans, failing primitives, injected faults,
failed and killed episodes, repeated tasks, a torn last line) into a temporary folder, then
measures side by side in one run:

1. a bare ``read_trace`` pass over the shards (JSON parsing only: the floor), and
2. ``build_role_datasets`` end to end (read, filter, dedupe, split, balance, save, cards),
   with whitespace token counting so that no tokenizer time is mixed in.

It prints rows read per second, examples written per second, and the build's cost as a
multiple of the bare read; what it prints also goes to ``--out`` (default
``runs/bench/dataset_build.txt``) under the run's provenance stamp.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from heart_distill.data.build import BuildOptions, build_role_datasets  # noqa: E402
from heart.roles import planner, primitive, router, verifier  # noqa: E402
from heart.roles.common import render_input  # noqa: E402
from heart.traces import TRACE_FORMAT_VERSION, TraceReadStats, read_trace  # noqa: E402
from heart_distill.eval.provenance import add_printed_out_argument, stamp, stamped_stdout  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "runs" / "bench" / "dataset_build.txt"
"""Where a run's output goes by default (runs/ is not tracked)."""

WORDS = ("file directory account balance transfer flight booking ticket message user send "
         "search create delete update list price stock order vehicle engine door window "
         "schedule meeting calendar email reply forward attach amount currency date time "
         "status result argument parameter value schema constraint required optional").split()


def paragraph(rng: random.Random, n_words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


def make_prompts(rng: random.Random) -> dict[str, str]:
    """Fixed system prompts per role (~1.5-2.5 KB, as HEART's Appendix D prompts)."""
    return {role: f"You are the {role} of HEART. " + paragraph(rng, words)
            for role, words in (("planner", 380), ("router", 300), ("primitive", 220),
                                ("verifier", 330))}


def write_run(run_dir: Path, episodes: int, seed: int = 0, concurrency: int = 8) -> int:
    rng = random.Random(seed)
    prompts = make_prompts(rng)
    schemas = [paragraph(rng, 150) for _ in range(50)]  # tool schemas inside Primitive prompts
    n_tasks = max(10, episodes // 10)
    task_text = {t: paragraph(rng, 60) for t in range(n_tasks)}
    envs = ("bfcl", "agentdojo")
    (run_dir / "traces").mkdir(parents=True)
    shards = [open(run_dir / "traces" / f"shard-{i}.jsonl", "w") for i in range(2)]
    rows = 0

    def event(ep, role, turn, attempt, step, user, output, extra=None, parse_error=None):
        return {
            "episode_id": ep["id"], "task_id": ep["task"], "env": ep["env"], "turn": turn,
            "attempt": attempt, "step": step, "role": role, "backend": "openai:http://t/v1#teacher",
            "adapter": None,
            "messages": [{"role": "system", "content": prompts[role]},
                         {"role": "user", "content": user}],
            "raw_output": json.dumps(output), "parsed": None if parse_error else output,
            "parse_error": parse_error, "latency_s": 0.5, "prompt_tokens": 900,
            "completion_tokens": 120, "extra": extra or {}, "kind": "event",
            "version": TRACE_FORMAT_VERSION,
        }

    tools = [{"name": f"tool_{i}", "description": paragraph(rng, 12), "category": f"cat{i % 4}"}
             for i in range(40)]
    params = {"type": "object", "properties": {"path": {"type": "string"}, "count": {"type": "integer"}},
              "required": ["path"]}
    intent = {"task": "t", "objective": "o", "tool_categories": ["cat0"], "constraints": []}

    def episode_rows(index: int):
        """One episode in the roles' real formats (Appendix D), per-step verification."""
        # A tenth of episodes replay an earlier one's randomness: exact duplicates, as when
        # a deterministic teacher sees the same task twice.
        erng = random.Random(seed * 1_000_003 + (index % (episodes * 9 // 10 + 1)))
        task = erng.randrange(n_tasks)
        ep = {"id": f"ep{index}", "task": f"task{task}", "env": envs[task % 2]}
        success = erng.random() < 0.7
        turns = 1 if erng.random() < 0.7 else erng.randint(2, 3)
        verdicts, replans = [], []
        for turn in range(turns):
            attempts = 1 + (erng.random() < 0.3) + (erng.random() < 0.1)
            feedback: list[str] = []
            for attempt in range(attempts):
                last = attempt == attempts - 1
                steps = erng.randint(1, 4)
                shown = erng.sample(tools, 10)
                payload = planner.build_payload(task_text[task], shown, feedback=list(feedback))
                plan = [{"step": i, "tool_category": shown[i]["category"], "tool_hint": shown[i]["name"],
                         "objective": paragraph(erng, 8), "dependencies": [i - 1] if i > 1 else []}
                        for i in range(1, steps + 1)]
                answer = {"status": "SUFFICIENT", "intent": intent, "plan": plan, "replanned": bool(feedback)}
                yield event(ep, "planner", turn, attempt, None, render_input(planner.INSTRUCTION, payload), answer)
                route_payload = router.build_payload(
                    task_text[task], [{k: s[k] for k in ("step", "tool_hint", "objective", "dependencies")} for s in plan],
                    {s["tool_hint"]: router.tool_parameters(params) for s in plan})
                words = task_text[task].split()
                dispatch = {"status": "READY", "dispatch": [
                    {"step": s["step"], "target_tool": s["tool_hint"], "invocation_request": paragraph(erng, 12),
                     "resolved_bindings": {"path": erng.choice(words)},
                     "h_params": {"retry": 1, "priority": "normal", "timeout_s": 30}} for s in plan]}
                fault = {"injected_fault": "wrong_argument", "fault_step": 1} if erng.random() < 0.03 else {}
                yield event(ep, "router", turn, attempt, None, render_input(router.INSTRUCTION, route_payload),
                            dispatch, extra=fault)
                for s, d in zip(plan, dispatch["dispatch"]):
                    status = "FAILURE" if (not last and s["step"] == steps) or erng.random() < 0.05 else "SUCCESS"
                    envelope = {"status": status, "tool": s["tool_hint"], "bound_arguments": d["resolved_bindings"],
                                "result": paragraph(erng, 30), "summary": paragraph(erng, 10),
                                "meta": {"latency_s": 0.01, "attempts": 1}}
                    card = primitive.tool_card(s["tool_hint"], paragraph(erng, 20), params)
                    prim_payload = primitive.build_payload(d["invocation_request"], d["resolved_bindings"], card)
                    yield event(ep, "primitive", turn, attempt, s["step"],
                                render_input(primitive.INSTRUCTION, prim_payload),
                                {"tool": s["tool_hint"], "arguments": d["resolved_bindings"]},
                                extra={"envelope": envelope})
                    entry = verifier.step_entry(s, d["invocation_request"], d["resolved_bindings"], envelope, params)
                    ver_payload = verifier.build_payload(task_text[task], intent, [entry])
                    verdict = "PASS" if status == "SUCCESS" and (last or s["step"] < steps) else "FAIL"
                    marks = dict.fromkeys(verifier.CRITERIA, "pass" if verdict == "PASS" else "fail")
                    parse_error = "no JSON object" if erng.random() < 0.02 else None
                    yield event(ep, "verifier", turn, attempt, s["step"],
                                render_input(verifier.INSTRUCTION, ver_payload),
                                {"status": verdict, "step": s["step"], "criteria": marks,
                                 "feedback": "" if verdict == "PASS" else paragraph(erng, 30)},
                                parse_error=parse_error)
                    if verdict == "FAIL":
                        feedback.append(paragraph(erng, 30))
                        break
            verdicts.append(verdict)
            replans.append(attempts - 1)
        if erng.random() < 0.005:  # killed mid-episode: no record
            return
        yield {"episode_id": ep["id"], "task_id": ep["task"], "env": ep["env"],
               "score": float(success), "success": success, "verdicts": verdicts,
               "replans_used": replans, "checker": {}, "backend": "teacher", "seed": 0,
               "wall_s": 3.0, "kind": "episode", "version": TRACE_FORMAT_VERSION}

    # Interleave `concurrency` episodes per shard, as concurrent collection writes them.
    live: list = []
    next_index = 0
    while live or next_index < episodes:
        while len(live) < concurrency and next_index < episodes:
            live.append((episode_rows(next_index), shards[next_index % 2]))
            next_index += 1
        pick = rng.randrange(len(live))
        generator, shard = live[pick]
        row = next(generator, None)
        if row is None:
            live.pop(pick)
            continue
        shard.write(json.dumps(row) + "\n")
        rows += 1
    shards[1].write('{"episode_id": "ep-killed", "kind": "ev')  # torn last line
    for shard in shards:
        shard.close()
    return rows


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=20_000)
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    add_printed_out_argument(parser, OUT)
    return parser


def main() -> None:
    args = build_parser().parse_args()
    with stamped_stdout(args.out, stamp(script=__file__)):
        measure(args)


def measure(args: argparse.Namespace) -> None:
    root = Path(tempfile.mkdtemp(prefix="heart-bench-build-"))
    try:
        run_dir = root / "run"
        start = time.perf_counter()
        written = write_run(run_dir, args.episodes)
        size_mb = sum(p.stat().st_size for p in (run_dir / "traces").iterdir()) / 2**20
        print(f"synthetic run: {args.episodes} episodes, {written} rows, {size_mb:.0f} MiB "
              f"in 2 shards (written in {time.perf_counter() - start:.1f} s)")

        start = time.perf_counter()
        stats = TraceReadStats()
        for path in sorted((run_dir / "traces").glob("*.jsonl")):
            for _ in read_trace(path, stats):
                pass
        read_s = time.perf_counter() - start
        rows = stats.events + stats.episodes

        report = build_role_datasets(run_dir, root / "datasets",
                                     BuildOptions(token_counter="whitespace"))
        build_s = report.elapsed_s
        examples = sum(sum(r["splits"].values()) for r in report.roles.values())
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

        print(f"bare read_trace:  {read_s:6.1f} s  {rows / read_s:9,.0f} rows/s  "
              f"{size_mb / read_s:6.1f} MiB/s  (torn lines: {stats.torn_lines})")
        print(f"full build:       {build_s:6.1f} s  {rows / build_s:9,.0f} rows/s  "
              f"{examples / build_s:9,.0f} examples/s written  ({examples} examples)")
        print(f"build / bare read: {build_s / read_s:.2f}x   stages (s): {report.timings_s}")
        print(f"token lengths counted as: {report.token_counter}; peak RSS {peak_mb:,.0f} MiB; "
              f"{os.cpu_count()} CPU(s)")
        for role, r in report.roles.items():
            removed = {k: v for k, v in r["removed"].items() if v}
            print(f"  {role:<9} {r['splits']}  removed {removed}")
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
