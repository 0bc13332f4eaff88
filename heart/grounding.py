"""Is a value grounded in a role's input? The test behind the Router's "never invent a value".

A literal is grounded when it occurs in the text of the role's input (the rendered user
message): strings as written (or JSON-escaped), numbers in their usual spellings. Booleans
and nulls are decisions, not copied text, so they are not literals; lists and objects are
grounded when every literal inside them is. ``$step_j.field`` references are not literals.
"""

from __future__ import annotations

import json
from typing import Any, Iterator

from heart.primitives import REFERENCE


def literals(value: Any) -> Iterator[str | int | float]:
    """The literal leaves of a binding value (strings and numbers; references excluded)."""
    if isinstance(value, bool) or value is None:
        return
    if isinstance(value, (int, float)):
        yield value
    elif isinstance(value, str):
        if value.strip() and not REFERENCE.fullmatch(value.strip()):
            yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from literals(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from literals(item)


def spellings(value: str | int | float) -> list[str]:
    if isinstance(value, str):
        escaped = json.dumps(value, ensure_ascii=False)[1:-1]
        return [value, escaped] if escaped != value else [value]
    if isinstance(value, float) and value.is_integer():
        return [repr(value), str(int(value))]
    return [str(value)]


def occurs(value: str | int | float, text: str) -> bool:
    return any(s in text for s in spellings(value))


def grounded(value: Any, text: str) -> bool:
    """True when every literal inside ``value`` occurs in ``text``."""
    return all(occurs(v, text) for v in literals(value))


def ungrounded_literals(bindings: dict[str, Any], text: str) -> list[tuple[str, Any]]:
    """(parameter, literal) pairs of ``bindings`` that do not occur in ``text``."""
    return [(name, v) for name, value in bindings.items() for v in literals(value) if not occurs(v, text)]
