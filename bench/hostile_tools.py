"""Hostile tools against a Tool Primitive: what each one becomes in the envelope and the trace.

    python bench/hostile_tools.py

Seven tools misbehave the ways real tools do — raise, call ``sys.exit``, hang past the
timeout, return megabytes, values JSON cannot encode, 5,000-deep nesting, a cycle — and each runs through
:func:`heart.primitives.execute` inside an episode's containment scope, then is written to
a trace. The table gives the envelope (status, failure type), the bytes its trace line
takes, the wall time, and whether the episode is marked errored (a call abandoned on
timeout may still change the environment's state). The tests assert the same facts
(tests/unit/test_failure_accounting.py); this prints them, and writes what it prints to
``--out`` (default ``runs/bench/hostile_tools.txt``) under the run's provenance stamp.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from heart.primitives import contained_tool_calls, execute  # noqa: E402
from heart.toolface import Tool, ToolSpec  # noqa: E402
from heart.traces import TraceWriter, read_trace  # noqa: E402
from heart_distill.eval.provenance import add_printed_out_argument, stamp, stamped_stdout  # noqa: E402

TIMEOUT_S = 1.0
OUT = Path(__file__).resolve().parents[1] / "runs" / "bench" / "hostile_tools.txt"
"""Where a run's output goes by default (runs/ is not tracked)."""


def hostile_tools(release: threading.Event) -> list[Tool]:
    def raises(text: str):
        raise ValueError("boom")

    def calls_sys_exit(text: str):
        raise SystemExit(3)

    def hangs(text: str):
        release.wait(30)
        return {"late": True}

    def returns_5_mb(text: str):
        return {"blob": "x" * 5_000_000}

    def returns_non_json(text: str):
        return {"set": {1, 2}, "object": object(), "bytes": b"\xff", 7: "int key", "nan": float("nan")}

    def deeply_nested(text: str):
        value: object = "leaf"
        for _ in range(5_000):
            value = [value]
        return value

    def cyclic(text: str):
        value: list = []
        value.append(value)
        return {"self": value}

    schema = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
    return [Tool(ToolSpec(fn.__name__, fn.__name__, schema), fn)
            for fn in (raises, calls_sys_exit, hangs, returns_5_mb, returns_non_json, deeply_nested, cyclic)]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_printed_out_argument(parser, OUT)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    with stamped_stdout(args.out, stamp(argv, __file__)):
        return measure()


def measure() -> int:
    release = threading.Event()
    print(f"{'tool':<18} {'status':<8} {'failure_type':<14} {'trace line':>11} {'wall s':>7}  errored  details")
    with tempfile.TemporaryDirectory() as tmp:
        for tool in hostile_tools(release):
            trace_path = Path(tmp) / f"{tool.name}.jsonl"
            with contained_tool_calls() as containment:
                start = time.perf_counter()
                envelope = execute(tool, {"text": "x"}, timeout_s=TIMEOUT_S)
                wall = time.perf_counter() - start
            with TraceWriter(trace_path, fsync=False) as trace:
                trace.write({"kind": "event", "version": 1, "role": "primitive", "envelope": envelope.to_dict()})
            (row,) = read_trace(trace_path)
            size = trace_path.stat().st_size
            detail = envelope.details or envelope.summary
            print(f"{tool.name:<18} {envelope.status:<8} {str(envelope.failure_type or '-'):<14} {size:>11,} "
                  f"{wall:>7.2f}  {'yes' if containment.abandoned else 'no ':<7}  {detail[:70]!r}")
            assert json.dumps(row)  # what the trace holds is plain JSON
    release.set()
    return 0


if __name__ == "__main__":
    sys.exit(main())
