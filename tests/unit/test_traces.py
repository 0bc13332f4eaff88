"""Trace files: append-only writing, torn-line tolerance, version check."""

from __future__ import annotations

import json

import pytest

from heart.traces import (
    TRACE_FORMAT_VERSION,
    EpisodeRecord,
    TraceEvent,
    TraceFormatError,
    TraceReadStats,
    TraceWriter,
    read_trace,
)


def event(i: int) -> TraceEvent:
    return TraceEvent(
        episode_id="ep", task_id="t0", env="toy", turn=0, attempt=0, step=i, role="router",
        backend="scripted", adapter=None,
        messages=[{"role": "system", "content": "s"}, {"role": "user", "content": f"u{i}"}],
        raw_output="{}", parsed={}, parse_error=None, latency_s=0.0, prompt_tokens=2,
        completion_tokens=1,
    )


def write(path, n: int = 3) -> None:
    with TraceWriter(path, fsync=False) as writer:
        for i in range(n):
            writer.write(event(i))
        writer.write(EpisodeRecord(episode_id="ep", task_id="t0", env="toy", score=1.0,
                                   success=True, verdicts=["PASS"], replans_used=[0]))


def test_round_trip_counts_events_and_episodes(tmp_path):
    path = tmp_path / "traces" / "shard.jsonl"
    write(path)
    stats = TraceReadStats()
    rows = list(read_trace(path, stats))
    assert [r["kind"] for r in rows] == ["event"] * 3 + ["episode"]
    assert rows[1]["messages"][1]["content"] == "u1"
    assert (stats.lines, stats.events, stats.episodes, stats.torn_lines) == (4, 3, 1, 0)


def test_torn_last_line_is_skipped_and_counted(tmp_path):
    path = tmp_path / "t.jsonl"
    write(path)
    with open(path, "a") as f:
        f.write(json.dumps({"kind": "event", "version": TRACE_FORMAT_VERSION})[:17])  # killed mid-write
    stats = TraceReadStats()
    assert len(list(read_trace(path, stats))) == 4
    assert stats.torn_lines == 1


def test_torn_middle_line_is_corruption(tmp_path):
    path = tmp_path / "t.jsonl"
    write(path)
    lines = path.read_text().splitlines()
    lines[1] = lines[1][:20]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceFormatError, match=r"t\.jsonl:2: malformed"):
        list(read_trace(path))


def test_unknown_version_names_file_and_line(tmp_path):
    path = tmp_path / "future.jsonl"
    write(path, n=1)
    with open(path, "a") as f:
        f.write(json.dumps({**json.loads(path.read_text().splitlines()[0]), "version": 99}) + "\n")
    with pytest.raises(TraceFormatError, match=r"future\.jsonl:3: trace format version 99"):
        list(read_trace(path))
