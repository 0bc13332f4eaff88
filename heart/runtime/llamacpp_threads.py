"""How many threads each llama.cpp engine or weight conversion of this process uses.

Its own module because both :mod:`heart.runtime.llamacpp` (the engine) and
:mod:`heart.runtime.gguf_files` (the conversion it loads from) read it.
"""

from __future__ import annotations

import os

THREADS_ENV = "HEART_LLAMACPP_THREADS"
"""Threads of each llama.cpp engine in this process when the caller names none. A program
that runs several engine processes at once (the pipeline's concurrent commands) gives each
its share of the cores here: ggml's threads spin while they wait for each other, so engines
that together hold more threads than there are cores slow each other several-fold (a
benchmark collection of five students on 2 cores ran about 5x slower than one after another)."""


def default_threads() -> int:
    """``$HEART_LLAMACPP_THREADS`` if set, else the CPUs this process may use."""
    value = os.environ.get(THREADS_ENV, "")
    if not value:
        return len(os.sched_getaffinity(0))
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{THREADS_ENV} must be a whole number of threads >= 1, got {value!r}")
    return int(value)
