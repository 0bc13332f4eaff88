"""Trace events: one JSON line per role call, and an episode record closing each episode.

The file is append-only and flushed per event, so a killed run loses at most the line it
was writing. Readers tolerate (and count) a torn last line, and refuse files written in a
format version they do not know.
"""

from __future__ import annotations

import json
import os
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
    kind: str = "episode"
    version: int = TRACE_FORMAT_VERSION


class TraceFormatError(ValueError):
    """A trace line that is not a trace of a format version this reader knows."""


class TraceWriter:
    """Appends events and records to a JSONL file, flushing (and fsyncing) each line."""

    def __init__(self, path: str | os.PathLike, fsync: bool = True):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")
        self._fsync = fsync

    def write(self, item: TraceEvent | EpisodeRecord | dict[str, Any]) -> None:
        row = item if isinstance(item, dict) else asdict(item)
        self._file.write(json.dumps(row, ensure_ascii=False) + "\n")
        self._file.flush()
        if self._fsync:
            os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> "TraceWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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
    with open(path, encoding="utf-8") as f:
        lines = f.readlines()
    for index, line in enumerate(lines):
        if not line.strip():
            continue
        stats.lines += 1
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            if index == len(lines) - 1:
                stats.torn_lines += 1
                continue
            raise TraceFormatError(f"{path}:{index + 1}: malformed trace line ({err})") from err
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
