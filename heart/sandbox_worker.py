"""The Code primitive's evaluator process: one expression, under hard limits, then exit.

Run by :mod:`heart.sandbox` as ``python -I -X utf8 sandbox_worker.py`` (isolated: no
environment variables, no user site, not even this file's folder on ``sys.path``). It
imports only the standard library and simpleeval — never ``heart`` — reads one JSON
request on stdin (``expression``, ``variables``, ``limits``), sets its own resource limits
before it evaluates anything (address space, CPU seconds, no new files, no core dumps),
evaluates with simpleeval's ``EvalWithCompoundTypes`` over an allow-list of functions and
of attributes per type, and writes one JSON line on stdout: ``{"ok": true, "value": ...}``
or ``{"ok": false, "kind": ..., "error": ...}``. Anything it cannot report (killed for CPU,
out of memory in the interpreter itself) the parent sees as the process's exit.
"""

from __future__ import annotations

import json
import math
import re
import resource
import sys


def _limit(kind: int, value: int) -> None:
    try:
        resource.setrlimit(kind, (value, value))
    except (ValueError, OSError):  # a limit the platform refuses: the parent's timeout still holds
        pass


def _apply_limits(limits: dict) -> None:
    _limit(resource.RLIMIT_CPU, max(1, int(math.ceil(limits["cpu_s"]))))
    _limit(resource.RLIMIT_AS, int(limits["memory_mb"]) * 2**20)
    _limit(resource.RLIMIT_FSIZE, 0)
    _limit(resource.RLIMIT_CORE, 0)
    _limit(resource.RLIMIT_NOFILE, 16)


# -- the functions an expression may call -------------------------------------------------

MAX_RANGE = 10_000
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_TIME = re.compile(r"(?<![\d:])(\d{1,2})(?::(\d{2}))?(?::\d{2})?\s*([AaPp]\.?[Mm]\.?)?(?![\d])")


class NotAllowed(Exception):
    """What the sandbox itself refuses (beyond simpleeval's own refusals)."""


def _plain(value):
    """Refuse to turn a function, a type or a generator into text: its repr names objects
    (``<built-in function len>``) that no computation needs."""
    if callable(value) or isinstance(value, type) or type(value).__name__ in ("generator", "range"):
        raise NotAllowed(f"a {type(value).__name__} cannot be turned into text")
    return value


def _str(value=""):
    return str(_plain(value))


def _mod(a, b):
    if isinstance(a, (str, bytes)):  # '%s' % x, '%999999999d' % 1: use an f-string
        raise NotAllowed("%-formatting of strings is not allowed (use an f-string)")
    return a % b


def _range(*args):
    r = range(*args)
    if len(r) > MAX_RANGE:
        raise ValueError(f"range of {len(r)} items; at most {MAX_RANGE}")
    return list(r)


def numbers(text) -> list:
    """Every number in ``text`` (as floats), in order."""
    return [float(n) for n in _NUMBER.findall(str(text))]


def number(text):
    """The first number in ``text`` (a float), or None."""
    found = numbers(text)
    return found[0] if found else None


def minutes(text):
    """Minutes past midnight of the time in ``text`` ("2024-05-15T11:00:00", "11:00",
    "8 AM", "8:30 pm"), or None when it holds no time."""
    text = str(text)
    iso = re.search(r"T(\d{2}):(\d{2})", text)
    if iso:
        return int(iso.group(1)) * 60 + int(iso.group(2))
    for match in _TIME.finditer(text):
        hours, mins, half = int(match.group(1)), int(match.group(2) or 0), (match.group(3) or "").lower()
        if not match.group(2) and not half:
            continue  # a bare number is not a time
        if half.startswith("p") and hours < 12:
            hours += 12
        elif half.startswith("a") and hours == 12:
            hours = 0
        if hours < 24 and mins < 60:
            return hours * 60 + mins
    return None


def hhmm(total_minutes) -> str:
    """Minutes as "HH:MM" (90 → "01:30"; negative spans keep their sign)."""
    total = int(round(float(total_minutes)))
    sign = "-" if total < 0 else ""
    return f"{sign}{abs(total) // 60:02d}:{abs(total) % 60:02d}"


def clock(text):
    """The time in ``text`` as "HH:MM" ("8 AM" → "08:00"), or None."""
    found = minutes(text)
    return None if found is None else hhmm(found)


def minutes_between(start, end):
    """Minutes from the time in ``start`` to the time in ``end`` (same day)."""
    a, b = minutes(start), minutes(end)
    if a is None or b is None:
        raise ValueError(f"no time in {str(start)[:40]!r} or {str(end)[:40]!r}")
    return b - a


def days_between(start, end) -> int:
    """Days from the date in ``start`` to the date in ``end`` (YYYY-MM-DD)."""
    import datetime

    def day(text):
        match = re.search(r"\d{4}-\d{2}-\d{2}", str(text))
        if not match:
            raise ValueError(f"no YYYY-MM-DD date in {str(text)[:40]!r}")
        return datetime.date.fromisoformat(match.group(0))

    return (day(end) - day(start)).days


FUNCTIONS = {
    "abs": abs, "all": all, "any": any, "bool": bool, "dict": dict, "enumerate": lambda x: list(enumerate(x)),
    "float": float, "int": int, "len": len, "list": list, "max": max, "min": min, "range": _range,
    "reversed": lambda x: list(reversed(x)), "round": round, "set": set,
    "sorted": sorted, "str": _str, "sum": sum, "tuple": tuple, "zip": lambda *x: list(zip(*x)),
    "numbers": numbers, "number": number, "minutes": minutes, "hhmm": hhmm, "clock": clock,
    "minutes_between": minutes_between, "days_between": days_between,
}
"""Pure functions only: no I/O, no objects with methods beyond the allowed attributes."""

ALLOWED_ATTRS = {
    str: {"capitalize", "casefold", "count", "endswith", "find", "index", "isalnum", "isalpha", "isdigit",
          "islower", "isnumeric", "isspace", "isupper", "join", "lower", "lstrip", "partition", "removeprefix",
          "removesuffix", "replace", "rfind", "rindex", "rpartition", "rsplit", "rstrip", "split", "splitlines",
          "startswith", "strip", "title", "upper"},
    dict: {"get", "items", "keys", "values"},
    list: {"count", "index"},
    tuple: {"count", "index"},
    set: {"difference", "intersection", "issubset", "issuperset", "union"},
    int: {"bit_length", "is_integer"},
    float: {"is_integer"},
    bool: set(),
    type(None): set(),
}
"""Methods an expression may call, per type: reading ones (no padding methods such as
``center`` or ``zfill`` that allocate what their argument says, no ``format``)."""


def evaluate(expression: str, variables: dict, limits: dict):
    import ast

    import simpleeval

    simpleeval.MAX_POWER = limits["max_power"]
    simpleeval.MAX_STRING_LENGTH = limits["max_string"]
    simpleeval.MAX_COMPREHENSION_LENGTH = limits["max_comprehension"]

    class Evaluator(simpleeval.EvalWithCompoundTypes):
        def _eval_formattedvalue(self, node):  # f"{x}": plain values only (see _plain)
            value = _plain(self._eval(node.value))
            if node.format_spec:
                return ("{:" + self._eval(node.format_spec) + "}").format(value)
            return value

    operators = {**simpleeval.DEFAULT_OPERATORS, ast.Mod: _mod}
    evaluator = Evaluator(operators=operators, functions=dict(FUNCTIONS), names=dict(variables),
                          allowed_attrs=ALLOWED_ATTRS)
    return evaluator.eval(expression)


def main() -> None:
    request = json.loads(sys.stdin.read())
    limits = request["limits"]
    _apply_limits(limits)
    sys.set_int_max_str_digits(4300)
    try:
        value = evaluate(request["expression"], request["variables"], limits)
    except MemoryError:
        reply = {"ok": False, "kind": "memory", "error": "the expression ran out of its memory limit"}
    except RecursionError:
        reply = {"ok": False, "kind": "error", "error": "RecursionError: the expression nests too deeply"}
    except Exception as err:  # the expression's own failure, reported as data
        kind = "refused" if type(err).__name__ in ("NotAllowed", "FeatureNotAvailable", "FunctionNotDefined",
                                                   "OperatorNotDefined", "NumberTooHigh",
                                                   "IterableTooLong") else "error"
        reply = {"ok": False, "kind": kind, "error": f"{type(err).__name__}: {str(err)[:300]}"}
    else:
        try:
            text = json.dumps(value, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError, RecursionError) as err:
            reply = {"ok": False, "kind": "not_json",
                     "error": f"the value ({type(value).__name__}) is not JSON: {str(err)[:200]}"}
        else:
            if len(text) > limits["max_output_chars"]:
                reply = {"ok": False, "kind": "too_large",
                         "error": f"the value is {len(text):,} characters of JSON; at most "
                                  f"{limits['max_output_chars']:,}"}
            else:
                sys.stdout.write('{"ok": true, "value": ' + text + "}\n")
                return
    sys.stdout.write(json.dumps(reply, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
