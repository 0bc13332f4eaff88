"""Carried validation after execution (HEELO): is the result well-formed, did the state change as asked?

HEELO's primitives carry their resource's validation. Before execution that is the tool's
argument schema (:func:`heart.primitives.bind_arguments`: a call that does not fit it is a
typed FAILURE and never runs). After execution a tool has no schema of its own for what it
returns, so two checks are made here and recorded in the SUCCESS envelope's ``validation``,
which the Verifier's input shows:

- ``shape``: the result against the JSON Schema mined for its tool from the train split's
  successful gold episodes (``bench/result_shapes.py`` writes ``heart/result_shapes.json``:
  per tool, the types and always-present keys of its results, by ``genson``; checked with
  ``jsonschema``): ``ok``, ``mismatch``, or ``unknown`` (no mined shape for this tool, or a
  result cut for size);
- ``state_change``, for state-changing tools (:func:`heart.roles.router.is_read_only` false):
  the environment's state before and after the call (the session's ``state()``: AgentDojo's
  environment model, BFCL's backend objects), compared with ``deepdiff``: ``ok`` (something
  changed, and the change holds a value the call was asked for — a created file's name, a
  sent message's text), ``unmatched`` (something changed, but none of the asked values is in
  the change), ``none`` (nothing changed), ``n/a`` (a read, or no state to look at).

Why evidence and not a FAILURE: the tool ran, and its effects happened, whatever these
checks say; a FAILURE would send the step back to a re-plan that may run the effect again
(the turn ledger prevents a second run of the same call, not of a corrected one). And the
checks are mined or generic, not the resource's own: a result of a shape train never showed
(an empty inbox, a first transaction) or a change the diff cannot tie to the arguments (a
``cd`` moves a pointer, ``lockDoors`` on locked doors changes nothing) is often correct. The
Verifier weighs them with everything else; the argument schema stays the hard gate.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import jsonschema

from heart.roles.router import is_read_only
from heart.user_errors import UserError

SHAPES_FORMAT = "heart.result_shapes"
SHAPES_VERSION = 1
"""The mined table's format and version (a file of another version is refused)."""
DEFAULT_SHAPES = Path(__file__).with_name("result_shapes.json")
DETAILS_CHARS = 160
STATE_DEPTH = 24
"""How deep :func:`state_view` follows an environment's objects."""
CUT_MARKER = "[result cut:"
"""What :func:`heart.primitives.bounded_result` appends to a result cut for size."""


class ShapesFormatError(UserError):
    """A result-shapes file that cannot be used (not JSON, wrong format or version): the
    ``heart`` CLI prints its one line and exits 2."""


@dataclass(frozen=True)
class ResultShapes:
    """The mined table: tool name → JSON Schema of its successful results."""

    schemas: dict[str, dict[str, Any]]
    source: dict[str, Any]

    @functools.cached_property
    def _validators(self) -> dict[str, jsonschema.Draft202012Validator]:
        return {tool: jsonschema.Draft202012Validator(schema) for tool, schema in self.schemas.items()}

    def check(self, tool: str, result: Any) -> tuple[str, str]:
        """(``ok`` | ``mismatch`` | ``unknown``, details) for one successful result."""
        if isinstance(result, str) and CUT_MARKER in result:
            return "unknown", "result cut for size"
        validator = self._validators.get(tool)
        if validator is None:
            return "unknown", f"no mined result shape for {tool}"
        error = next(iter(validator.iter_errors(result)), None)
        if error is None:
            return "ok", ""
        where = "/".join(str(p) for p in error.absolute_path) or "result"
        return "mismatch", _clip(f"{where}: {error.message}")


def shapes_document(schemas: dict[str, dict[str, Any]], source: dict[str, Any]) -> dict[str, Any]:
    """The file form of a mined table (what ``bench/result_shapes.py`` writes)."""
    return {"format": SHAPES_FORMAT, "version": SHAPES_VERSION, "source": source,
            "tools": {tool: schemas[tool] for tool in sorted(schemas)}}


@functools.lru_cache(maxsize=8)
def load_result_shapes(path: str | None = None) -> ResultShapes:
    """The mined table at ``path`` (None: the shipped one); raises :class:`ShapesFormatError`."""
    where = Path(path) if path else DEFAULT_SHAPES
    try:
        document = json.loads(where.read_text())
    except (OSError, ValueError) as err:
        raise ShapesFormatError(f"cannot read result shapes {where}: {err}") from None
    if not isinstance(document, dict) or document.get("format") != SHAPES_FORMAT:
        raise ShapesFormatError(f"{where} is not a result-shapes file (format {SHAPES_FORMAT!r})")
    if document.get("version") != SHAPES_VERSION:
        raise ShapesFormatError(f"{where} has result-shapes version {document.get('version')!r}; "
                                f"this toolkit reads version {SHAPES_VERSION}")
    tools = document.get("tools")
    if not isinstance(tools, dict) or not all(isinstance(s, dict) for s in tools.values()):
        raise ShapesFormatError(f"{where}: 'tools' must map tool names to JSON Schemas")
    return ResultShapes(tools, document.get("source", {}))


# -- the environment's state ---------------------------------------------------------------

def state_view(value: Any, depth: int = STATE_DEPTH, _path: tuple[int, ...] = ()) -> Any:
    """Plain JSON data for an environment's state: objects as their attributes, containers
    item by item. An object met again below itself (a directory's ``parent``) is cut to a
    marker, so cyclic structures stay finite; past ``depth`` levels, values are their type."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if depth <= 0:
        return f"<{type(value).__name__}>"
    if id(value) in _path:
        return f"<cycle {type(value).__name__}>"
    here = _path + (id(value),)
    if isinstance(value, dict):
        return {str(k): state_view(v, depth - 1, here) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value
        return [state_view(v, depth - 1, here) for v in items]
    dump = getattr(value, "model_dump", None)  # pydantic models: their own JSON form
    if callable(dump):
        try:
            return dump(mode="json")
        except Exception:  # noqa: BLE001 — a model that cannot dump falls back to its attributes
            pass
    attributes = getattr(value, "__dict__", None)
    if isinstance(attributes, dict):
        return {k: state_view(v, depth - 1, here) for k, v in attributes.items() if not k.startswith("__")}
    return str(value)


def _scalars(value: Any) -> list[Any]:
    """The scalar values inside an argument (strings, numbers), for :func:`state_change`."""
    if isinstance(value, dict):
        return [s for v in value.values() for s in _scalars(v)]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in _scalars(v)]
    if isinstance(value, bool) or value is None or (isinstance(value, str) and not value.strip()):
        return []
    return [value]


def state_change(before: Any, after: Any, arguments: dict[str, Any]) -> tuple[str, str]:
    """(``ok`` | ``unmatched`` | ``none``, details): did the state change, and does the change
    hold a value the call was asked for? (See the module docstring.)"""
    from deepdiff import DeepDiff, DeepSearch

    if before == after:
        return "none", "the environment's state did not change"
    diff = DeepDiff(before, after, view="tree")
    changed = [(level.path(), level.t2 if level.t2 is not None and type(level.t2).__name__ != "NotPresent"
                else level.t1) for levels in diff.values() for level in levels]
    if not changed:
        return "none", "the environment's state did not change"
    where = ", ".join(p for p, _ in changed[:3]) + (f" (+{len(changed) - 3})" if len(changed) > 3 else "")
    asked = _scalars(arguments)
    if not asked:
        return "ok", _clip(f"changed: {where}")
    for path, value in changed:
        for item in asked:
            text = str(item).lower()
            if text in path.lower():
                return "ok", _clip(f"changed: {where}")
            try:
                found = DeepSearch(value, item, strict_checking=False, case_sensitive=False, verbose_level=1)
            except Exception:  # noqa: BLE001 — an odd value in the state is no evidence either way
                found = {}
            if found or (isinstance(value, (str, int, float)) and text in str(value).lower()):
                return "ok", _clip(f"changed: {where}")
    return "unmatched", _clip(f"changed: {where}; none of the asked values is in the change")


def _clip(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= DETAILS_CHARS else text[: DETAILS_CHARS - 1] + "…"


class CarriedValidation:
    """The post-execution checks of one episode's tool calls: the mined ``shapes`` (None: no
    shape check) and the session's ``state`` function (None: no state check)."""

    def __init__(self, shapes: ResultShapes | None, state: Callable[[], Any] | None = None):
        self.shapes = shapes
        self.state = state

    def snapshot(self, tool: str) -> tuple[bool, Any]:
        """(taken, state) before a call: only state-changing tools are compared."""
        if self.state is None or is_read_only(tool):
            return False, None
        try:
            return True, self.state()
        except Exception as err:  # noqa: BLE001 — no state to compare is "n/a", never a crash
            return False, f"state unavailable: {type(err).__name__}: {err}"

    def check(self, tool: str, arguments: dict[str, Any], result: Any, before: tuple[bool, Any]) -> dict[str, Any]:
        """The ``validation`` record of one SUCCESS: shape, state change, and details of what
        is not ok. Never raises: a check that breaks is recorded as not made."""
        record: dict[str, Any] = {}
        details = []
        try:
            shape, why = self.shapes.check(tool, result) if self.shapes is not None else ("unknown", "")
        except Exception as err:  # noqa: BLE001
            shape, why = "unknown", f"shape check failed: {type(err).__name__}"
        record["shape"] = shape
        if why and shape != "ok":
            details.append(why)
        taken, state_before = before
        if not taken:
            record["state_change"] = "n/a"
            if isinstance(state_before, str):
                details.append(state_before)
        else:
            try:
                change, why = state_change(state_before, self.state(), arguments)
            except Exception as err:  # noqa: BLE001
                change, why = "n/a", f"state check failed: {type(err).__name__}: {err}"
            record["state_change"] = change
            if change != "ok":
                details.append(why)
        if details:
            record["details"] = _clip("; ".join(details))
        return record
