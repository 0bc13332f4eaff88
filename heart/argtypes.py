"""Argparse types that check a number's range at parse time.

Every numeric option of the ``heart`` command and of the parsers it forwards to uses one of
these, so a value out of range ends in argparse's own one-line error and exit status 2::

    heart collect: error: argument --concurrency: must be > 0, got 0

instead of a traceback deep inside a thread pool, or a silent surprise (``--limit -3``
slicing off the last three tasks). They raise :class:`argparse.ArgumentTypeError`, whose
message argparse prints as is after the option's name.
"""

from __future__ import annotations

import argparse
import math


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None


def _float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """An integer > 0 (a count of things that must exist: workers, tasks, tokens)."""
    value = _int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def nonnegative_int(text: str) -> int:
    """An integer >= 0 (a budget that may be zero, a seed, an index)."""
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def nonnegative_float(text: str) -> float:
    """A finite number >= 0 (a sampling temperature)."""
    value = _float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value:g}")
    return value


def probability(text: str) -> float:
    """A number within [0, 1] (a rate)."""
    value = _float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be within [0, 1], got {value:g}")
    return value


def fraction(text: str) -> float:
    """A number within [0, 1) (a share to hold out: possibly none, never all)."""
    value = _float(text)
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"must be within [0, 1), got {value:g}")
    return value


def ratio_or_none(text: str) -> float | None:
    """A ratio >= 1 (largest / smallest class), or ``none`` for no limit (None)."""
    if text.strip().lower() == "none":
        return None
    value = _float(text)
    if value < 1.0:
        raise argparse.ArgumentTypeError(f"must be >= 1 or 'none', got {value:g}")
    return value


def port(text: str) -> int:
    """A TCP port to listen on: 1 to 65535."""
    value = _int(text)
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a TCP port within [1, 65535], got {value}")
    return value
