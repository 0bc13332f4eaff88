"""Argument coercion: a proposed tool argument read as its JSON schema's type.

The correctors the tool boundary applies while binding arguments (:mod:`heart.primitives`
binds, :mod:`heart.middleware` decides which corrections run) live here, so that both import
them from one place and neither imports the other for them:

- :func:`coerce`: ``"3"`` -> 3 for an integer, ``"yes"`` -> True for a boolean, a JSON text
  -> the array or object it spells, deeply (array items, object properties); only where the
  intent is unambiguous;
- :func:`match_enum`: a value matched to one of an enum's options, case-insensitively for
  strings.

Both raise :class:`BindingError` with a typed ``failure_type``: SCHEMA_RESOLUTION when a value
cannot be read as its type, CONSTRAINT_VIOLATION when it is none of the options.
"""

from __future__ import annotations

import json
from typing import Any

SCHEMA_RESOLUTION = "SCHEMA_RESOLUTION"
"""The arguments do not fit the schema (unknown or missing parameter, a value that cannot be
coerced, a reference that does not resolve)."""
CONSTRAINT_VIOLATION = "CONSTRAINT_VIOLATION"
"""The arguments fit the schema's shape but break one of its constraints (enum, range, pattern…)."""


class BindingError(Exception):
    """Proposed arguments that cannot be bound to the tool's schema; ``failure_type`` says how."""

    def __init__(self, failure_type: str, details: str):
        super().__init__(details)
        self.failure_type = failure_type
        self.details = details


TRUE_WORDS = frozenset({"true", "yes", "y", "1", "on"})
FALSE_WORDS = frozenset({"false", "no", "n", "0", "off"})
"""The strings :func:`coerce` reads as a boolean (compared stripped and lower-cased)."""


def coerce(value: Any, schema: dict[str, Any], where: str) -> Any:
    """Coerce ``value`` towards ``schema``'s type where the intent is unambiguous; ``where``
    names the value in the error (``"limit"``, ``"ids[2]"``). Raises :class:`BindingError`
    (SCHEMA_RESOLUTION) for a value that cannot be read as the type."""
    kind = schema.get("type")
    if value is None or kind is None or isinstance(kind, list):
        return value
    try:
        if kind == "integer":
            if isinstance(value, bool):
                raise ValueError
            if isinstance(value, float) and value.is_integer():
                return int(value)
            if isinstance(value, str):
                return int(value.strip())
        elif kind == "number":
            if isinstance(value, bool):
                raise ValueError
            if isinstance(value, str):
                return float(value.strip())
        elif kind == "boolean":
            if isinstance(value, str):
                lowered = value.strip().lower()
                if lowered in TRUE_WORDS:
                    return True
                if lowered in FALSE_WORDS:
                    return False
                raise ValueError
            if isinstance(value, int) and not isinstance(value, bool) and value in (0, 1):
                return bool(value)
        elif kind == "string":
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return str(value)
        elif kind == "array":
            if isinstance(value, str) and value.strip().startswith("["):
                value = json.loads(value)
            if not isinstance(value, list):
                value = [value]
            items = schema.get("items")
            if isinstance(items, dict):
                value = [coerce(v, items, f"{where}[{i}]") for i, v in enumerate(value)]
            return value
        elif kind == "object":
            if isinstance(value, str) and value.strip().startswith("{"):
                value = json.loads(value)
            if isinstance(value, dict):
                props = schema.get("properties", {})
                return {k: coerce(v, props.get(k, {}), f"{where}.{k}") for k, v in value.items()}
    except (ValueError, json.JSONDecodeError):
        raise BindingError(SCHEMA_RESOLUTION, f"{where}: cannot read {value!r} as {kind}") from None
    return value


def match_enum(value: Any, options: list[Any], where: str) -> Any:
    """``value`` if it is one of ``options``, else the option it equals case-insensitively (a
    string); raises :class:`BindingError` (CONSTRAINT_VIOLATION) when it matches none."""
    if value in options:
        return value
    if isinstance(value, str):
        folded = {str(o).casefold(): o for o in options}
        if value.strip().casefold() in folded:
            return folded[value.strip().casefold()]
    raise BindingError(CONSTRAINT_VIOLATION, f"{where}: {value!r} is not one of {options}")
