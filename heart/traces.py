"""Trace events: one JSON line per role call, and an episode record closing each episode.

The file is append-only and flushed per event, so a killed run loses at most the line it
was writing. Readers tolerate (and count) a torn last line, and refuse files written in a
format version they do not know. A writer that appends to an existing file first cuts off
such a torn last line, so that the next line does not turn it into mid-file corruption; one
writer may be shared by threads (each line is written whole, under a lock).
"""

from __future__ import annotations

import json
import os
import sys
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator

TRACE_FORMAT_VERSION = 1


@dataclass
class TraceEvent:
    """One role call, exactly as it happened."""

    episode_id: str
    task_id: str
    env: str
    turn: int
    """Index of the user turn within the episode (multi-turn benchmarks have several)."""
    attempt: int
    """Re-plan round within the turn: 0 for the first plan, b for the b-th re-plan."""
    step: int | None
    """Plan step this call serves (Router/Primitive), or None for Planner/Verifier calls."""
    role: str
    backend: str
    adapter: str | None
    messages: list[dict[str, str]]
    raw_output: str
    parsed: dict[str, Any] | None
    parse_error: str | None
    latency_s: float
    prompt_tokens: int
    completion_tokens: int
    extra: dict[str, Any] = field(default_factory=dict)
    """Role-specific facts that are not model output: e.g. the Primitive's execution envelope."""
    errored: bool = False
    """True when the backend raised instead of answering: no model output to learn from or
    to blame (the episode ends errored)."""
    kind: str = "event"
    version: int = TRACE_FORMAT_VERSION


@dataclass
class EpisodeRecord:
    """Closes an episode: what the loop concluded and what the environment's checker said."""

    episode_id: str
    task_id: str
    env: str
    score: float
    """The environment's own score: 1.0 when its checker accepts the episode."""
    success: bool
    verdicts: list[str]
    """Final Verifier verdict per turn (PASS, FAIL, or ERROR when no verdict was parsed)."""
    replans_used: list[int]
    """Re-plans spent per turn (≤ B each)."""
    checker: dict[str, Any] = field(default_factory=dict)
    """The checker's own details (error messages, types)."""
    backend: str = ""
    seed: int = 0
    wall_s: float = 0.0
    errored: bool = False
    """True when infrastructure failed (a backend exception, an out-of-memory, a checker
    crash): the episode says nothing about the model and is counted apart, never as a
    failure."""
    error: str | None = None
    """What failed, when ``errored``."""
    reused_steps: int = 0
    """Steps served the envelope of an earlier execution of the same call in their turn
    instead of running (:mod:`heart.ledger`), over all turns."""
    passed_steps_reexecuted: int = 0
    """Executions repeating a call its turn had already run with SUCCESS and the Verifier
    passed (0 by construction: the ledger reuses it)."""
    state_changing_executed_twice: int = 0
    """Executions repeating a state-changing call that had succeeded in the same turn (0 by
    construction: the ledger reuses it)."""
    tools_refused: list[dict[str, str]] = field(default_factory=list)
    """Tool documents the episode's ToolFace refused at registration (registry provenance,
    :mod:`heart.provenance`): ``{tool, sha256, reason}`` each; they were never shown or run."""
    provenance_violations: int = 0
    """Calls not run because their tool's document changed after registration (envelopes with
    failure type PROVENANCE_VIOLATION), over all turns."""
    kind: str = "episode"
    version: int = TRACE_FORMAT_VERSION


class TraceFormatError(ValueError):
    """A trace line that is not a trace of a format version this reader knows."""


class TraceWriter:
    """Appends events and records to a JSONL file, flushing (and fsyncing) each line.

    ``exclusive=True`` creates the file and refuses one that exists (a collection shard
    belongs to one run). Otherwise an existing file is appended to, after cutting off a
    torn last line left by a killed writer (``dropped_torn_bytes`` says how much).
    """

    def __init__(self, path: str | os.PathLike, fsync: bool = True, exclusive: bool = False):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.dropped_torn_bytes = 0 if exclusive else _cut_torn_tail(self.path)
        self._file = open(self.path, "x" if exclusive else "a", encoding="utf-8")
        self._fsync = fsync
        self._lock = threading.Lock()

    def write(self, item: TraceEvent | EpisodeRecord | dict[str, Any]) -> None:
        row = item if isinstance(item, dict) else asdict(item)
        # A value JSON cannot encode (a tool's set, a custom object) is recorded as its
        # repr: losing its type beats losing the episode.
        line = json.dumps(row, ensure_ascii=False, default=repr) + "\n"
        with self._lock:
            self._file.write(line)
            self._file.flush()
            if self._fsync:
                os.fsync(self._file.fileno())

    def close(self) -> None:
        with self._lock:
            self._file.close()

    def __enter__(self) -> "TraceWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _cut_torn_tail(path: Path) -> int:
    """Make ``path`` end with a newline before appending; return the bytes cut off.

    A last line without a newline is a write cut short by a kill, unless it parses as a
    whole JSON object (a hand-edited file): that one is kept and completed.
    """
    if not path.exists() or path.stat().st_size == 0:
        return 0
    with open(path, "rb+") as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return 0
        start = size
        while start > 0:  # find the last newline, reading backwards in blocks
            block = min(65536, start)
            f.seek(start - block)
            chunk = f.read(block)
            cut = chunk.rfind(b"\n")
            if cut >= 0:
                start = start - block + cut + 1
                break
            start -= block
        f.seek(start)
        tail = f.read()
        try:
            whole = isinstance(json.loads(tail), dict)
        except ValueError:
            whole = False
        if whole:
            f.write(b"\n")
            return 0
        f.truncate(start)
    print(f"trace: {path}: cut off a torn last line ({size - start} bytes) left by an "
          "interrupted writer", file=sys.stderr)
    return size - start


@dataclass
class TraceReadStats:
    lines: int = 0
    events: int = 0
    episodes: int = 0
    torn_lines: int = 0
    """Lines that did not parse as JSON: only a torn last line is tolerated."""


def read_trace(path: str | os.PathLike, stats: TraceReadStats | None = None) -> Iterator[dict[str, Any]]:
    """Yield each row of a trace file as a dict.

    A torn *last* line (a write cut short by a kill) is skipped and counted in ``stats``; a
    malformed line anywhere else is corruption and raises. Rows of an unknown format
    version raise :class:`TraceFormatError`.
    """
    stats = stats if stats is not None else TraceReadStats()
    with open(path, "rb") as f:  # bytes: a kill may tear a multi-byte character too
        lines = f.readlines()
    for index, line in enumerate(lines):
        if not line.strip():
            continue
        stats.lines += 1
        torn_candidate = index == len(lines) - 1 and not line.endswith(b"\n")
        try:
            row = json.loads(line)
        except ValueError as err:  # JSONDecodeError, or UnicodeDecodeError of a torn character
            if torn_candidate or index == len(lines) - 1:
                stats.torn_lines += 1
                continue
            raise TraceFormatError(f"{path}:{index + 1}: malformed trace line ({err})") from err
        if not isinstance(row, dict):
            if torn_candidate:  # e.g. a line cut down to its first number
                stats.torn_lines += 1
                continue
            raise TraceFormatError(f"{path}:{index + 1}: a trace line must be a JSON object, "
                                   f"got {type(row).__name__} (not a JSON object)")
        version = row.get("version")
        if version != TRACE_FORMAT_VERSION:
            raise TraceFormatError(
                f"{path}:{index + 1}: trace format version {version!r} is not supported "
                f"(this reader knows version {TRACE_FORMAT_VERSION})"
            )
        if row.get("kind") == "episode":
            stats.episodes += 1
        else:
            stats.events += 1
        yield row
