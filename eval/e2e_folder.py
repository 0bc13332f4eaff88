"""The folder of one ``heart eval e2e`` side, written as episodes finish so that a killed run
can be continued (``heart eval e2e … --resume``).

- ``e2e-run.json``: what the episodes are measured with (environment, tasks, seeds, roles and
  adapters, engine, sampling, loop settings), written before the first episode runs;
- ``trace.jsonl``: every role call of each finished episode, appended when it finishes;
- ``episodes.jsonl``: one row per finished episode, appended (flushed, fsynced) right after
  its role calls: the row is what marks an episode finished;
- ``e2e.json``: the figures, written once every episode has a row (a run removes an old one
  when it starts, so figures never sit beside episodes they were not computed from).

One process writes these files (the Ray executor's workers return rows to it). Resuming reads
the finished rows back (a torn last line, left by a kill mid-write, is dropped), refuses a
folder whose ``e2e-run.json`` differs from the new run's configuration, and rewrites both
JSONL files without the episodes that will run again (errored ones: they were never scored;
role calls of an episode whose row was never written), so nothing is counted twice.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from heart.atomic import publish_text, publishing
from heart.traces import TraceFormatError, TraceReadStats, TraceWriter, read_trace

RUN = "e2e-run.json"
RESULTS = "e2e.json"
EPISODES = "episodes.jsonl"
TRACE = "trace.jsonl"
RUN_FORMAT = 3
"""Version of ``e2e-run.json``; a folder recorded in another version is not resumed (version 3
records every loop setting, :meth:`heart.settings.LoopConfig.record`)."""


def run_identity(config: Any, models: Any, task_ids: Sequence[str], harness_fingerprint: str | None) -> dict[str, Any]:
    """What decides an episode's outcome, as ``e2e-run.json`` records it: two runs with the
    same identity measure the same thing. Concurrency, the executor and the bootstrap seed
    are left out: they change when and where episodes run, not what they measure."""
    identity = {
        "format": RUN_FORMAT, "env": config.env, "category": config.category, "split": config.split,
        **({"tasks_file": config.tasks_file, "tools": config.tools} if config.tasks_file else {}),
        "tasks": list(task_ids), "seeds": list(config.seeds),
        "roles": models.spec, "model": models.model, "teacher": models.teacher,
        "adapters": {role: {"path": path, "manifest": models.manifests.get(role, {})}
                     for role, path in sorted(models.adapters.items())},
        "short_prompts": sorted(models.short_prompts), "engine": config.engine,
        "temperature": config.temperature, "max_new_tokens": config.max_new_tokens,
        **{f"loop.{k}": v for k, v in config.loop.record().items()},
        "harness": config.harness, "harness_fingerprint": harness_fingerprint,
    }
    return json.loads(json.dumps(identity, default=str))  # as it reads back from the file


def _short(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 120 else text[:117] + "..."


def read_rows(path: Path) -> tuple[list[dict[str, Any]], int]:
    """(the rows of an ``episodes.jsonl``, torn last lines dropped). A torn last line is a
    row cut short by a kill; a malformed line anywhere else is corruption: ValueError."""
    if not path.exists():
        return [], 0
    lines = path.read_bytes().splitlines(keepends=True)  # bytes: a kill may tear a character too
    rows: list[dict[str, Any]] = []
    torn = 0
    for index, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        if not isinstance(row, dict) or not {"task_id", "seed", "errored"} <= row.keys():
            if index == len(lines) - 1:
                torn += 1
                continue
            raise ValueError(f"{path}:{index + 1}: not an episode row; move the file aside to run every "
                             "episode again, or choose another --out")
        rows.append(row)
    return rows, torn


@dataclass
class Resumption:
    """What an earlier, interrupted run of one side left in its folder."""

    out: Path
    rows: list[dict[str, Any]] = field(default_factory=list)
    """Finished episodes kept (not errored, one per (task, seed) of this run)."""
    trace: list[dict[str, Any]] = field(default_factory=list)
    """Their role calls and episode records."""
    torn_lines: int = 0
    errored_rerun: int = 0
    """Errored episodes dropped: they run again."""
    rewrite: bool = False
    """Whether the files hold anything beyond ``rows`` and ``trace`` (rewritten before the run)."""
    fresh: bool = False
    """Nothing to resume (no earlier run in the folder): the run starts from scratch."""
    backend: str | None = None
    """The backend the kept episodes' records name."""

    @property
    def finished(self) -> set[tuple[str, int]]:
        return {(row["task_id"], int(row["seed"])) for row in self.rows}

    def summary(self) -> dict[str, int]:
        return {"episodes_kept": len(self.rows), "errored_rerun": self.errored_rerun, "torn_lines": self.torn_lines}

    def compact(self) -> None:
        """Rewrite the folder's JSONL files to hold only the kept episodes (each file replaced
        in one rename: a kill leaves the old file or the new one)."""
        if self.fresh or not self.rewrite:
            return
        for name, items in ((TRACE, self.trace), (EPISODES, self.rows)):
            with publishing(self.out / name) as tmp:
                tmp.write_text("".join(json.dumps(item, ensure_ascii=False, default=repr) + "\n" for item in items),
                               encoding="utf-8")


def read_resumption(out: Path, identity: dict[str, Any], jobs: Iterable[tuple[str, int]]) -> Resumption:
    """The finished episodes in ``out`` that a run with ``identity`` keeps. Reads only:
    ValueError when the folder was run with another configuration or is corrupt."""
    rows, torn = read_rows(out / EPISODES)
    if not (out / RUN).exists():
        if rows:
            raise ValueError(f"--resume: {out} holds episodes but no {RUN} saying what they were run with; "
                             "rerun without --resume (its episodes are replaced) or choose another --out")
        return Resumption(out, torn_lines=torn, fresh=True)
    try:
        recorded = json.loads((out / RUN).read_text())
    except ValueError as err:
        raise ValueError(f"--resume: {out / RUN} is not valid JSON ({err})") from None
    differ = sorted(k for k in identity.keys() | recorded.keys() if recorded.get(k) != identity.get(k))
    if differ:
        detail = "; ".join(f"{k}: {_short(recorded.get(k))} there, {_short(identity.get(k))} now" for k in differ)
        raise ValueError(f"--resume: {out} was run with a different configuration ({detail}); use the same "
                         "options, or rerun without --resume (its episodes are replaced), or choose another --out")
    wanted = {(str(task), int(seed)) for task, seed in jobs}
    kept: dict[tuple[str, int], dict[str, Any]] = {}
    errored = 0
    for row in rows:
        key = (row["task_id"], int(row["seed"]))
        if row["errored"]:
            errored += 1
        elif key in wanted:
            kept.setdefault(key, row)
    trace: list[dict[str, Any]] = []
    stats = TraceReadStats()
    if (out / TRACE).exists():
        try:
            every = list(read_trace(out / TRACE, stats))
        except TraceFormatError as err:
            raise ValueError(f"--resume: {err}; move the file aside to run every episode again") from None
        # an episode's role calls share its episode id; its record (written last) says which (task, seed) it is
        ids = {row["episode_id"] for row in every if row.get("kind") == "episode"
               and (row.get("task_id"), int(row.get("seed", -1))) in kept}
        trace = [row for row in every if row.get("episode_id") in ids]
        trace_dropped = len(every) - len(trace)
    else:
        trace_dropped = 0
    backend = next((row.get("backend") for row in reversed(trace) if row.get("kind") == "episode"), None)
    return Resumption(out, list(kept.values()), trace, torn, errored, backend=backend,
                      rewrite=bool(torn or stats.torn_lines or trace_dropped or len(kept) != len(rows)))


class EpisodeFiles:
    """Appends one side's finished episodes: role calls to ``trace.jsonl``, then the row to
    ``episodes.jsonl``. ``fresh`` replaces what the folder held; otherwise the files (already
    compacted by :meth:`Resumption.compact`) are appended to."""

    def __init__(self, out: Path, fresh: bool):
        if fresh:
            for name in (EPISODES, TRACE):
                (out / name).unlink(missing_ok=True)
        # The row is fsynced (it marks the episode finished); role calls are flushed, which a
        # killed process cannot lose: only a power cut could leave a row without its calls.
        self.trace = TraceWriter(out / TRACE, fsync=False)
        self.episodes = TraceWriter(out / EPISODES)

    def write(self, row: dict[str, Any], events: list[dict[str, Any]]) -> None:
        for event in events:
            self.trace.write(event)
        self.episodes.write(row)

    def close(self) -> None:
        self.trace.close()
        self.episodes.close()


def start(out: Path, identity: dict[str, Any]) -> None:
    """Record what this run measures and remove figures a previous run left."""
    out.mkdir(parents=True, exist_ok=True)
    publish_text(out / RUN, json.dumps(identity, indent=2) + "\n")
    (out / RESULTS).unlink(missing_ok=True)

