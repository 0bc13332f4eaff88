"""Property-based fuzz of every role parser and of the loop: malformed and adversarial outputs.

    python bench/fuzz.py                      # 10,000 cases per role + 2,000 loop turns
    python bench/fuzz.py --cases 500 --loop-cases 100

Every case must end as a ParseResult holding either a value or an error (a recorded, typed
failure): zero exceptions, zero hangs. The cases are drawn with hypothesis from each role's
own output JSON Schema (``<role>.output_schema``, the one constrained decoding uses), so
they follow the role formats wherever those go, then broken on purpose: truncated JSON,
wrong types, extra and missing keys, huge strings, unicode, nested garbage, references to
steps that do not exist, unregistered tool names, prose and code fences around the JSON.
``tests/unit/test_fuzz.py`` runs a fast sample of the same strategies. What it prints also goes
to ``--out`` (default ``runs/bench/fuzz.txt``) under the run's provenance stamp.
"""

from __future__ import annotations

import argparse
import gc
import json
import re
import signal
import sys
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from heart.roles import planner, primitive, router, verifier  # noqa: E402
from heart.roles.common import ParseResult  # noqa: E402
from heart_distill.eval.provenance import add_printed_out_argument, stamp, stamped_stdout  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "runs" / "bench" / "fuzz.txt"
"""Where a run's output goes by default (runs/ is not tracked)."""

# -- the parsing context every case is judged in ----------------------------------------------

TOOLS = ["ls", "cat", "touch"]
"""The registered tools of the fuzz world (the Planner may name only these)."""
TOOL_PARAMETERS = {
    "ls": {"type": "object", "properties": {}, "required": []},
    "cat": {"type": "object", "properties": {"file_name": {"type": "string"}}, "required": ["file_name"]},
    "touch": {"type": "object", "properties": {"file_name": {"type": "string"},
                                               "mode": {"type": "integer", "minimum": 0}},
              "required": ["file_name"]},
}
PLAN_STEPS = {1: "ls", 2: "cat"}
"""The plan the Router and the Primitive serve."""


@dataclass(frozen=True)
class RoleUnderTest:
    name: str
    parse: Callable[[str], ParseResult]
    schema: dict[str, Any]


def role_payloads() -> dict[str, dict[str, Any]]:
    """Each role's input in the fuzz world, as the loop builds it."""
    tools = [{"name": t, "description": f"The {t} tool.", "category": "FileSystem"} for t in TOOLS]
    plan = [{"step": s, "tool_hint": t, "objective": f"run {t}", "dependencies": []} for s, t in PLAN_STEPS.items()]
    step = verifier.step_entry(plan[1], "Read notes.txt.", {"file_name": "notes.txt"},
                               {"status": "SUCCESS", "tool": "cat", "summary": "cat returned text."},
                               TOOL_PARAMETERS["cat"])
    return {
        "planner": planner.build_payload("Show me the notes.", tools, may_ask=True, max_steps=4),
        "router": router.build_payload("Show me the notes.", plan,
                                       {t: router.tool_parameters(TOOL_PARAMETERS[t]) for t in TOOLS}),
        "primitive": primitive.build_payload("Read notes.txt.", {"file_name": "notes.txt"},
                                             primitive.tool_card("cat", "Read a file.", TOOL_PARAMETERS["cat"])),
        "verifier": verifier.build_payload("Show me the notes.", {"task": "read", "objective": "show notes"}, [step]),
    }


def roles_under_test() -> list[RoleUnderTest]:
    """Each role's parser bound to the fuzz world, with the schema of its valid answers
    (both read from the role's own input, as at serving)."""
    payloads = role_payloads()
    modules = {"planner": planner, "router": router, "primitive": primitive, "verifier": verifier}
    return [RoleUnderTest(name, lambda text, m=module, p=payloads[name]: m.parse_for_input(text, p),
                          module.schema_for_input(payloads[name]))
            for name, module in modules.items()]


# -- strategies ------------------------------------------------------------------------------

JSON_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12),
                         st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=20))
GARBAGE = st.recursive(JSON_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)), max_leaves=12)
"""Nested JSON of any shape."""

ADVERSARIAL_STRINGS = st.one_of(
    st.text(max_size=40),
    st.text(alphabet=st.characters(min_codepoint=0x80, max_codepoint=0x10FFFF, exclude_categories=("Cs",)),
            max_size=30),
    st.builds(lambda n: "A" * n, st.integers(10_000, 200_000)),  # huge
    st.sampled_from(["$step_99.result", "$step_0.x", "$step_-1", "$step_2.result.files.999", "$step_1.",
                     "$step_1.result.__class__", "{{", "}", "\\u0000", "\u202e", "\x00", "null",
                     "no_such_tool", "rm -rf /", "'; DROP TABLE tools; --", "💥" * 50]),
)


def from_schema(schema: Any, depth: int = 0) -> st.SearchStrategy:
    """Values valid for the subset of JSON Schema the role schemas use."""
    if schema is True or schema == {} or depth > 6:
        return GARBAGE
    if schema is False:
        return st.nothing()
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return st.one_of([from_schema(s, depth + 1) for s in schema[key]])
    kind = schema.get("type")
    if kind == "object":
        props = schema.get("properties", {})
        required = [k for k in schema.get("required", []) if k in props]
        optional = {k: from_schema(v, depth + 1) for k, v in props.items() if k not in required}
        return st.fixed_dictionaries({k: from_schema(props[k], depth + 1) for k in required}, optional=optional)
    if kind == "array":
        prefix = schema.get("prefixItems")
        if prefix:
            lo = schema.get("minItems", 0)
            return st.integers(lo, len(prefix)).flatmap(
                lambda n: st.tuples(*[from_schema(p, depth + 1) for p in prefix[:n]]).map(list))
        items = schema.get("items", {})
        return st.lists(from_schema(items, depth + 1), min_size=schema.get("minItems", 0),
                        max_size=min(schema.get("maxItems", 4), 4))
    if kind == "string":
        lo, hi = schema.get("minLength", 0), min(schema.get("maxLength", 60), 60)
        return st.text(min_size=lo, max_size=max(lo, hi))
    if kind == "integer":
        return st.integers(schema.get("minimum", -1000), schema.get("maximum", 1000))
    if kind == "number":
        return st.floats(allow_nan=False, allow_infinity=False)
    if kind == "boolean":
        return st.booleans()
    return GARBAGE


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    found = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            found += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found += _paths(v, (*prefix, i))
    return found


def _set(value: Any, path: tuple, new: Any) -> Any:
    if not path:
        return new
    head, *rest = path
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[head] = _set(copy[head], tuple(rest), new)
    return copy


def _drop(value: Any, path: tuple) -> Any:
    if not path:
        return value
    *parent, last = path
    def drop_in(node: Any, where: list) -> Any:
        if not where:
            copy = dict(node) if isinstance(node, dict) else list(node)
            del copy[last]
            return copy
        head, *rest = where
        copy = dict(node) if isinstance(node, dict) else list(node)
        copy[head] = drop_in(copy[head], rest)
        return copy
    return drop_in(value, list(parent))


@st.composite
def mutated(draw, valid: st.SearchStrategy) -> Any:
    """A valid answer broken in one to three places."""
    value = draw(valid)
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(value)
        path = draw(st.sampled_from(paths))
        how = draw(st.sampled_from(["type", "drop", "extra", "string", "garbage", "tool", "reference"]))
        if how == "drop" and path:
            value = _drop(value, path)
        elif how == "extra":
            container = [p for p in paths if isinstance(_get(value, p), dict)]
            if container:
                where = draw(st.sampled_from(container))
                extra = _get(value, where) | {draw(st.text(max_size=12)): draw(GARBAGE)}
                value = _set(value, where, extra)
        elif how == "type":
            value = _set(value, path, draw(JSON_SCALARS))
        elif how == "string":
            value = _set(value, path, draw(ADVERSARIAL_STRINGS))
        elif how == "garbage":
            value = _set(value, path, draw(GARBAGE))
        elif how == "tool":  # an unregistered tool wherever a registered one was named
            value = json.loads(re.sub(r'"(ls|cat|touch)"', '"no_such_tool"', json.dumps(value)))
        elif how == "reference":
            value = _set(value, path, draw(st.sampled_from(["$step_99.result", "$step_3.files.0", "$step_0"])))
    return value


def _get(value: Any, path: tuple) -> Any:
    for key in path:
        value = value[key]
    return value


@st.composite
def rendered(draw, value_strategy: st.SearchStrategy) -> str:
    """A JSON value as a model might write it: whole, truncated, wrapped, repeated, or noise."""
    value = draw(value_strategy)
    text = json.dumps(value, ensure_ascii=draw(st.booleans()))
    how = draw(st.sampled_from(["plain", "truncate", "prose", "fence", "twice", "noise", "unbalanced", "deep"]))
    if how == "truncate":
        return text[: draw(st.integers(0, max(len(text) - 1, 0)))]
    if how == "prose":
        return f"{draw(st.text(max_size=30))} {text} {draw(st.text(max_size=30))}"
    if how == "fence":
        return f"```json\n{text}\n```"
    if how == "twice":
        return text + "\n" + json.dumps(draw(GARBAGE))
    if how == "noise":
        return draw(st.one_of(st.text(max_size=200), st.binary(max_size=100).map(lambda b: b.decode("latin-1"))))
    if how == "unbalanced":
        return "{" * draw(st.integers(1, 3000)) + text
    if how == "deep":  # balanced nesting past the JSON decoder's recursion limit
        depth = draw(st.integers(500, 20_000))
        key = draw(st.sampled_from(["verdict", "plan", "dispatch", "arguments", "x"]))
        return text[:-1] + f', "{key}": ' + "[" * depth + "1" + "]" * depth + "}" if text.endswith("}") \
            else '{"a": ' * depth + text + "}" * depth
    return text


def outputs_for(role: RoleUnderTest) -> st.SearchStrategy:
    """What a broken (or lucky) model answers for ``role``."""
    valid = from_schema(role.schema)
    return st.one_of(rendered(valid), rendered(mutated(valid)), rendered(GARBAGE))


# -- running cases ------------------------------------------------------------------------------

class Hang(Exception):
    pass



@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise Hang in this (main) thread after ``seconds``."""
    def alarm(signum, frame):
        raise Hang()

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def error_kind(error: str) -> str:
    """The error's first clause with numbers and quoted bits blanked: a countable kind."""
    kind = re.split(r"[:(\n]", error, maxsplit=1)[0]
    kind = re.sub(r"'[^']*'|\"[^\"]*\"|\d+", "_", kind)
    return kind.strip()[:60] or "(empty)"


@dataclass
class Counts:
    cases: int = 0
    valid: int = 0
    typed_failure: int = 0
    exceptions: int = 0
    hangs: int = 0
    kinds: Counter = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)
    slowest_s: float = 0.0
    """The longest single case (parse, or loop turn) took this long."""


def check_parse(role: RoleUnderTest, text: str, limit_s: float = 2.0) -> tuple[str, str, float]:
    """("valid" | "typed_failure" | "exception" | "hang", detail, seconds) for one case."""
    # No garbage collection inside the timed parse: a collection of hypothesis's own deep
    # structures landing there once took 2 s on the shared machine, none of it the parser's
    # (the parser's garbage is collected after, outside the clock).
    gc.disable()
    start = time.perf_counter()
    try:
        outcome, detail = _parse_once(role, text, limit_s)
    finally:
        seconds = time.perf_counter() - start
        gc.enable()
    if seconds > limit_s and outcome != "hang":  # the alarm can land where Python ignores it (a gc callback)
        outcome, detail = "hang", f"{seconds:.1f}s"
    return outcome, detail, seconds


def _parse_once(role: RoleUnderTest, text: str, limit_s: float) -> tuple[str, str]:
    try:
        with time_limit(limit_s):
            result = role.parse(text)
    except Hang:
        return "hang", ""
    except Exception as err:  # exactly what must never happen
        return "exception", f"{type(err).__name__}: {err}"
    if not isinstance(result, ParseResult) or (result.value is None) == (result.error is None):
        return "exception", f"not a ParseResult with exactly one of value/error: {result!r}"[:200]
    if result.error is not None:
        return "typed_failure", error_kind(result.error)
    return "valid", ""


def fuzz_role(role: RoleUnderTest, cases: int, seed: int = 0) -> Counts:
    counts = Counts()

    @settings(max_examples=cases, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck), derandomize=False)
    @given(outputs_for(role))
    def run(text: str) -> None:
        outcome, detail, seconds = check_parse(role, text)
        counts.slowest_s = max(counts.slowest_s, seconds)
        counts.cases += 1
        if outcome == "valid":
            counts.valid += 1
        elif outcome == "typed_failure":
            counts.typed_failure += 1
            counts.kinds[detail] += 1
        elif outcome == "hang":
            counts.hangs += 1
            counts.examples.append(f"hang: {text[:200]!r}")
        else:
            counts.exceptions += 1
            counts.examples.append(f"{detail} on {text[:200]!r}")

    run()
    return counts


# -- through the loop ----------------------------------------------------------------------------

class _FlatEmbedder:
    """Every text the same vector: retrieval returns the tools in order; no model."""

    dim = 8

    def embed(self, texts):
        import numpy as np

        return np.ones((len(texts), self.dim), dtype=np.float32) / self.dim ** 0.5

    def embed_query(self, text):
        return self.embed([text])


def fuzz_world(cache_dir: Path):
    """Real tools over a small state, in a ToolFace the loop can use."""
    from heart.toolface import Tool, ToolFace, ToolSpec

    files = {"report.txt": "budget"}

    def ls():
        return {"files": sorted(files)}

    def cat(file_name: str):
        return {"content": files[file_name]}

    def touch(file_name: str, mode: int = 0):
        files[file_name] = ""
        return {"created": file_name}

    tools = [Tool(ToolSpec(fn.__name__, f"The {fn.__name__} tool.", TOOL_PARAMETERS[fn.__name__]), fn)
             for fn in (ls, cat, touch)]
    return ToolFace(tools, cache_dir=cache_dir, embedder=_FlatEmbedder())


def loop_outputs() -> st.SearchStrategy:
    """Per role, 1-3 answers the scripted backend gives in turn."""
    roles = {r.name: r for r in roles_under_test()}
    return st.fixed_dictionaries({name: st.lists(outputs_for(role), min_size=1, max_size=3)
                                  for name, role in roles.items()})


def run_loop_case(answers: dict[str, list[str]], cache_dir: Path, trace_path: Path, limit_s: float = 10.0):
    """One turn of the loop over fuzzed answers; returns ("ok"|"exception"|"hang", detail)."""
    from heart.calls import EpisodeContext, RoleClient
    from heart.loop import HeartLoop, LoopConfig
    from heart.runtime import ScriptedBackend
    from heart.traces import TraceWriter, read_trace

    queues = {role: list(items) for role, items in answers.items()}

    def respond(role, messages):
        queue = queues[role]
        return queue.pop(0) if len(queue) > 1 else queue[0]

    trace_path.unlink(missing_ok=True)
    try:
        with time_limit(limit_s), TraceWriter(trace_path, fsync=False) as trace:
            client = RoleClient(ScriptedBackend(respond, name="fuzz"), EpisodeContext("ep", "t", "fuzz"), trace)
            loop = HeartLoop(client, fuzz_world(cache_dir), lambda q: "nothing more",
                             LoopConfig(replan_budget=1, max_clarifications=1))
            result = loop.solve("Read report.txt")
        rows = list(read_trace(trace_path))
    except Hang:
        return "hang", ""
    except Exception as err:
        return "exception", f"{type(err).__name__}: {err}"
    if result.verdict not in ("PASS", "FAIL") or not rows:
        return "exception", f"verdict {result.verdict!r}, {len(rows)} trace rows"
    return "ok", ""


def fuzz_loop(cases: int, workdir: Path) -> Counts:
    counts = Counts()

    @settings(max_examples=cases, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(loop_outputs())
    def run(answers) -> None:
        start = time.perf_counter()
        outcome, detail = run_loop_case(answers, workdir / "cache", workdir / "trace.jsonl")
        counts.slowest_s = max(counts.slowest_s, time.perf_counter() - start)
        counts.cases += 1
        if outcome == "ok":
            counts.valid += 1
        elif outcome == "hang":
            counts.hangs += 1
        else:
            counts.exceptions += 1
            counts.examples.append(detail[:300])

    run()
    return counts


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", type=int, default=10_000, help="cases per role parser")
    parser.add_argument("--loop-cases", type=int, default=2_000, help="loop turns over fuzzed answers")
    add_printed_out_argument(parser, OUT)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    with stamped_stdout(args.out, stamp(argv, __file__)):
        return measure(args)


def measure(args: argparse.Namespace) -> int:
    import tempfile

    failed = False
    print(f"{'role':<10} {'cases':>7} {'valid':>7} {'typed failure':>14} {'exceptions':>10} {'hangs':>6} "
          f"{'total s':>8} {'slowest s':>9}")
    for role in roles_under_test():
        start = time.perf_counter()
        c = fuzz_role(role, args.cases)
        print(f"{role.name:<10} {c.cases:>7} {c.valid:>7} {c.typed_failure:>14} {c.exceptions:>10} {c.hangs:>6} "
              f"{time.perf_counter() - start:>8.1f} {c.slowest_s:>9.3f}")
        for kind, n in c.kinds.most_common(6):
            print(f"{'':<12}{n:>7}  {kind}")
        for example in c.examples[:5]:
            print(f"{'':<12}!! {example}")
        failed |= bool(c.exceptions or c.hangs)
    if args.loop_cases:
        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            c = fuzz_loop(args.loop_cases, Path(tmp))
        print(f"{'loop':<10} {c.cases:>7} {c.valid:>7} {'-':>14} {c.exceptions:>10} {c.hangs:>6} "
              f"{time.perf_counter() - start:>8.1f} {c.slowest_s:>9.3f}")
        for example in c.examples[:5]:
            print(f"{'':<12}!! {example}")
        failed |= bool(c.exceptions or c.hangs)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
