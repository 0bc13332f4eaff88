"""Tool-boundary middleware as data: PRISM's three intercept patterns, loaded from YAML.

PRISM ("Beyond Prompts: Measuring and Optimizing LLM Tool-Agent Harnesses") searches the
harness around a fixed model; besides prompts, that harness is middleware at the tool
boundary — guarded intercepts, never a rewrite of the agent's logic. Exactly three patterns:

- ``silent_correction``: fix an argument before binding — unwrap a JSON-string-wrapped
  array/object (``json_unwrap``), coerce a value towards its schema type (``coerce_type``),
  match an enum case-insensitively (``enum_casefold``), or move a misnamed argument to its
  parameter (``rename``);
- ``error_blocking``: return an actionable FAILURE envelope before execution, so the model
  retries with a corrected call;
- ``prerequisite_blocking``: refuse a call (typically one that mutates the environment)
  until an earlier successful call *of this turn* has produced the value it acts on
  (``prior_call(tool=ls, field=current_directory_content)``: ``rm`` only removes a file a
  listing showed).

An intercept can only edit arguments before the call, return a FAILURE without calling, or
annotate the envelope after: it never calls a tool and never edits a result. Every
application is recorded in the envelope's ``meta["middleware"]`` (set, version, and per
application: intercept id, pattern, tool, parameter, before/after or the block message), so
it reaches the trace's Primitive event.

The default set (``heart/intercepts/default.yaml``, package data: an installed ``heart``
has no repository root) is the binding's coercion — type coercion, JSON unwrapping, enum
case — as data: ``LoopConfig.middleware = "none"`` (``--middleware none``) switches it off
to measure it, a path replaces it. The file format and
the guard language are in docs/middleware.md.
"""

from __future__ import annotations

import fnmatch
import functools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import yaml

from heart.coercion import CONSTRAINT_VIOLATION, SCHEMA_RESOLUTION, coerce, match_enum
from heart.user_errors import UserError

FORMAT = "heart-middleware/1"
PATTERNS = ("silent_correction", "error_blocking", "prerequisite_blocking")
CORRECTIONS = ("json_unwrap", "coerce_type", "enum_casefold", "rename")
FAILURE_TYPES = (SCHEMA_RESOLUTION, CONSTRAINT_VIOLATION)
DEFAULT_PATH = Path(__file__).parent / "intercepts" / "default.yaml"
RECORD_CHARS = 200
"""A before/after value longer than this (as JSON) is recorded cut."""


class MiddlewareError(UserError):
    """An intercept file that cannot be used; the message names the file and the field."""


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


MISSING = _Missing()
"""The value of a parameter the call does not give."""


# -- the turn's record of calls (what prior_call looks at) ------------------------------

@dataclass
class TurnCalls:
    """The successful calls of one turn, in order: ``(tool, bound arguments, result)``.
    Filled by :func:`heart.primitives.execute` after each SUCCESS (observation only)."""

    calls: list[tuple[str, dict[str, Any], Any]] = field(default_factory=list)

    def record(self, tool: str, arguments: dict[str, Any], result: Any) -> None:
        self.calls.append((tool, dict(arguments), result))


def _values_at(value: Any, path: list[str]) -> Iterable[Any]:
    """Every value at ``path`` in ``value``; lists are walked through at every level."""
    if isinstance(value, list):
        for item in value:
            yield from _values_at(item, path)
        return
    if not path:
        yield value
        return
    if isinstance(value, dict) and path[0] in value:
        yield from _values_at(value[path[0]], path[1:])


# -- the guard language ------------------------------------------------------------------

@dataclass
class Context:
    """What a guard sees: one parameter of one call."""

    tool: str
    parameter: str
    value: Any
    spec: dict[str, Any]
    calls: TurnCalls | None = None


def _conforms(value: Any, spec: dict[str, Any]) -> bool:
    """Whether ``value`` already has ``spec``'s type, deeply (array items, object properties);
    where it does, :func:`heart.coercion.coerce` would leave it unchanged."""
    kind = spec.get("type")
    if value is None or kind is None or isinstance(kind, list):
        return True
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "string":
        return isinstance(value, str)
    if kind == "array":
        items = spec.get("items")
        return isinstance(value, list) and (not isinstance(items, dict) or all(_conforms(v, items) for v in value))
    if kind == "object":
        props = spec.get("properties", {})
        return isinstance(value, dict) and all(_conforms(v, props.get(k, {})) for k, v in value.items())
    return True


def _json_container(value: Any) -> Any:
    """The array/object a JSON string holds, or MISSING."""
    if not isinstance(value, str) or not value.strip()[:1] in ("[", "{"):
        return MISSING
    try:
        loaded = json.loads(value)
    except ValueError:
        return MISSING
    return loaded if isinstance(loaded, (list, dict)) else MISSING


def _enum_of(spec: dict[str, Any]) -> tuple[list[Any] | None, bool]:
    if "enum" in spec:
        return spec["enum"], False
    if isinstance(spec.get("items"), dict) and "enum" in spec["items"]:
        return spec["items"]["enum"], True
    return None, False


def _not_in_enum(c: Context) -> bool:
    options, per_item = _enum_of(c.spec)
    if options is None or c.value is MISSING:
        return False
    if per_item:
        return isinstance(c.value, list) and any(v not in options for v in c.value)
    return c.value not in options


def _prior_call(c: Context, tool: str, field: str | None = None) -> bool:
    if c.calls is None:
        return False
    tools = set(tool.split("|"))
    for name, _, result in c.calls.calls:
        if name not in tools:
            continue
        if field is None:
            return True
        if c.value is not MISSING and any(v == c.value for v in _values_at(result, field.split("."))):
            return True
    return False


_ATOMS: dict[str, tuple[str, Callable[..., bool]]] = {
    # name: (argument kind, predicate); kinds: "" none, "pos" positional values, "regex", "kw"
    "missing": ("", lambda c: c.value is MISSING or c.value is None),
    "present": ("", lambda c: c.value is not MISSING and c.value is not None),
    "is_string_json": ("", lambda c: _json_container(c.value) is not MISSING),
    "type_mismatch": ("", lambda c: c.value is not MISSING and not _conforms(c.value, c.spec)),
    "not_in_enum": ("", _not_in_enum),
    "schema_type": ("pos", lambda c, *types: c.spec.get("type") in types),
    "matches": ("regex", lambda c, rx: isinstance(c.value, str) and rx.search(c.value) is not None),
    "prior_call": ("kw", _prior_call),
}
_TOKEN = re.compile(r"\s*(?:(\()|(\))|(,)|(=)|'((?:[^'\\]|\\.)*)'|\"((?:[^\"\\]|\\.)*)\"|([^\s(),=]+))")


@dataclass(frozen=True)
class Guard:
    """A parsed ``when`` expression: ``test(context)`` evaluates it."""

    source: str
    test: Callable[[Context], bool]
    atoms: tuple[tuple[str, tuple, dict], ...]
    """Every atom used: (name, positional args, keyword args) — for load-time checks."""


def parse_guard(source: str) -> Guard:
    """Parse a guard expression; raises ValueError saying what does not parse."""
    tokens: list[tuple[str, str]] = []
    pos = 0
    text = str(source)
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise ValueError(f"cannot read {text[pos:]!r}")
        pos = m.end()
        punct = next((m.group(g) for g in range(1, 5) if m.group(g) is not None), None)
        if punct:
            tokens.append((punct, punct))
        elif m.group(5) is not None or m.group(6) is not None:
            tokens.append(("str", m.group(5) if m.group(5) is not None else m.group(6)))
        else:
            tokens.append(("word", m.group(7)))
    atoms: list[tuple[str, tuple, dict]] = []
    i = 0

    def peek() -> tuple[str, str] | None:
        return tokens[i] if i < len(tokens) else None

    def take(kind: str | None = None) -> tuple[str, str]:
        nonlocal i
        if i >= len(tokens):
            raise ValueError("unexpected end of expression")
        tok = tokens[i]
        if kind is not None and tok[0] != kind:
            raise ValueError(f"expected {kind!r}, got {tok[1]!r}")
        i += 1
        return tok

    def expr() -> Callable[[Context], bool]:
        parts = [term()]
        while peek() == ("word", "or"):
            take()
            parts.append(term())
        return parts[0] if len(parts) == 1 else (lambda c, ps=tuple(parts): any(p(c) for p in ps))

    def term() -> Callable[[Context], bool]:
        parts = [factor()]
        while peek() == ("word", "and"):
            take()
            parts.append(factor())
        return parts[0] if len(parts) == 1 else (lambda c, ps=tuple(parts): all(p(c) for p in ps))

    def factor() -> Callable[[Context], bool]:
        tok = peek()
        if tok == ("word", "not"):
            take()
            inner = factor()
            return lambda c: not inner(c)
        if tok is not None and tok[0] == "(":
            take("(")
            inner = expr()
            take(")")
            return inner
        return atom()

    def atom() -> Callable[[Context], bool]:
        kind, name = take()
        if kind != "word" or name not in _ATOMS:
            raise ValueError(f"unknown predicate {name!r}; known: {', '.join(_ATOMS)}")
        arg_kind, fn = _ATOMS[name]
        args: list[str] = []
        kwargs: dict[str, str] = {}
        if peek() is not None and peek()[0] == "(":
            take("(")
            while peek() is not None and peek()[0] != ")":
                value = take()
                if value[0] not in ("word", "str"):
                    raise ValueError(f"{name}: unexpected {value[1]!r}")
                if peek() is not None and peek()[0] == "=":
                    take("=")
                    kwargs[value[1]] = take()[1]
                else:
                    args.append(value[1])
                if peek() is not None and peek()[0] == ",":
                    take(",")
            take(")")
        if arg_kind == "" and (args or kwargs):
            raise ValueError(f"{name} takes no arguments")
        if arg_kind == "pos" and (kwargs or not args):
            raise ValueError(f"{name} takes one or more values, e.g. {name}(array, object)")
        if arg_kind == "regex":
            if kwargs or len(args) != 1:
                raise ValueError(f"{name} takes one regular expression")
            try:
                compiled = re.compile(args[0])
            except re.error as err:
                raise ValueError(f"{name}: bad regular expression {args[0]!r}: {err}") from None
            atoms.append((name, tuple(args), {}))
            return lambda c: fn(c, compiled)
        if arg_kind == "kw":
            if args or "tool" not in kwargs or set(kwargs) - {"tool", "field"}:
                raise ValueError(f"{name} takes tool=NAME[|NAME…] and optionally field=PATH")
        atoms.append((name, tuple(args), dict(kwargs)))
        return lambda c: fn(c, *args, **kwargs)

    if not tokens:
        raise ValueError("empty expression")
    test = expr()
    if i != len(tokens):
        raise ValueError(f"unexpected {tokens[i][1]!r}")
    return Guard(text, test, tuple(atoms))


# -- intercepts and sets -----------------------------------------------------------------

@dataclass(frozen=True)
class Intercept:
    id: str
    pattern: str
    tool: str
    """A tool name, NAME|NAME…, or a glob (``*``: every tool)."""
    parameter: str
    """A parameter name or ``*`` (every parameter of the tool's schema)."""
    when: Guard
    action: dict[str, Any]
    reason: str

    def applies_to(self, tool: str) -> bool:
        return any(fnmatch.fnmatchcase(tool, t) for t in self.tool.split("|"))

    def parameters(self, schema: dict[str, Any], given: dict[str, Any]) -> list[str]:
        if self.parameter != "*":
            return [self.parameter]
        return list(schema.get("properties", {})) + [k for k in given if k not in schema.get("properties", {})]


def _clip(value: Any) -> Any:
    if value is MISSING:
        return "<missing>"
    text = json.dumps(value, ensure_ascii=False, default=repr)
    return value if len(text) <= RECORD_CHARS else text[: RECORD_CHARS - 1] + "…"


@dataclass(frozen=True)
class Middleware:
    """A loaded intercept set, applied by :func:`heart.primitives.execute`."""

    name: str
    version: str
    intercepts: tuple[Intercept, ...] = ()
    source: str = ""

    @property
    def label(self) -> str:
        return f"{self.name}@{self.version}"

    def _of(self, pattern: str, corrections: tuple[str, ...] | None = None) -> list[Intercept]:
        return [i for i in self.intercepts if i.pattern == pattern
                and (corrections is None or i.action.get("correct") in corrections)]

    # silent correction, whole call: argument names (before binding)
    def rename(self, tool: str, arguments: dict[str, Any], schema: dict[str, Any],
               records: list[dict[str, Any]]) -> dict[str, Any]:
        out = dict(arguments)
        for i in self._of("silent_correction", ("rename",)):
            if not i.applies_to(tool) or i.parameter not in schema.get("properties", {}):
                continue
            spec = schema["properties"][i.parameter]
            if not i.when.test(Context(tool, i.parameter, out.get(i.parameter, MISSING), spec)):
                continue
            alias = next((a for a in i.action["from"] if a in out and a not in schema.get("properties", {})), None)
            if alias is not None:
                out[i.parameter] = out.pop(alias)
                records.append({"id": i.id, "pattern": i.pattern, "tool": tool, "parameter": i.parameter,
                                "before": alias, "after": i.parameter})
        return out

    # silent correction, one value (inside binding, where coercion always was)
    def correct(self, tool: str, name: str, value: Any, spec: dict[str, Any],
                records: list[dict[str, Any]] | None) -> Any:
        for i in self._of("silent_correction", ("json_unwrap", "coerce_type", "enum_casefold")):
            if not i.applies_to(tool) or i.parameter not in ("*", name):
                continue
            if not i.when.test(Context(tool, name, value, spec)):
                continue
            kind = i.action["correct"]
            if kind == "json_unwrap":
                loaded = _json_container(value)
                after = value if loaded is MISSING else loaded
            elif kind == "coerce_type":
                after = coerce(value, spec, name)  # raises BindingError: unreadable as the type
            else:
                options, per_item = _enum_of(spec)
                if options is None:
                    continue
                after = ([match_enum(v, options, f"{name}[{k}]") for k, v in enumerate(value)]
                         if per_item and isinstance(value, list) else
                         value if per_item else match_enum(value, options, name))
            if records is not None and _canonical(after) != _canonical(value):
                records.append({"id": i.id, "pattern": i.pattern, "tool": tool, "parameter": name,
                                "before": _clip(value), "after": _clip(after)})
            value = after
        return value

    # error blocking and prerequisite blocking (on the bound arguments, before execution)
    def block(self, tool: str, bound: dict[str, Any], schema: dict[str, Any], calls: TurnCalls | None,
              records: list[dict[str, Any]]) -> tuple[str, str] | None:
        """The first block that applies: (failure type, actionable message), or None.
        Prerequisite intercepts need the turn's record of calls: without one (a call outside
        a HEART turn) they do not apply."""
        for i in self.intercepts:
            if i.pattern == "silent_correction" or not i.applies_to(tool):
                continue
            if i.pattern == "prerequisite_blocking" and calls is None:
                continue
            for name in i.parameters(schema, bound):
                spec = schema.get("properties", {}).get(name, {})
                value = bound.get(name, MISSING)
                if i.when.test(Context(tool, name, value, spec, calls)):
                    message = _fill(i.action["message"], tool=tool, parameter=name,
                                    value="" if value is MISSING else value)
                    records.append({"id": i.id, "pattern": i.pattern, "tool": tool, "parameter": name,
                                    "value": _clip(value), "blocked": message})
                    return i.action.get("failure_type", "CONSTRAINT_VIOLATION"), message
        return None

    def annotate(self, meta: dict[str, Any], records: list[dict[str, Any]]) -> dict[str, Any]:
        """The envelope's meta with what this set did to the call (nothing when nothing applied)."""
        if not records:
            return meta
        return {**meta, "middleware": {"set": self.label, "applied": list(records)}}


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=repr)


def _fill(template: str, **values: Any) -> str:
    return re.sub(r"\{(tool|parameter|value)\}", lambda m: str(values[m.group(1)]), template)


NO_MIDDLEWARE = Middleware("none", "0")
"""No intercept at all: arguments are bound as given (``--middleware none``)."""


# -- loading -----------------------------------------------------------------------------

def _catalog_index(catalog: Iterable[Any] | None) -> dict[str, set[str]] | None:
    if catalog is None:
        return None
    index: dict[str, set[str]] = {}
    for spec in catalog:
        name = getattr(spec, "name", None) or spec["name"]
        params = getattr(spec, "parameters", None) or spec.get("parameters", {})
        index.setdefault(name, set()).update((params or {}).get("properties", {}))
    return index


def parse_middleware(data: Any, source: str = "<middleware>", catalog: Iterable[Any] | None = None) -> Middleware:
    """A :class:`Middleware` from a parsed YAML document; raises :class:`MiddlewareError`
    naming ``source`` and the field. With ``catalog`` (the environment's tool specs), every
    named tool, parameter and ``prior_call`` tool must exist in it."""

    def bad(where: str, why: str) -> MiddlewareError:
        return MiddlewareError(f"{source}: {where}: {why}")

    if not isinstance(data, dict):
        raise bad("<file>", "expected a mapping with format, name, version and intercepts")
    unknown = set(data) - {"format", "name", "version", "description", "intercepts"}
    if unknown:
        raise bad(sorted(unknown)[0], f"unknown field; allowed: format, name, version, description, intercepts")
    if data.get("format") != FORMAT:
        raise bad("format", f"must be {FORMAT!r}, got {data.get('format')!r}")
    for key in ("name", "version"):
        if not isinstance(data.get(key), (str, int)) or str(data.get(key)).strip() == "":
            raise bad(key, "required (a string)")
    rows = data.get("intercepts")
    if not isinstance(rows, list):
        raise bad("intercepts", "required: a list of intercepts (may be empty)")
    index = _catalog_index(catalog)
    seen: set[str] = set()
    intercepts = []
    for n, row in enumerate(rows):
        at = f"intercepts[{n}]"
        if not isinstance(row, dict):
            raise bad(at, "expected a mapping")
        extra = set(row) - {"id", "pattern", "guard", "action", "reason"}
        if extra:
            raise bad(f"{at}.{sorted(extra)[0]}", "unknown field; allowed: id, pattern, guard, action, reason")
        iid = row.get("id")
        if not isinstance(iid, str) or not iid.strip():
            raise bad(f"{at}.id", "required (a string)")
        if iid in seen:
            raise bad(f"{at}.id", f"duplicate id {iid!r}")
        seen.add(iid)
        at = f"intercepts[{n}] ({iid})"
        pattern = row.get("pattern")
        if pattern not in PATTERNS:
            raise bad(f"{at}.pattern", f"unknown pattern {pattern!r}; one of {', '.join(PATTERNS)}")
        if not isinstance(row.get("reason"), str) or not row["reason"].strip():
            raise bad(f"{at}.reason", "required: why this intercept exists (it is recorded)")
        guard = row.get("guard")
        if not isinstance(guard, dict) or set(guard) - {"tool", "parameter", "when"}:
            raise bad(f"{at}.guard", "expected a mapping of tool, parameter, when")
        tool, parameter = str(guard.get("tool", "*")), str(guard.get("parameter", "*"))
        try:
            when = parse_guard(guard.get("when", ""))
        except ValueError as err:
            raise bad(f"{at}.guard.when", f"does not parse: {err}") from None
        action = row.get("action") or {}
        if not isinstance(action, dict):
            raise bad(f"{at}.action", "expected a mapping")
        if pattern == "silent_correction":
            if action.get("correct") not in CORRECTIONS:
                raise bad(f"{at}.action.correct", f"one of {', '.join(CORRECTIONS)}, got {action.get('correct')!r}")
            if set(action) - {"correct", "from"}:
                raise bad(f"{at}.action", "silent_correction takes correct (and from, for rename)")
            if action["correct"] == "rename":
                names = action.get("from")
                if isinstance(names, str):
                    names = [names]
                if not names or not all(isinstance(a, str) for a in names) or parameter == "*":
                    raise bad(f"{at}.action.from", "rename needs the guard's parameter and from: [wrong names]")
                action = {**action, "from": list(names)}
        else:
            if not isinstance(action.get("message"), str) or not action["message"].strip():
                raise bad(f"{at}.action.message", "required: the actionable message the model gets back")
            if set(action) - {"message", "failure_type"}:
                raise bad(f"{at}.action", f"{pattern} takes message and failure_type")
            if action.get("failure_type", "CONSTRAINT_VIOLATION") not in FAILURE_TYPES:
                raise bad(f"{at}.action.failure_type", f"one of {', '.join(FAILURE_TYPES)}")
        has_prior = any(a[0] == "prior_call" for a in when.atoms)
        if pattern == "prerequisite_blocking" and not has_prior:
            raise bad(f"{at}.guard.when", "prerequisite_blocking needs a prior_call(tool=…) predicate")
        if pattern != "prerequisite_blocking" and has_prior:
            raise bad(f"{at}.guard.when", "prior_call belongs to prerequisite_blocking intercepts")
        if index is not None:
            wildcard = any(ch in tool for ch in "*?[")
            tools = [] if wildcard else tool.split("|")
            for t in tools:
                if t not in index:
                    raise bad(f"{at}.guard.tool", f"unknown tool {t!r} (not in the environment's catalog)")
                if parameter != "*" and parameter not in index[t]:
                    raise bad(f"{at}.guard.parameter", f"tool {t!r} has no parameter {parameter!r}; "
                                                       f"it takes {sorted(index[t])}")
            if wildcard and parameter != "*" and not any(
                    parameter in params for name, params in index.items() if fnmatch.fnmatchcase(name, tool)):
                raise bad(f"{at}.guard.parameter", f"no tool matching {tool!r} has a parameter {parameter!r}")
            for name, _, kwargs in when.atoms:
                for t in (kwargs.get("tool", "").split("|") if name == "prior_call" else []):
                    if t not in index:
                        raise bad(f"{at}.guard.when", f"prior_call names unknown tool {t!r}")
        intercepts.append(Intercept(iid, pattern, tool, parameter, when, action, row["reason"].strip()))
    return Middleware(str(data["name"]), str(data["version"]), tuple(intercepts), source)


@functools.lru_cache(maxsize=32)
def _load_file(path: str, mtime_ns: int) -> Middleware:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError as err:
        raise MiddlewareError(f"{path}: <file>: not YAML: {' '.join(str(err).split())}") from None
    return parse_middleware(data, path)


def load_middleware(spec: str | Path | None = "default", catalog: Iterable[Any] | None = None) -> Middleware:
    """The intercept set ``spec`` names: ``"default"`` (the shipped set), ``"none"`` (no
    intercept), or a YAML file's path. With ``catalog``, names are checked against it."""
    if spec is None or str(spec) == "default":
        path = DEFAULT_PATH
    elif str(spec) == "none":
        return NO_MIDDLEWARE
    else:
        path = Path(spec)
    if not path.is_file():
        raise MiddlewareError(f"{path}: <file>: no such middleware file (give a YAML path, 'default' or 'none')")
    loaded = _load_file(str(path.resolve()), path.stat().st_mtime_ns)
    if catalog is not None:  # the same document, checked against the environment's tools
        loaded = parse_middleware(yaml.safe_load(path.read_text()), str(path), catalog)
    return loaded


def default_middleware() -> Middleware:
    return load_middleware("default")
