"""The Code primitive's resource: one Python expression over earlier results, sandboxed.

A code step (HEELO's Code family, :mod:`heart.primitives`) computes a value the turn's answer
needs from the results of the steps it depends on — a total, a product, a time span, a
time rewritten as "HH:MM". Its inputs are variables the Router binds (``$step_j.field``
references, resolved to values); the Primitive writes the expression; this module
evaluates it and never lets it do anything else:

1. **Static check, in this process** (:func:`check`): at most ``expression_chars``
   characters and ``max_nodes`` syntax nodes; one expression (``ast.parse`` in "eval"
   mode: no statements, no imports); only the node types of a pure expression (no lambda,
   no ``:=``, no ``await``/``yield``); no name or attribute that starts with ``_`` (no
   dunder escapes: ``().__class__.__base__``…) nor one of simpleeval's forbidden methods
   (``format``, ``mro``…); no f-string width of 1,000 or more. Most hostile input stops
   here, without a process.
2. **Evaluation, in a separate process** (:mod:`heart.sandbox_worker`, run isolated with
   ``python -I``, importing only the standard library and simpleeval): hard resource
   limits set before evaluating (``RLIMIT_AS`` memory, ``RLIMIT_CPU`` seconds, no new
   files, no core), a wall-clock timeout after which the process is killed, and
   simpleeval's ``EvalWithCompoundTypes`` over an allow-list of pure functions
   (``sum``, ``min``, ``round``, ``sorted``, ``range`` capped at 10,000 items, and a few
   for times and numbers in text: ``numbers``, ``minutes``, ``clock``, ``hhmm``,
   ``minutes_between``, ``days_between``) and of methods per type (reading ones:
   ``str.split``, ``dict.items``…); simpleeval's own bounds are tightened (powers over
   10,000, strings over 100,000 characters and comprehensions over 10,000 items refused);
   no ``%``-formatting of strings, and no function, type or generator turned into text.
3. **The value**: JSON only (no NaN or infinity, no sets or objects) and at most
   ``max_output_chars`` of it.

Every way an expression can go wrong is an :class:`Outcome` with a ``kind`` — ``syntax``,
``refused``, ``input``, ``error``, ``timeout``, ``memory``, ``not_json``, ``too_large``,
``crashed`` — which the Code primitive turns into a typed FAILURE envelope; :func:`evaluate`
never raises for what the expression does and never waits past ``timeout_s``.

**Why simpleeval, and a process.** Measured with ``bench/sandbox.py`` (1,200 generated hostile
expressions, 2 cores; bench/results/sandbox.json): 0 crashes, 0 hangs, 0 escapes; the static
check refuses 540 of them without a process, the rest end as simpleeval's refusals, errors,
``memory``, ``timeout``, ``not_json`` or ``too_large``, or as an ordinary value (``'a' * 10``);
an evaluation takes 0.11 s (median; 0.20 s p95), almost all of it the interpreter's start.

- simpleeval 1.0.8 (MIT, maintained since 2013, with a history of security fixes credited
  to their reporters) evaluates exactly one expression by walking its AST with allow-lists:
  no statements, no ``_``-prefixed attributes, modules and dangerous builtins refused,
  attribute allow-lists per type, bounds on powers, string sizes and comprehension lengths.
  It is one pure-Python file with no dependencies.
- RestrictedPython 9.0 compiles a restricted *program* and runs it with ``exec``; safety
  rests on guards the host supplies (``_getattr_``, ``_getitem_``, ``_getiter_``, a safe
  ``str.format``…). On the same 1,200 expressions its ``compile_restricted_eval`` rejected 465
  (ours: 540 statically); among those it compiled and ours refuses: lambdas,
  ``'{0.__class__.__init__.__globals__}'.format(len)`` (left to a host guard) and f-string
  widths of 10**12; it raised ``RecursionError`` itself on 15 deeply nested ones. Built for
  untrusted scripts, not one expression, and with no bound on time or memory.
- A hand-written AST walker would re-implement what simpleeval already does and has been
  attacked on for a decade.

No in-process evaluator bounds time and memory: ``sum(range(10**12))`` or
``('a' * 99999).replace('a', 'b' * 99999)`` run in C, past any tracing hook, and a thread
cannot be killed. Hence the process, with its own rlimits and a timeout. Its cost is paid
only by code steps (seven of AgentDojo's fifty train tasks have one).
"""

from __future__ import annotations

import ast
import json
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

WORKER = Path(__file__).with_name("sandbox_worker.py")
"""The evaluator process's script (it never imports ``heart``)."""


@dataclass(frozen=True)
class SandboxLimits:
    """What one evaluation may use."""

    expression_chars: int = 1000
    max_nodes: int = 400
    """Syntax nodes of the expression."""
    timeout_s: float = 5.0
    """Wall clock, the interpreter's start included: the process is killed past it."""
    cpu_s: float = 2.0
    """CPU seconds (``RLIMIT_CPU``): the process is killed past it."""
    memory_mb: int = 256
    """Address space of the process (``RLIMIT_AS``); the interpreter itself takes ~15 MB."""
    max_output_chars: int = 10_000
    """Characters of the value's JSON."""
    input_chars: int = 500_000
    """Characters of the variables' JSON."""
    max_power: int = 10_000
    """simpleeval: the largest base or exponent of ``**``."""
    max_string: int = 100_000
    """simpleeval: the longest string or sequence an operation may build."""
    max_comprehension: int = 10_000
    """simpleeval: the most items all comprehensions of the expression may produce."""


DEFAULT_LIMITS = SandboxLimits()

KINDS = ("syntax", "refused", "input", "error", "timeout", "memory", "not_json", "too_large", "crashed")
"""Why an evaluation failed (see the module docstring)."""

_ALLOWED_NODES = (
    ast.Expression, ast.BoolOp, ast.BinOp, ast.UnaryOp, ast.IfExp, ast.Dict, ast.Set, ast.ListComp,
    ast.DictComp, ast.GeneratorExp, ast.Compare, ast.Call, ast.keyword, ast.FormattedValue, ast.JoinedStr,
    ast.Constant, ast.Attribute, ast.Subscript, ast.Slice, ast.Name, ast.List, ast.Tuple, ast.Starred,
    ast.comprehension, ast.Load, ast.Store, ast.boolop, ast.operator, ast.unaryop, ast.cmpop,
)
_FORBIDDEN_ATTRIBUTES = {"format", "format_map", "mro", "tb_frame", "gi_frame", "ag_frame", "cr_frame", "exec"}
_BIG_WIDTH = 1000


@dataclass(frozen=True)
class Outcome:
    """One evaluation: its value, or why there is none."""

    ok: bool
    value: Any = None
    kind: str | None = None
    """One of :data:`KINDS` when not ``ok``."""
    error: str = ""
    latency_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Refused(ValueError):
    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def check(expression: Any, limits: SandboxLimits = DEFAULT_LIMITS) -> ast.Expression:
    """The expression's syntax tree, if the static rules allow it; raises :class:`Refused`."""
    if not isinstance(expression, str) or not expression.strip():
        raise Refused("syntax", "the expression must be a non-empty string")
    if len(expression) > limits.expression_chars:
        raise Refused("refused", f"the expression is {len(expression):,} characters; at most {limits.expression_chars:,}")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as err:
        raise Refused("syntax", f"not one Python expression: {err.msg}") from None
    except (ValueError, RecursionError, MemoryError) as err:  # null bytes, absurd nesting
        raise Refused("syntax", f"not one Python expression: {type(err).__name__}") from None
    nodes = 0
    for node in ast.walk(tree):
        nodes += 1
        if nodes > limits.max_nodes:
            raise Refused("refused", f"the expression has more than {limits.max_nodes} syntax nodes")
        if not isinstance(node, _ALLOWED_NODES):
            raise Refused("refused", f"{type(node).__name__} is not allowed in an expression")
        name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) \
            else node.arg if isinstance(node, ast.keyword) else None
        if name is not None and (name.startswith("_") or name.startswith("func_")):
            raise Refused("refused", f"name {name!r}: names starting with '_' are not allowed")
        if isinstance(node, ast.Attribute) and node.attr in _FORBIDDEN_ATTRIBUTES:
            raise Refused("refused", f"the method {node.attr!r} is not allowed")
        if isinstance(node, ast.FormattedValue) and node.format_spec is not None:
            spec = ast.unparse(node.format_spec)
            widths = [int(w) for w in "".join(c if c.isdigit() else " " for c in spec).split()]
            if any(w >= _BIG_WIDTH for w in widths) or "{" in spec[1:-1]:
                raise Refused("refused", "f-string format widths of 1,000 or more (or computed ones) are not allowed")
    return tree


def check_variables(variables: Any, limits: SandboxLimits = DEFAULT_LIMITS) -> str:
    """The variables as the JSON the evaluator reads; raises :class:`Refused` (kind ``input``)."""
    if not isinstance(variables, dict):
        raise Refused("input", "the inputs must be an object of named values")
    bad = [k for k in variables if not (isinstance(k, str) and k.isidentifier() and not k.startswith("_"))]
    if bad:
        raise Refused("input", f"input names must be identifiers not starting with '_': {bad[:3]}")
    try:
        text = json.dumps(variables, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as err:
        raise Refused("input", f"the inputs are not JSON: {err}") from None
    if len(text) > limits.input_chars:
        raise Refused("input", f"the inputs are {len(text):,} characters of JSON; at most {limits.input_chars:,}")
    return text


def evaluate(expression: Any, variables: dict[str, Any] | None = None,
             limits: SandboxLimits = DEFAULT_LIMITS) -> Outcome:
    """Evaluate ``expression`` over ``variables`` in the sandbox; never raises for what the
    expression does, never waits past ``limits.timeout_s``."""
    start = time.perf_counter()

    def done(**fields: Any) -> Outcome:
        return Outcome(latency_s=round(time.perf_counter() - start, 4), **fields)

    try:
        check(expression, limits)
        inputs = check_variables(variables or {}, limits)
    except Refused as err:
        return done(ok=False, kind=err.kind, error=str(err))
    request = '{"expression": ' + json.dumps(expression) + ', "variables": ' + inputs \
              + ', "limits": ' + json.dumps(asdict(limits)) + "}"
    try:
        process = subprocess.Popen([sys.executable, "-I", "-X", "utf8", str(WORKER)], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   env={"PATH": os.defpath, "LC_ALL": "C.UTF-8"})
    except OSError as err:
        return done(ok=False, kind="crashed", error=f"could not start the evaluator: {err}")
    try:
        out, err_text = process.communicate(request.encode(), timeout=limits.timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        return done(ok=False, kind="timeout", error=f"timed out after {limits.timeout_s:g}s (killed)")
    if process.returncode in (-signal.SIGXCPU, -signal.SIGKILL):
        return done(ok=False, kind="timeout",
                    error=f"killed after its CPU limit of {math.ceil(limits.cpu_s)}s")
    lines = out.decode("utf-8", "replace").strip().splitlines()
    try:
        reply = json.loads(lines[-1]) if lines else None
    except ValueError:
        reply = None
    if not isinstance(reply, dict) or "ok" not in reply:
        stderr = err_text.decode("utf-8", "replace")
        kind = "memory" if "MemoryError" in stderr else "crashed"
        return done(ok=False, kind=kind, error=f"the evaluator exited with {process.returncode} "
                                               f"({stderr.strip().splitlines()[-1][:200] if stderr.strip() else 'no message'})")
    if reply["ok"]:
        return done(ok=True, value=reply["value"])
    kind = reply.get("kind") if reply.get("kind") in KINDS else "error"
    return done(ok=False, kind=kind, error=str(reply.get("error", ""))[:400])
