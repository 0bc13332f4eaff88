"""Tool Primitives (the deterministic part): bind, execute, and wrap the outcome.

The Primitive role proposes arguments; this module binds them against the tool's JSON
schema — the tool-boundary middleware's silent corrections (:mod:`heart.middleware`; by
default type coercion, JSON unwrapping and enum case), required fields, defaults — and its
error / prerequisite blocks, validates the result
with jsonschema, executes the tool under a timeout, and returns the SUCCESS / FAILURE
envelope with a typed ``failure_type``:

- SCHEMA_RESOLUTION: the arguments do not fit the schema (unknown or missing parameter,
  a value that cannot be coerced, a reference that does not resolve);
- CONSTRAINT_VIOLATION: the arguments fit the schema's shape but break one of its
  constraints (enum, range, pattern…);
- RUNTIME_ERROR: the tool ran and failed, raised, or timed out;
- PROVENANCE_VIOLATION: not run, the tool's document changed after ToolFace registered it
  (:mod:`heart.provenance`).

A SUCCESS carries the result and a one-sentence summary; every envelope carries ``meta``
(latency, attempts), and :func:`execute_with_retry` keeps each failed attempt's envelope in
``meta["failed_attempts"]`` so a retry never hides a failure (HEART D.3).

Hostile tools are contained here: a tool that raises (anything, ``SystemExit`` included)
is a RUNTIME_ERROR; a result JSON cannot encode is recorded as its ``repr``; a result
over ``MAX_RESULT_CHARS`` of JSON is cut to that size (and says so); a call past its
timeout cannot be killed (tools mutate the session's in-memory state, which a process
could not share), so it is abandoned and the episode's :class:`ToolContainment` is marked:
later tool calls of the episode are refused and the episode scores as *errored*.

The Code primitive (HEELO's Code family, :mod:`heart.families`) is here too:
:func:`execute_code` evaluates the Primitive's expression over the step's bound inputs in
:mod:`heart.sandbox` and wraps the outcome in the same envelope — a refused expression is a
CONSTRAINT_VIOLATION, an unreadable one (or an input name that is not an identifier) a
SCHEMA_RESOLUTION, one that fails, times out or runs out of memory a RUNTIME_ERROR.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import contextvars
import inspect
import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator

import jsonschema

from heart import sandbox
# the argument correctors and the binding failure types (re-exported: heart.primitives is where
# callers take BindingError, SCHEMA_RESOLUTION and CONSTRAINT_VIOLATION from)
from heart.coercion import CONSTRAINT_VIOLATION, SCHEMA_RESOLUTION, BindingError  # noqa: F401
from heart.middleware import Middleware, TurnCalls, default_middleware
from heart.families import CODE_CATEGORY, CODE_DESCRIPTION, CODE_PARAMETERS, CODE_PRIMITIVE, family  # noqa: F401
from heart.provenance import PROVENANCE_VIOLATION, changed_since_registration
from heart.references import REFERENCE
from heart.toolface import Tool, ToolSpec

RUNTIME_ERROR = "RUNTIME_ERROR"

SUMMARY_CHARS = 240
"""Longest one-sentence summary of a result."""
RESULT_CHARS = 1500
"""Longest rendering of a result inside a role's input (the trace keeps it whole)."""
MAX_RESULT_CHARS = 64_000
"""A result longer than this (as JSON) is cut: it would flood the trace and every prompt."""


@dataclass
class Envelope:
    """What a Tool Primitive returns for one dispatch."""

    status: str
    """SUCCESS or FAILURE (SKIPPED: not run, its dependencies did not succeed)."""
    tool: str
    bound_arguments: dict[str, Any] = field(default_factory=dict)
    result: Any = None
    summary: str = ""
    failure_type: str | None = None
    details: str = ""
    meta: dict[str, Any] = field(default_factory=dict)
    """Execution metadata: ``latency_s``, ``attempts``, ``failed_attempts`` (earlier envelopes);
    ``reused`` when the step was served an earlier execution of the same call instead of
    running (:mod:`heart.ledger`)."""
    validation: dict[str, Any] = field(default_factory=dict)
    """A tool SUCCESS's carried validation after execution (:mod:`heart.validation`):
    ``shape`` (ok | mismatch | unknown), ``state_change`` (ok | unmatched | none | n/a) and
    ``details``; evidence the Verifier's input shows. Empty: not checked."""
    messages: list[dict[str, Any]] = field(default_factory=list)
    """HEELO's messages to the steps that read this result, ``{to, field, note}``, written by
    the Primitive's messages mode (:mod:`heart.roles.primitive_messages`) after it passed."""

    @property
    def ok(self) -> bool:
        return self.status == "SUCCESS"

    @property
    def reused(self) -> bool:
        """The step did not execute: it was served the envelope of an earlier execution."""
        return "reused" in self.meta

    def as_reused(self, attempt: int, step: int, passed: bool) -> "Envelope":
        """This envelope served again to a later step, marked with where it ran (``attempt``,
        ``step``) and whether the Verifier passed it there; nothing executed (0 attempts)."""
        return Envelope(self.status, self.tool, dict(self.bound_arguments), self.result, self.summary,
                        self.failure_type, self.details,
                        {"latency_s": 0.0, "attempts": 0,
                         "reused": {"attempt": attempt, "step": step, "passed": passed}},
                        dict(self.validation))  # messages are written anew for the plan at hand

    def to_dict(self) -> dict[str, Any]:
        row = asdict(self)
        if self.ok:
            row.pop("failure_type")
            row.pop("details")
        else:
            row.pop("result")
        for optional in ("validation", "messages"):  # absent, not empty: inputs stay as they were
            if not row[optional]:
                row.pop(optional)
        return row

    def for_input(self) -> dict[str, Any]:
        """The envelope as a role's input shows it: the result clipped to RESULT_CHARS, and of
        the metadata only the attempts made (and ``reused``, for a step that did not run). Latency stays in the trace: a wall-clock figure in
        a role's input would make the same step a different example on every run, and nothing
        a role decides depends on it."""
        row = self.to_dict()
        if "result" in row:
            row["result"] = clip(row["result"])
        row["meta"] = {k: v for k, v in self.meta.items() if k in ("attempts", "reused")}
        return row


def failure(tool: str, failure_type: str, details: str, arguments: dict[str, Any] | None = None) -> Envelope:
    return Envelope("FAILURE", tool, arguments or {}, failure_type=failure_type, details=details,
                    summary=f"{tool} failed with {failure_type}: {one_line(details, SUMMARY_CHARS)}")


def one_line(text: str, limit: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def clip(value: Any, limit: int = RESULT_CHARS) -> Any:
    """``value`` unchanged when its JSON is short; otherwise its JSON text cut at ``limit``."""
    text = json.dumps(value, ensure_ascii=False, default=str)
    return value if len(text) <= limit else text[: limit - 1] + "…"


SHRINK_STEPS = ((400, 20), (200, 10), (100, 6), (60, 4), (30, 3))
"""(characters per string, items per list) :func:`shrink` tries, in turn."""


def shrink(value: Any, limit: int = RESULT_CHARS) -> Any:
    """``value`` cut to at most ``limit`` characters of JSON with its structure kept: long
    strings cut, long lists cut to their first items (so ``result.<key>.<index>`` paths into
    it still name the same values); :func:`clip` when even that does not fit."""
    def cut(v: Any, chars: int, items: int) -> Any:
        if isinstance(v, str):
            return v if len(v) <= chars else v[: chars - 1] + "…"
        if isinstance(v, list):
            return [cut(x, chars, items) for x in v[:items]]
        if isinstance(v, dict):
            return {k: cut(x, chars, items) for k, x in v.items()}
        return v

    if len(json.dumps(value, ensure_ascii=False, default=str)) <= limit:
        return value
    for chars, items in SHRINK_STEPS:
        small = cut(value, chars, items)
        if len(json.dumps(small, ensure_ascii=False, default=str)) <= limit:
            return small
    return clip(value, limit)


def summarize_result(tool: str, result: Any) -> str:
    """One sentence saying what a tool returned, with its values (deterministic)."""
    if result is None or result == {} or result == [] or result == "":
        return f"{tool} ran and returned nothing."
    if isinstance(result, dict):
        body = "; ".join(f"{k}: {json.dumps(v, ensure_ascii=False, default=str) if not isinstance(v, str) else v}"
                         for k, v in result.items())
    elif isinstance(result, list):
        body = f"{len(result)} item(s): " + json.dumps(result, ensure_ascii=False, default=str)
    else:
        body = str(result)
    return one_line(f"{tool} returned {body}".rstrip(".") + ".", SUMMARY_CHARS)


def _undefaulted_parameters(fn: Any) -> set[str]:
    """Parameters the executable takes but does not default itself.

    Only these receive the schema's default: a function's own default wins (BFCL's docs
    write "None" as a string default that its Python code means as None).
    """
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return set()
    return {n for n, p in signature.parameters.items() if p.default is inspect.Parameter.empty}


def bind_arguments(arguments: dict[str, Any], schema: dict[str, Any], fn: Any = None, *,
                   middleware: Middleware | None = None, tool: str = "*",
                   records: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Bind proposed ``arguments`` to ``schema``; raises :class:`BindingError`.

    Each given value first passes the ``middleware``'s silent corrections for ``tool``
    (:mod:`heart.middleware`; None: the default set — type coercion, JSON unwrapping, enum
    case — which is what this function always did); each correction made is appended to
    ``records``. :data:`heart.middleware.NO_MIDDLEWARE` binds the values as given."""
    middleware = default_middleware() if middleware is None else middleware
    properties: dict[str, Any] = schema.get("properties", {})
    required = list(schema.get("required", []))
    unknown = [k for k in arguments if k not in properties]
    if unknown and schema.get("additionalProperties") is not True:
        raise BindingError(
            SCHEMA_RESOLUTION,
            f"unknown parameter(s) {', '.join(map(repr, unknown))}; the tool takes {sorted(properties)}",
        )
    bound: dict[str, Any] = {}
    for name, value in arguments.items():
        spec = properties.get(name, {})
        if value is None and name not in required:
            continue  # an explicit null for an optional parameter means "not given"
        bound[name] = middleware.correct(tool, name, value, spec, records)
    needs_default = _undefaulted_parameters(fn) if fn is not None else set()
    for name, spec in properties.items():
        if name not in bound and "default" in spec and name in needs_default:
            bound[name] = spec["default"]
    missing = [r for r in required if r not in bound]
    if missing:
        raise BindingError(SCHEMA_RESOLUTION, f"missing required parameter(s) {', '.join(map(repr, missing))}")
    try:
        jsonschema.validate(bound, {**schema, "type": "object"})
    except jsonschema.ValidationError as err:
        where = ".".join(str(p) for p in err.absolute_path) or "<arguments>"
        raise BindingError(CONSTRAINT_VIOLATION, f"{where}: {err.message}") from None
    return bound


# -- execution ---------------------------------------------------------------------------

def summarize(result: Any, limit: int = SUMMARY_CHARS) -> str:
    text = result if isinstance(result, str) else json.dumps(result, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass
class ToolContainment:
    """One episode's record of a tool call abandoned on timeout (it may still be running
    and changing the environment's state): once set, the episode is no longer trustworthy."""

    abandoned: str | None = None


_containment: contextvars.ContextVar[ToolContainment | None] = contextvars.ContextVar(
    "heart_tool_containment", default=None)


@contextlib.contextmanager
def contained_tool_calls() -> Iterator[ToolContainment]:
    """Scope of one episode's tool calls (``run_episode`` opens it, in the episode's thread)."""
    containment = ToolContainment()
    token = _containment.set(containment)
    try:
        yield containment
    finally:
        _containment.reset(token)


def bounded_result(result: Any) -> Any:
    """``result`` as plain JSON values, cut to ``MAX_RESULT_CHARS``: what a trace can hold.

    Raises ValueError for a result no JSON can hold (a cycle, nesting past the encoder).
    """
    try:
        text = json.dumps(result, ensure_ascii=False)
        plain = result
    except (TypeError, ValueError, RecursionError):  # sets, objects, cycles, absurd nesting…
        try:
            text = json.dumps(result, ensure_ascii=False, default=repr)
            plain = json.loads(text)
        except (TypeError, ValueError, RecursionError) as err:
            raise ValueError(f"the result ({type(result).__name__}) cannot be represented as JSON: "
                             f"{type(err).__name__}: {err}") from None
    if len(text) <= MAX_RESULT_CHARS:
        return plain
    return f"{text[:MAX_RESULT_CHARS]}… [result cut: {len(text):,} characters of JSON]"


def execute(tool: Tool, arguments: dict[str, Any], timeout_s: float = 10.0,
            middleware: Middleware | None = None, calls: TurnCalls | None = None) -> Envelope:
    """Bind ``arguments`` and run ``tool`` under a timeout; never raises.

    The tool boundary's ``middleware`` (:mod:`heart.middleware`; None: the default set)
    applies here: silent corrections before and during binding, then error and prerequisite
    blocks on the bound arguments (a blocked call returns a FAILURE without running; its
    prerequisites are looked up in ``calls``, the turn's successful calls, which a SUCCESS
    is appended to). Whatever applied is recorded in the envelope's ``meta["middleware"]``."""
    middleware = default_middleware() if middleware is None else middleware
    records: list[dict[str, Any]] = []
    envelope = _execute(tool, arguments, timeout_s, middleware, calls, records)
    envelope.meta = middleware.annotate(envelope.meta, records)
    return envelope


def _execute(tool: Tool, arguments: dict[str, Any], timeout_s: float, middleware: Middleware,
             calls: TurnCalls | None, records: list[dict[str, Any]]) -> Envelope:
    name = tool.name
    changed = changed_since_registration(tool)  # the document ToolFace registered, or not run
    if changed is not None:
        return failure(name, PROVENANCE_VIOLATION, changed, arguments)
    arguments = middleware.rename(name, arguments, tool.spec.parameters, records)
    try:
        bound = bind_arguments(arguments, tool.spec.parameters, tool.fn, middleware=middleware, tool=name,
                               records=records)
    except BindingError as err:
        return failure(name, err.failure_type, err.details, arguments)
    blocked = middleware.block(name, bound, tool.spec.parameters, calls, records)
    if blocked is not None:  # error / prerequisite blocking: the tool is not called
        return failure(name, blocked[0], blocked[1], bound)
    containment = _containment.get()
    if containment is not None and containment.abandoned:
        return failure(name, RUNTIME_ERROR, f"not run: {containment.abandoned}", bound)
    # A thread, not a process: tools act on in-memory environment state. A timed-out call
    # cannot be killed; it is abandoned, and the episode is marked (see ToolContainment).
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"tool-{name}")
    future = pool.submit(tool.fn, **bound)
    try:
        result = future.result(timeout=timeout_s)
    except concurrent.futures.TimeoutError:
        details = f"timed out after {timeout_s:g}s"
        if containment is not None:
            containment.abandoned = (f"{name} timed out after {timeout_s:g}s and may still be running; "
                                     "the environment's state can no longer be trusted")
        return failure(name, RUNTIME_ERROR, details, bound)
    except BaseException as err:  # the tool's own failure (SystemExit included), reported as data
        if not future.done() or future.exception() is not err:
            raise  # a real interrupt of this thread while waiting (Ctrl-C), not the tool's
        return failure(name, RUNTIME_ERROR, f"{type(err).__name__}: {err}", bound)
    finally:
        pool.shutdown(wait=False)
    try:
        result = bounded_result(result)
    except ValueError as err:
        return failure(name, RUNTIME_ERROR, str(err), bound)
    if calls is not None:
        calls.record(name, bound, result)
    return Envelope("SUCCESS", name, bound, result=result, summary=summarize_result(name, result))


def execute_with_retry(tool: Tool, arguments: dict[str, Any], timeout_s: float = 30.0,
                       attempts: int = 1, middleware: Middleware | None = None,
                       calls: TurnCalls | None = None) -> Envelope:
    """:func:`execute` up to ``attempts`` times while it fails with RUNTIME_ERROR (binding
    failures do not change on retry). The returned envelope's ``meta`` holds the total
    latency, the attempts made and every earlier attempt's envelope."""
    start = time.perf_counter()
    failed: list[dict[str, Any]] = []
    for attempt in range(1, max(1, attempts) + 1):
        envelope = execute(tool, arguments, timeout_s, middleware, calls)
        if envelope.ok or envelope.failure_type != RUNTIME_ERROR or attempt == attempts:
            break
        failed.append(envelope.to_dict())
    envelope.meta = {"latency_s": round(time.perf_counter() - start, 4), "attempts": attempt,
                     **({"failed_attempts": failed} if failed else {}),
                     **({"middleware": envelope.meta["middleware"]} if "middleware" in envelope.meta else {})}
    return envelope


# -- the Code primitive (HEELO's Code family; heart.families names the families) --------

_SANDBOX_FAILURES = {"syntax": SCHEMA_RESOLUTION, "input": SCHEMA_RESOLUTION, "refused": CONSTRAINT_VIOLATION,
                     "not_json": CONSTRAINT_VIOLATION, "too_large": CONSTRAINT_VIOLATION}
"""Sandbox outcome kind → failure type (the others — error, timeout, memory, crashed — are
RUNTIME_ERROR: the expression ran and failed)."""


def _not_a_tool(**_: Any) -> Any:
    raise RuntimeError("the Code primitive runs through heart.primitives.execute_code")


CODE_TOOL = Tool(ToolSpec(CODE_PRIMITIVE, CODE_DESCRIPTION, CODE_PARAMETERS, category=CODE_CATEGORY), _not_a_tool)


def execute_code(expression: Any, variables: dict[str, Any], timeout_s: float | None = None,
                 limits: sandbox.SandboxLimits = sandbox.DEFAULT_LIMITS) -> Envelope:
    """The Code primitive: evaluate ``expression`` over ``variables`` in the sandbox; never
    raises. The envelope's ``bound_arguments`` are the expression and the input names (the
    values are the results they were bound to); ``meta`` says ``family: code`` and, on
    failure, the sandbox's ``kind``. ``timeout_s`` (the step's h-param) can only shorten the
    sandbox's own limit."""
    if timeout_s is not None and timeout_s < limits.timeout_s:
        limits = dataclasses.replace(limits, timeout_s=float(timeout_s))
    arguments = {"expression": expression, "inputs": sorted(map(str, variables))}
    outcome = sandbox.evaluate(expression, variables, limits)
    meta: dict[str, Any] = {"family": "code", "latency_s": outcome.latency_s, "attempts": 1}
    if not outcome.ok:
        envelope = failure(CODE_PRIMITIVE, _SANDBOX_FAILURES.get(outcome.kind, RUNTIME_ERROR),
                           f"{outcome.kind}: {outcome.error}", arguments)
        envelope.meta = {**meta, "sandbox": outcome.kind}
        return envelope
    return Envelope("SUCCESS", CODE_PRIMITIVE, arguments, result=outcome.value,
                    summary=summarize_result(CODE_PRIMITIVE, outcome.value), meta=meta)


# -- $step_j.field references ------------------------------------------------------------

_ENVELOPE_KEYS = {"result", "bound_arguments", "summary", "status", "tool"}


def _lookup(envelope: Envelope, path: list[str], ref: str) -> Any:
    if path and path[0] in _ENVELOPE_KEYS:
        value: Any = getattr(envelope, path[0])
        path = path[1:]
    else:
        value = envelope.result
    for key in path:
        if isinstance(value, dict) and key in value:
            value = value[key]
        elif isinstance(value, list) and key.isdigit() and int(key) < len(value):
            value = value[int(key)]
        else:
            raise BindingError(SCHEMA_RESOLUTION, f"reference {ref} does not resolve: no field {key!r}")
    return value


def resolve_references(bindings: dict[str, Any], results: dict[int, Envelope]) -> dict[str, Any]:
    """Replace ``$step_j.field`` references with values from earlier steps' results."""

    def resolve(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: resolve(v) for k, v in value.items()}
        if isinstance(value, list):
            return [resolve(v) for v in value]
        if not isinstance(value, str) or "$step_" not in value:
            return value

        def target(match: re.Match) -> Any:
            step = int(match.group(1))
            envelope = results.get(step)
            if envelope is None or not envelope.ok:
                raise BindingError(SCHEMA_RESOLUTION,
                                   f"reference {match.group(0)} points to step {step}, which has no successful result")
            return _lookup(envelope, [p for p in match.group(2).split(".") if p], match.group(0))

        whole = REFERENCE.fullmatch(value.strip())
        if whole:
            return target(whole)
        return REFERENCE.sub(lambda m: summarize(target(m), 10_000), value)

    return {k: resolve(v) for k, v in bindings.items()}
