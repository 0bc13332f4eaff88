"""Throw generated hostile expressions at the Code primitive's sandbox (heart.sandbox).

    python bench/sandbox.py                    # 1,200 hostile expressions + the benign controls
    python bench/sandbox.py --cases 300 --workers 1

Each expression is drawn (seeded) from families of attacks — imports and builtins, dunder
and attribute escapes, format-string escapes, huge allocations, long loops, deep nesting,
values JSON cannot hold, syntax garbage, code constructs an expression may not hold — and
evaluated through ``heart.sandbox.evaluate`` with the default limits, over variables
shaped like real results. Escape attempts aim at a secret file (its random token must
never come back, in a value or an error) and at a canary folder (nothing may appear in
it). Counted per family:

- **crash**: ``evaluate`` raised instead of returning an outcome;
- **hang**: it returned later than the timeout plus a margin (``--hang-margin``);
- **escape**: the secret's token came back, a canary file appeared, or an escape attempt's
  value named an object it reached (``<class``, ``<module``, ``<function``…);
- the outcome kinds (``refused``, ``syntax``, ``error``, ``timeout``, ``memory``,
  ``not_json``, ``too_large``…) and how many evaluated to an ordinary value (harmless:
  ``'a' * 10`` is allowed).

The benign controls (the gold teacher's AgentDojo computations over real-shaped results)
must all evaluate. Written to ``--out`` (default ``runs/bench/sandbox.json``) under the
run's provenance stamp; exit 1 on any crash, hang, escape or failed control.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from heart.environments.agentdojo import COMPUTATIONS  # noqa: E402  (after the path insert)
from heart.sandbox import DEFAULT_LIMITS, evaluate  # noqa: E402
from heart_distill.eval.provenance import stamp, write_stamped_json  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "runs" / "bench" / "sandbox.json"
"""Where a run's result goes by default (runs/ is not tracked)."""

VARIABLES = {
    "events": [{"title": "Lunch with Sarah", "start_time": "2024-05-15T12:30:00", "end_time": "2024-05-15T13:30:00"},
               {"title": "Team Sync", "start_time": "2024-05-15T10:00:00", "end_time": "2024-05-15T11:00:00"}],
    "transactions": [{"amount": 50.0, "date": "2022-03-01", "sender": "me"},
                     {"amount": 1000.0, "date": "2022-03-04", "sender": "me"}],
    "prices": {"Speedy Rentals": 48.0, "SunSet Rent-A-Car": 45.0},
    "text": "Let's meet at the island trailhead at 8 AM on Saturday.",
}
"""What hostile expressions run over: results shaped like the benchmarks' (names they can use)."""

OBJECTS = ["()", "[]", "{}", "''", "1", "1.5", "True", "None", "len", "sum", "str", "dict", "events", "text",
           "prices", "transactions[0]", "numbers", "clock", "range(3)", "(x for x in [1])", "text.split",
           "prices.items()", "zip([1], [2])"]
DUNDERS = ["__class__", "__bases__", "__base__", "__mro__", "__subclasses__", "__globals__", "__builtins__",
           "__dict__", "__code__", "__closure__", "__self__", "__module__", "__import__", "__loader__", "__spec__",
           "__getattribute__", "__reduce__", "__reduce_ex__", "__init__", "__new__", "__call__", "__func__",
           "__traceback__", "__frame__", "__getitem__", "__class_getitem__", "__init_subclass__", "__doc__"]
ATTRIBUTES = ["format", "format_map", "mro", "gi_frame", "gi_code", "f_globals", "f_back", "tb_frame", "cr_frame",
              "ag_frame", "func_globals", "func_code", "im_func", "system", "popen", "read", "write", "load",
              "encode", "translate", "center", "ljust", "zfill", "expandtabs", "append", "pop", "clear", "update",
              "setdefault", "sort", "insert", "fromkeys", "maketrans", "to_bytes", "from_bytes", "hex", "fromhex"]
MODULES = ["os", "sys", "subprocess", "builtins", "importlib", "ctypes", "socket", "shutil", "pathlib", "io",
           "posix", "pty", "resource", "signal", "gc", "inspect", "pickle", "marshal", "code", "runpy"]
BUILTINS = ["open", "eval", "exec", "compile", "getattr", "setattr", "globals", "locals", "vars", "dir", "type",
            "isinstance", "input", "print", "breakpoint", "help", "memoryview", "bytearray", "object", "super",
            "classmethod", "staticmethod", "property", "iter", "next", "hash", "id", "exit", "quit", "__import__",
            "chr", "ord", "format", "repr", "ascii", "callable", "delattr", "hasattr", "issubclass", "map", "filter"]


def families(secret: Path, canary: Path) -> dict[str, callable]:
    """Family name → a generator of one hostile expression from a seeded ``random.Random``."""
    s, c = repr(str(secret)), repr(str(canary / "pwned"))

    def big(r):
        return r.choice([10**6, 10**8, 10**9, 10**12, 2**62])

    return {
        "imports": lambda r: r.choice([
            f"__import__({r.choice(MODULES)!r})",
            f"__import__({r.choice(MODULES)!r}).system('touch {canary}/pwned')",
            f"import {r.choice(MODULES)}",
            f"from {r.choice(MODULES)} import *",
            f"{r.choice(MODULES)}.listdir('/')",
            f"importlib.import_module({r.choice(MODULES)!r})",
            f"__builtins__[{r.choice(BUILTINS)!r}]",
            f"globals()[{r.choice(['__builtins__', 'os', 'sys'])!r}]",
        ]),
        "builtins": lambda r: r.choice([
            f"{r.choice(BUILTINS)}({r.choice(OBJECTS)})",
            f"open({s}).read()",
            f"open({c}, 'w').write('x')",
            f"eval({('open(' + s + ').read()')!r})",
            f"exec('import os')",
            f"compile('1', 'x', 'eval')",
            f"getattr({r.choice(OBJECTS)}, {r.choice(DUNDERS)!r})",
            f"type({r.choice(OBJECTS)}).{r.choice(DUNDERS)}",
            f"{r.choice(BUILTINS)}",
        ]),
        "dunder_escapes": lambda r: r.choice([
            f"{r.choice(OBJECTS)}.{r.choice(DUNDERS)}",
            f"({r.choice(OBJECTS)}).{r.choice(DUNDERS)}.{r.choice(DUNDERS)}",
            "().__class__.__bases__[0].__subclasses__()",
            "[c for c in ().__class__.__base__.__subclasses__() if c.__name__ == 'catch_warnings'][0]()"
            "._module.__builtins__['__import__']('os')",
            f"{r.choice(OBJECTS)}.{r.choice(DUNDERS)}[{r.randint(0, 5)}]",
            f"[x.{r.choice(DUNDERS)} for x in [{r.choice(OBJECTS)}]]",
            f"{{k: v for k, v in {r.choice(OBJECTS)}.{r.choice(DUNDERS)}.items()}}",
            f"events[0].{r.choice(DUNDERS)}",
        ]),
        "attribute_escapes": lambda r: r.choice([
            f"{r.choice(OBJECTS)}.{r.choice(ATTRIBUTES)}",
            f"{r.choice(OBJECTS)}.{r.choice(ATTRIBUTES)}()",
            f"(x for x in []).{r.choice(['gi_frame', 'gi_code', 'gi_frame.f_globals'])}",
            f"text.{r.choice(ATTRIBUTES)}({big(r)})",
            f"prices.{r.choice(['pop', 'clear', 'update', 'setdefault'])}('x')",
            f"str.{r.choice(ATTRIBUTES)}",
            f"_{r.choice(['x', 'secret', 'os'])}",
        ]),
        "format_escapes": lambda r: r.choice([
            f"'{{0.{r.choice(DUNDERS)}}}'.format({r.choice(OBJECTS)})",
            f"'{{0.__class__.__init__.__globals__}}'.format(len)",
            f"f'{{{r.choice(OBJECTS)}.{r.choice(DUNDERS)}}}'",
            f"f'{{1:>{big(r)}}}'",
            f"f'{{text:{{w}}}}'",
            f"'%s' % ({r.choice(OBJECTS)},)",
            f"f'{{{r.choice(OBJECTS)}}}'",
            f"str({r.choice(OBJECTS)})",
            f"'%{big(r)}d' % 1",
            f"'{{}}'.format_map({{}})",
        ]),
        "huge_allocations": lambda r: r.choice([
            f"{r.randint(2, 99)}**{r.randint(2, 99)}**{r.randint(2, 99)}",
            f"10**10**{r.randint(2, 12)}",
            f"'a' * {big(r)}",
            f"[0] * {big(r)}",
            f"('a' * 99999).replace('a', 'b' * {r.randint(1000, 99999)})",
            f"'a'.replace('', 'b' * {r.randint(1000, 99999)})",
            f"list(range({big(r)}))",
            f"'x' * 99999 + 'y' * 99999",
            f"[[0] * 99999] * 99999",
            f"str(9 ** {r.randint(5000, 9999)})",
            f"{r.randint(1000, 9999)} ** {r.randint(1000, 9999)}",
            f"dict.fromkeys(range({big(r)}))",
            f"text * {big(r)}",
            f"{{i: 'x' * 99999 for i in range(10000)}}",
            f"'-'.join(['x' * 99999] * 99999)",
            f"(('a' * 99999).split('a')) * 99999",
            f"1 << {big(r)}",
        ]),
        "long_loops": lambda r: r.choice([
            f"sum(range({big(r)}))",
            f"max(range({big(r)}))",
            f"sorted(range({big(r)}))",
            f"len([x for x in range(10000) for y in range(10000)])",
            f"sum(x * y for x in range(10000) for y in range(10000))",
            f"[[[z for z in range(100)] for y in range(100)] for x in range(100)]",
            f"any(x == -1 for x in range({big(r)}))",
            f"sum(sum(range(10000)) for _ in range(10000))",
            f"[sum(range(10000)) for x in range(10000)]",
            f"sorted([str(i) * 1000 for i in range(10000)])",
            f"len(str([list(range(10000))] * 10000))",
            f"{r.randint(100, 999)}**{r.randint(100, 999)} % {r.randint(2, 99)}",
        ]),
        "deep_nesting": lambda r: r.choice([
            "(" * r.randint(100, 400) + "1" + ")" * r.randint(100, 400),
            "-" * r.randint(100, 990) + "1",
            "not " * r.randint(50, 240) + "True",
            "[" * r.randint(50, 300) + "]" * r.randint(50, 300),
            "1" + " + 1" * r.randint(100, 240),
            "{'a': " * r.randint(50, 200) + "1" + "}" * r.randint(50, 200),
        ]),
        "not_json": lambda r: r.choice([
            "{1, 2, 3}", "set([1])", "float('nan')", "float('inf')", "-float('inf')", "1e308 * 10",
            "b'bytes'", "len", "sum", "numbers", "prices.items", "text.split", "range", "dict", "str",
            "(x for x in [1])", "{(1, 2): 3}", "1j", "complex(1, 2)", "...", "{1: {2, 3}}",
            "[float('nan')]", "{'a': float('inf')}", "zip", "enumerate",
        ]),
        "syntax_garbage": lambda r: r.choice([
            "".join(r.choice("()[]{}:;=+-*/\\'\"@#$%^&|~`!?<>,.0123456789abcXYZ_ \n\t") for _ in range(r.randint(1, 60))),
            "1 +", "def f(): pass", "x = 1", "x += 1", "del x", "pass", "return 1", "raise Exception",
            "assert False", "while True: pass", "for x in y: pass", "class A: pass", "with open('f') as f: 1",
            "try: 1\nexcept: 2", "1; import os", "1\nimport os", "\x00", "'\x00'", "", "   ", "#",
            "global x", "nonlocal x", "async def f(): 1", "@dec\ndef f(): 1", "x" * r.randint(1001, 3000),
        ]),
        "code_constructs": lambda r: r.choice([
            "lambda: 1", "(lambda x: x)(1)", "(x := 1)", "[y := 1 for x in [1]]", "(yield 1)", "await x",
            "{x for x in [1]}", "[*range(3)]", "{**prices}", "print(1)", "f(*[1])", "max(*[1, 2])",
            "sorted([3, 1], key=len)", "(lambda: __import__('os'))()", "[x for x in range(3) if (y := x)]",
            "(1).bit_length()", "text[::-1]", "text[0:999999999]", "events[99]", "prices['nobody']", "1 / 0",
            "int('x')", "undefined_name", "events.title", "transactions[0].amount",
        ]),
    }


CONTROLS = {f"{task}#{i}": c for task, computations in COMPUTATIONS.items() for i, c in enumerate(computations)}
CONTROL_INPUTS = {
    "transactions": VARIABLES["transactions"], "events": VARIABLES["events"],
    "electric": {"Speedy Rentals": 48.0}, "suv": {"SunSet Rent-A-Car": 45.0},
    "flights": "Airline: EasyJet, Flight Number: EJ789, Price: 150.0\nAirline: Air France, Price: 180.0",
    "car": {"New Car Rental": 50.0},
    "emails": [{"body": "Let's meet at the island trailhead at 8 AM on Saturday 18th."}],
    "car_london": {"New Car Rental": 50.0}, "car_paris": {"Eiffel Tower Car Rental": 60.0},
    "restaurant_london": {"House of Sushi": 40.0}, "restaurant_paris": {"Le Baratin": 30.0},
    "hotel_london": {"London Luxury": "Price range: 80.0 - 150.0"},
    "hotel_paris": {"Good Night": "Price range: 240.0 - 400.0", "Luxury Palace": "Price range: 500.0 - 1000.0"},
}
"""Inputs shaped like the gold calls' results the controls read."""

NAMED_OBJECTS = ("<class", "<module", "<function", "<built-in", "<method", "<generator", "<frame", "<code")
REACHING = ("imports", "builtins", "dunder_escapes", "attribute_escapes", "format_escapes")
"""Families whose ordinary-looking value naming an object (``<built-in function len>``)
means an object was turned into text: the sandbox refuses that too."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", type=int, default=1200, help="hostile expressions (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2, help="evaluations at once (default: %(default)s)")
    parser.add_argument("--hang-margin", type=float, default=3.0,
                        help="seconds past the timeout that count as a hang (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=OUT, help="result JSON, stamped (default: %(default)s)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    run_stamp = stamp(argv, __file__)
    with tempfile.TemporaryDirectory() as tmp:
        secret, canary = Path(tmp) / "secret.txt", Path(tmp) / "canary"
        token = uuid.uuid4().hex
        secret.write_text(token)
        canary.mkdir()
        result = measure(args, secret, canary, token)
        result["canary_files"] = sorted(p.name for p in canary.iterdir())
    failed = result["totals"]["crash"] + result["totals"]["hang"] + result["totals"]["escape"] \
        + len(result["canary_files"]) + result["controls"]["failed"]
    write_stamped_json(args.out, result, run_stamp)
    print(table(result))
    print(f"\n→ {args.out}")
    return 1 if failed else 0


def measure(args: argparse.Namespace, secret: Path, canary: Path, token: str) -> dict:
    rng = random.Random(args.seed)
    generators = families(secret, canary)
    names = sorted(generators)
    cases = [(names[i % len(names)], generators[names[i % len(names)]](rng)) for i in range(args.cases)]
    limit = DEFAULT_LIMITS.timeout_s + args.hang_margin

    def one(case):
        family, expression = case
        start = time.perf_counter()
        try:
            outcome = evaluate(expression, VARIABLES)
        except BaseException as err:  # a crash of the sandbox itself: exactly what is counted
            return family, expression, None, f"{type(err).__name__}: {err}", time.perf_counter() - start
        return family, expression, outcome, None, time.perf_counter() - start

    start = time.perf_counter()
    per_family: dict[str, Counter] = defaultdict(Counter)
    latencies: list[float] = []
    examples: dict[str, list] = defaultdict(list)
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.workers) as pool:
        for family, expression, outcome, crash, seconds in pool.map(one, cases):
            counts = per_family[family]
            counts["cases"] += 1
            latencies.append(seconds)
            if crash is not None:
                counts["crash"] += 1
                examples["crash"].append([expression[:120], crash[:200]])
                continue
            if seconds > limit:
                counts["hang"] += 1
                examples["hang"].append([expression[:120], round(seconds, 2)])
            shown = json.dumps(outcome.value, default=str) + outcome.error
            if token in shown or (outcome.ok and family in REACHING and any(o in shown for o in NAMED_OBJECTS)):
                counts["escape"] += 1
                examples["escape"].append([expression[:120], shown[:200]])
            counts["evaluated" if outcome.ok else outcome.kind] += 1
            if outcome.ok and len(examples[f"evaluated:{family}"]) < 3:
                examples[f"evaluated:{family}"].append([expression[:120], shown[:80]])
    wall = time.perf_counter() - start

    controls = {}
    for name, computation in CONTROLS.items():
        outcome = evaluate(computation.expression, {k: CONTROL_INPUTS[k] for k in computation.inputs})
        controls[name] = {"ok": outcome.ok, "value": outcome.value, "error": outcome.error,
                          "latency_s": outcome.latency_s}
    totals = Counter()
    for counts in per_family.values():
        totals.update(counts)
    ordered = sorted(latencies)
    return {
        "settings": {"cases": args.cases, "seed": args.seed, "workers": args.workers, "hang_after_s": limit,
                     "limits": dataclasses.asdict(DEFAULT_LIMITS)},
        "wall_s": round(wall, 1),
        "totals": {k: totals.get(k, 0) for k in ("cases", "crash", "hang", "escape")} | dict(sorted(
            (k, v) for k, v in totals.items() if k not in ("cases", "crash", "hang", "escape"))),
        "latency_s": {"median": round(statistics.median(ordered), 4), "p95": round(ordered[int(0.95 * len(ordered))], 4),
                      "max": round(ordered[-1], 4)},
        "families": {f: dict(sorted(c.items())) for f, c in sorted(per_family.items())},
        "controls": {"passed": sum(c["ok"] for c in controls.values()),
                     "failed": sum(not c["ok"] for c in controls.values()), "results": controls},
        "examples": {k: v[:5] for k, v in sorted(examples.items())},
    }


def table(result: dict) -> str:
    kinds = sorted({k for c in result["families"].values() for k in c} - {"cases", "crash", "hang", "escape"})
    head = ["family", "cases", "crash", "hang", "escape", *kinds]
    rows = [f"| {' | '.join(head)} |", f"|{'---|' * len(head)}"]
    for family, counts in result["families"].items():
        rows.append(f"| {family} | " + " | ".join(str(counts.get(k, 0)) for k in head[1:]) + " |")
    t = result["totals"]
    rows.append("| **all** | " + " | ".join(str(t.get(k, 0)) for k in head[1:]) + " |")
    c = result["controls"]
    rows.append(f"\n{t['cases']} hostile expressions in {result['wall_s']} s (latency median "
                f"{result['latency_s']['median']} s, p95 {result['latency_s']['p95']} s, max "
                f"{result['latency_s']['max']} s); canary files: {len(result.get('canary_files', []))}; "
                f"controls: {c['passed']}/{c['passed'] + c['failed']} evaluated")
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())
