"""Traces → one chat dataset per role, saved with ``datasets`` and described by a card.

Run it on a collection run::

    python -m heart_distill.data.build runs/<name> --out runs/<name>/datasets
    heart datasets build runs/<name> --out runs/<name>/datasets

It reads every ``<run>/traces/*.jsonl`` shard once, judges each episode when its episode
record arrives (so memory holds only episodes in flight plus the kept examples), applies
the named rules of :mod:`data.filters`, splits by task id (validation = the toolkit's dev
split; test-split tasks are never kept), and writes ``<out>/<role>/`` (a ``DatasetDict``
with ``train`` and ``validation``, ``README.md``, ``token_lengths.png``) and
``<out>/build_report.json``.

The output folder is replaced whole, never edited in place: the build writes a staging
folder beside it (roles it does not rebuild are hard-linked in from the previous build)
and swaps it in with one atomic rename, so a crash or SIGKILL mid-build leaves the previous
build complete and a half-written dataset never sits where a reader looks.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
from collections import Counter, defaultdict
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator

from heart_distill.data.filters import (
    EVENT_FILTERS,
    RULES,
    ROLES,
    EpisodeFacts,
    Example,
    balance_verdicts,
    clipped_fields,
    dedupe,
    first_failing_filter,
    is_relevance,
    judged_steps,
)
from heart.argtypes import fraction, nonnegative_int, ratio_or_none
from heart.atomic import locked, staged_dir
from heart.environments.splits import group_id, split_of
from heart.traces import TraceFormatError, TraceReadStats, read_trace

SPLIT_NAMES = ("train", "validation")
EVENT_KEYS = ("episode_id", "task_id", "env", "turn", "attempt", "step", "role", "backend",
              "messages", "raw_output", "parsed", "parse_error")
EPISODE_KEYS = ("episode_id", "task_id", "env", "success")


@dataclass
class BuildOptions:
    """How traces become role datasets."""

    verifier_balance: float | None = 1.0
    """Max ratio of majority to minority verdict in each Verifier split; None keeps all."""
    validation_fraction: float = 0.1
    """Share of task ids held out for validation when the run has no dev-split task."""
    seed: int = 0
    """Seed of the Verifier downsampling."""
    token_counter: str = "default"
    """How the card counts tokens: "default" (SmolLM2 tokenizer, else whitespace),
    "whitespace", or a tokenizer name/folder."""
    overwrite: bool = False
    """Replace role folders that already exist under the output folder."""
    roles: tuple[str, ...] = ROLES
    """Roles to build."""
    relevance_balance: float | None = None
    """Max ratio of majority to minority label among the Primitive's relevance rows in each
    split (a turn has a few tools that apply among up to 20 candidates); None keeps all."""

    def __post_init__(self) -> None:
        if self.verifier_balance is not None and not self.verifier_balance >= 1.0:
            raise ValueError(f"verifier_balance must be >= 1.0 or None, got {self.verifier_balance!r}")
        if self.relevance_balance is not None and not self.relevance_balance >= 1.0:
            raise ValueError(f"relevance_balance must be >= 1.0 or None, got {self.relevance_balance!r}")
        if not 0.0 <= self.validation_fraction < 1.0:
            raise ValueError(f"validation_fraction must be in [0, 1), got {self.validation_fraction!r}")
        unknown = set(self.roles) - set(ROLES)
        if unknown or not self.roles:
            raise ValueError(f"roles must be a non-empty subset of {ROLES}, got {self.roles!r}")
        self.roles = tuple(self.roles)


@dataclass
class BuildReport:
    """Everything numeric about one build (also written as ``build_report.json``)."""

    run_dir: str
    out_dir: str
    trace_files: list[str]
    read: dict[str, int]
    """Lines, events, episode records and torn lines read, over all shards."""
    episodes: dict[str, int]
    """Episode records, successes, episodes dropped for lack of a record, and the like."""
    validation_source: str
    """"dev_split" or "hashed_task_fraction" (the run had no dev-split task)."""
    roles: dict[str, dict[str, Any]]
    """Per role: splits, tasks, removed (per rule), verdicts, tokens, teachers."""
    token_counter: str
    options: dict[str, Any]
    collections: list[dict[str, Any]] = field(default_factory=list)
    """Each collection the run's ``manifest.json`` records: env, split, teacher and the loop
    policy its traces were made under (``policy`` None: collected before manifests held it)."""
    elapsed_s: float = 0.0
    timings_s: dict[str, float] = field(default_factory=dict)

    @property
    def empty_roles(self) -> list[str]:
        return [role for role, r in self.roles.items() if sum(r["splits"].values()) == 0]

    @property
    def all_empty(self) -> bool:
        return len(self.empty_roles) == len(self.roles)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=False) + "\n"


def features_for(role: str):
    from datasets import Features, List, Value

    columns = {
        "messages": List({"role": Value("string"), "content": Value("string")}),
        "episode_id": Value("string"),
        "task_id": Value("string"),
        "env": Value("string"),
        "teacher": Value("string"),
        "verified": Value("bool"),
        "verified_by": Value("string"),
        "turn": Value("int32"),
        "attempt": Value("int32"),
        "step": Value("int32"),
    }
    if role == "verifier":
        columns["verdict"] = Value("string")
        columns["fault_kind"] = Value("string")
        columns["executed_cleanly"] = Value("bool")
    if role == "primitive":
        columns["mode"] = Value("string")  # "call" (arguments for a request), "relevance" (does the tool apply)
        # or "messages" (what later steps need from a result)
    return Features(columns)


def to_example(event: dict[str, Any], facts: EpisodeFacts) -> Example:
    messages = [{"role": m["role"], "content": m["content"]} for m in event["messages"]]
    messages.append({"role": "assistant", "content": event["raw_output"]})
    example = {
        "messages": messages,
        "episode_id": event["episode_id"],
        "task_id": str(event["task_id"]),
        "env": event["env"],
        "teacher": event["backend"],
        # Every kept row was confirmed by the environment (a verified attempt, or a verdict
        # matching execution); the column lets unverified data be mixed in knowingly.
        "verified": True,
        # "checker": the environment's checker accepted the episode; "teacher": a task without
        # expected calls, passed in every turn by the teacher's own Verifier (counted apart in the card)
        "verified_by": facts.verified_by,
        "turn": event["turn"],
        "attempt": event["attempt"],
        "step": event["step"],
    }
    if event["role"] == "primitive":
        # "relevance", "messages" (heart.roles.primitive_messages) as traced, else "call"
        example["mode"] = "relevance" if is_relevance(event) else (event.get("extra") or {}).get("mode") or "call"
    if event["role"] == "verifier":
        example["verdict"] = facts.env_verdict(event)
        example["fault_kind"] = (event.get("extra") or {}).get("fault_kind") or ("none" if example["verdict"] == "PASS" else "unlabelled")
        # the judged steps all returned SUCCESS: a FAIL here is not visible from execution alone
        example["executed_cleanly"] = all(s["envelope"]["status"] == "SUCCESS" for s in judged_steps(event) or [])
    return example


class _Collector:
    """Judges episodes as their records arrive and keeps the surviving examples per role."""

    def __init__(self, roles: tuple[str, ...]):
        self.roles = roles
        self.pending: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.closed: set[str] = set()
        self.examples: dict[str, list[Example]] = {role: [] for role in roles}
        self.removed: dict[str, Counter] = {role: Counter() for role in ROLES}
        self.events_read: Counter = Counter()
        self.unparsed: Counter = Counter()
        """Per role, the answers that did not parse, whatever later drops them (a weak teacher's
        failures show here, not only as episodes the checker did not accept)."""
        self.episode_tasks: set[tuple[str, str]] = set()
        self.episodes: Counter = Counter()

    def add_event(self, row: dict[str, Any]) -> None:
        role = row["role"]
        if role not in ROLES:
            self.episodes["unknown_role_events"] += 1
            return
        self.events_read[role] += 1
        self.unparsed[role] += row.get("parse_error") is not None
        if row["episode_id"] in self.closed:
            self.removed[role]["event_after_episode_record"] += 1
            return
        self.pending[row["episode_id"]].append(row)

    def add_episode(self, record: dict[str, Any]) -> None:
        episode_id = record["episode_id"]
        if record.get("errored"):  # infrastructure failed: like a missing record (--resume re-runs it)
            self.episodes["errored"] += 1
            for event in self.pending.pop(episode_id, []):
                self.removed[event["role"]]["errored_episode"] += 1
            return
        if episode_id in self.closed:
            self.episodes["duplicate_records"] += 1
            return
        self.closed.add(episode_id)
        self.episodes["records"] += 1
        self.episodes["successful"] += bool(record["success"])
        self.episode_tasks.add((record["env"], str(record["task_id"])))
        events = self.pending.pop(episode_id, [])
        # the gold teacher's record that a turn needed a tool ToolFace did not retrieve
        missed = any((e.get("extra") or {}).get("retrieval_miss") for e in events)
        self.episodes["with_retrieval_miss"] += missed
        self.episodes["successful_without_retrieval_miss"] += bool(record["success"]) and not missed
        facts = EpisodeFacts.from_events(record, events)
        self.episodes["teacher_verified"] += facts.verified_by == "teacher"
        for event in events:
            role = event["role"]
            rule = first_failing_filter(event, facts)
            if rule is not None:
                self.removed[role][rule] += 1
            elif role in self.examples:
                self.examples[role].append(to_example(event, facts))

    def finish_shard(self) -> None:
        """Episodes still open at the end of a shard never wrote a record: drop and count them.

        A shard is one collection process; a resumed run re-runs such an episode from the
        start in a new shard, so its partial events must not join the new ones.
        """
        self.episodes["without_record"] += len(self.pending)
        for events in self.pending.values():
            for event in events:
                self.removed[event["role"]]["no_episode_record"] += 1
        self.pending.clear()


def _require(row: dict[str, Any], keys: tuple[str, ...], path: Path, index: int) -> None:
    missing = [key for key in keys if key not in row]
    if missing:
        raise TraceFormatError(f"{path}: row {index}: {row.get('kind', 'event')} lacks {missing}")


def _bucket(*parts: str) -> float:
    digest = hashlib.sha256("\x00".join(parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def validation_tasks_by_fraction(tasks: set[tuple[str, str]], fraction: float) -> set[tuple[str, str]]:
    """A deterministic ``fraction`` of task ids (hashed by content group, so tasks that ask
    the same thing fall on one side: :func:`heart.environments.splits.group_id`), at least
    one when there are two."""
    def bucket(task: tuple[str, str]) -> float:
        return _bucket("heart-validation", task[0], group_id(*task))

    ranked = sorted(tasks, key=bucket)
    chosen = {t for t in ranked if bucket(t) < fraction}
    if not chosen and fraction > 0 and len(ranked) >= 2:
        chosen = {ranked[0]}
    return chosen


def read_shards(files: list[Path], roles: tuple[str, ...]) -> tuple["_Collector", TraceReadStats]:
    """Read every trace shard once into a collector of ``roles``' examples; episodes are
    judged as their records arrive, and a shard's unfinished episodes are dropped at its end."""
    stats = TraceReadStats()
    collector = _Collector(roles)
    for path in files:
        for index, row in enumerate(read_trace(path, stats), start=1):
            if row.get("kind") == "episode":
                _require(row, EPISODE_KEYS, path, index)
                collector.add_episode(row)
            else:
                _require(row, EVENT_KEYS, path, index)
                collector.add_event(row)
        collector.finish_shard()
    return collector, stats


def recorded_collections(run_dir: Path) -> list[dict[str, Any]]:
    """(env, split, teacher, policy) of each collection in ``<run_dir>/manifest.json`` ([] when
    the run has no readable manifest: traces written by other tools carry none)."""
    try:
        manifest = json.loads((run_dir / "manifest.json").read_text())
        entries = manifest["collections"]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    return [{"env": e.get("env"), "split": e.get("split"), "teacher": e.get("teacher"), "policy": e.get("policy")}
            for e in entries if isinstance(e, dict)]


def build_role_datasets(run_dir: str | Path, out_dir: str | Path, options: BuildOptions | None = None) -> BuildReport:
    """Build ``<out_dir>/<role>`` for each role from ``<run_dir>/traces/*.jsonl``.

    Raises :class:`heart.traces.TraceFormatError` (naming file and line) for a trace of an
    unknown format version or a corrupt line other than a torn last one, and
    ``FileExistsError`` for existing role folders unless ``options.overwrite``.
    """
    from heart_distill.data.card import load_token_counter

    options = options or BuildOptions()
    start = time.perf_counter()
    timings: dict[str, float] = {}
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    files = sorted((run_dir / "traces").glob("*.jsonl"))
    if not files:
        raise FileNotFoundError(f"no trace files: {run_dir / 'traces'}/*.jsonl matches nothing")
    existing = [out_dir / role for role in options.roles if (out_dir / role).exists()]
    if existing and not options.overwrite:
        raise FileExistsError(f"{', '.join(map(str, existing))} already exist(s): pass overwrite")

    # 1. Read every shard once; episodes are judged as their records arrive.
    collector, stats = read_shards(files, options.roles)
    timings["read_and_filter"] = time.perf_counter() - start

    # 2. Splits by task id: the toolkit's dev split is validation when the run has any;
    # otherwise a hashed fraction of its task ids.
    split_cache: dict[tuple[str, str], str] = {}

    def toolkit_split(task: tuple[str, str]) -> str:
        if task not in split_cache:
            split_cache[task] = split_of(*task)
        return split_cache[task]

    if any(toolkit_split(t) == "dev" for t in collector.episode_tasks):
        validation_source = "dev_split"
        held_out: set[tuple[str, str]] = set()
    else:
        validation_source = "hashed_task_fraction"
        held_out = validation_tasks_by_fraction(
            {t for t in collector.episode_tasks if toolkit_split(t) == "train"},
            options.validation_fraction,
        )

    def split_for(task: tuple[str, str]) -> str | None:
        name = toolkit_split(task)
        if name == "test":
            return None
        if validation_source == "dev_split":
            return "validation" if name == "dev" else "train"
        return "validation" if task in held_out else "train"

    # 3. Per role: dedupe, split, balance; save with its card.
    t_counter = time.perf_counter()
    counter = load_token_counter(options.token_counter)
    timings["load_token_counter"] = time.perf_counter() - t_counter
    unit = "whitespace words" if counter.name.startswith("whitespace") else "tokens"
    report = BuildReport(
        run_dir=str(run_dir),
        out_dir=str(out_dir),
        trace_files=[str(p) for p in files],
        read=asdict(stats),
        episodes=dict(collector.episodes),
        validation_source=validation_source,
        roles={},
        token_counter=counter.name,
        options=asdict(options),
        collections=recorded_collections(run_dir),
    )
    report.episodes.setdefault("without_record", 0)
    context = {
        "run_dir": str(run_dir),
        "trace_files": len(files),
        "read": report.read,
        "options": report.options,
        "collections": report.collections,
        "episodes": report.episodes,
        "token_counter": counter.name,
        "validation_source_text": (
            "Validation holds the tasks of the toolkit's dev split "
            "(`heart.environments.splits.split_of`), train those of its train split."
            if validation_source == "dev_split"
            else "The run had no dev-split task, so validation holds a hashed "
            f"{options.validation_fraction:g} fraction of its train-split task ids "
            f"({len(held_out)} task(s))."
        ),
    }
    with _staged_output(out_dir, options.roles) as (staging, previous_report):
        _build_roles(options, collector, split_for, counter, unit, context, staging, report)
        # A --roles subset keeps the other roles' entries of the previous report.
        kept = {role: r for role, r in previous_report.get("roles", {}).items()
                if role not in options.roles and (staging / role).exists()}
        merged = {**kept, **report.roles}
        report.roles = {role: merged[role] for role in ROLES if role in merged}
        report.timings_s = {k: round(v, 3) for k, v in {**timings, **report.timings_s}.items()}
        report.elapsed_s = round(time.perf_counter() - start, 3)
        (staging / "build_report.json").write_text(report.to_json(), encoding="utf-8")
    return report


def _build_roles(options: BuildOptions, collector: "_Collector", split_for, counter, unit: str,
                 context: dict[str, Any], out_dir: Path, report: BuildReport) -> None:
    """Dedupe, split, balance and save each role (with its card) into ``out_dir``."""
    from datasets import DatasetDict

    from heart_distill.data.card import length_stats, quality_stats, variant_messages, write_card

    select_s = save_s = card_s = 0.0
    for role in options.roles:
        t_select = time.perf_counter()
        removed = collector.removed[role]
        examples, removed["duplicate"] = dedupe(collector.examples[role])
        by_split: dict[str, list[Example]] = {name: [] for name in SPLIT_NAMES}
        for example in examples:
            split = split_for((example["env"], example["task_id"]))
            if split is None:
                removed["test_split_task"] += 1
            else:
                by_split[split].append(example)
        balance_notes = {}
        if role == "verifier" and options.verifier_balance is not None:
            for split in SPLIT_NAMES:
                by_split[split], dropped, note = balance_verdicts(
                    by_split[split], options.verifier_balance, options.seed
                )
                removed["verifier_balance"] += dropped
                if note:
                    balance_notes[split] = note
        if role == "primitive" and options.relevance_balance is not None:
            for split in SPLIT_NAMES:
                judged = [e for e in by_split[split] if e.get("mode") == "relevance"]
                kept, dropped, _ = balance_verdicts(
                    judged, options.relevance_balance, options.seed,
                    label=lambda e: "applies" if relevance_applies(e) else "does_not_apply",
                    labels=("applies", "does_not_apply"))
                kept_ids = {id(e) for e in kept}
                by_split[split] = [e for e in by_split[split] if e.get("mode") != "relevance" or id(e) in kept_ids]
                removed["relevance_balance"] += dropped
        _refuse_clipped(role, [e for rows in by_split.values() for e in rows])
        tasks = {split: {(e["env"], e["task_id"]) for e in rows} for split, rows in by_split.items()}
        overlap = tasks["train"] & tasks["validation"]
        if overlap:  # a real check, not an assert: -O must not switch it off
            raise RuntimeError(f"{role}: task ids in both train and validation: {sorted(overlap)[:5]}")
        select_s += time.perf_counter() - t_select

        t_card = time.perf_counter()
        lengths = {split: counter.count([e["messages"] for e in rows]) for split, rows in by_split.items()}
        role_report: dict[str, Any] = {
            "splits": {split: len(rows) for split, rows in by_split.items()},
            "tasks": {split: len(t) for split, t in tasks.items()},
            "events_read": collector.events_read[role],
            "unparsed": collector.unparsed[role],
            "verified_by": dict(Counter(e["verified_by"] for rows in by_split.values() for e in rows)),
            "removed": {name: removed.get(name, 0) for name in RULES if _applies(name, role)},
            "teachers": sorted({e["teacher"] for rows in by_split.values() for e in rows}),
            "tokens": {split: length_stats(values) for split, values in lengths.items()},
        }
        everything = [e for rows in by_split.values() for e in rows]
        role_report["quality"] = quality_stats(role, everything)
        all_messages = [e["messages"] for e in everything]
        role_report["prompt_tokens"] = {
            "full system prompt, compact input": length_stats([v for vs in lengths.values() for v in vs]),
            "short system prompt, compact input": length_stats(
                counter.count([variant_messages(m, role, short=True) for m in all_messages])),
            "full system prompt, indented input (before)": length_stats(
                counter.count([variant_messages(m, role, pretty=True) for m in all_messages])),
        }
        if role == "primitive":  # relevance rows: labelled by what the verified turn used
            role_report["relevance"] = {
                split: {"applies": sum(e.get("mode") == "relevance" and relevance_applies(e) for e in rows),
                        "does_not_apply": sum(e.get("mode") == "relevance" and not relevance_applies(e) for e in rows)}
                for split, rows in by_split.items()}
        if role == "verifier":
            role_report["verdicts"] = {
                split: dict(Counter(e["verdict"] for e in rows)) for split, rows in by_split.items()
            }
            role_report["balance_notes"] = balance_notes
        card_s += time.perf_counter() - t_card

        t_save = time.perf_counter()
        role_dir = out_dir / role
        features = features_for(role)
        # datasets 5.2 writes an empty split that load_from_disk cannot read back: leave
        # empty splits out (the card still reports their zero count).
        with _quiet_progress():
            DatasetDict(
                {split: to_dataset(rows, features) for split, rows in by_split.items() if rows}
            ).save_to_disk(str(role_dir))
        save_s += time.perf_counter() - t_save

        t_card = time.perf_counter()
        write_card(role_dir, role, role_report, context, lengths, unit)
        card_s += time.perf_counter() - t_card
        report.roles[role] = role_report

    report.timings_s = {"dedupe_split_balance": select_s, "save": save_s, "card": card_s}


class ClippedTargetError(ValueError):
    """A role dataset would teach a clause cut off with "…"."""


def _refuse_clipped(role: str, examples: list[Example]) -> None:
    """Refuse to build a dataset whose targets hold a clipped clause: a student learns to
    write the fragment (:func:`heart_distill.data.filters.clipped_fields`)."""
    bad = []
    for example in examples:
        try:
            answer = json.loads(example["messages"][-1]["content"])
        except ValueError:
            continue
        fields = clipped_fields(role, answer)
        if fields:
            bad.append((example, fields, answer))
    if bad:
        example, fields, _ = bad[0]
        raise ClippedTargetError(
            f"{role}: {len(bad)} target(s) hold a cut-off clause (an ellipsis or a dangling last word) in a natural-language field "
            f"(first: {example['env']}/{example['task_id']}, field {fields[0]}); the teacher must write "
            "whole sentences")


@contextmanager
def _staged_output(out_dir: Path, rebuilt: tuple[str, ...]) -> Iterator[tuple[Path, dict[str, Any]]]:
    """Yield (staging folder, previous build report); on success the staging folder
    replaces ``out_dir`` in one atomic swap, on any failure it is removed
    (:func:`heart.atomic.staged_dir`).

    The whole build holds a file lock beside ``out_dir``, so two builds into one folder
    never interleave and leftovers of a killed build can be cleaned up safely.
    """
    out_dir = out_dir.absolute()
    with locked(out_dir), staged_dir(out_dir) as staging:
        previous: dict[str, Any] = {}
        if out_dir.exists():
            for entry in out_dir.iterdir():  # carry over what this build does not replace
                if entry.name in rebuilt or entry.name == "build_report.json":
                    continue
                if entry.is_dir():
                    shutil.copytree(entry, staging / entry.name, copy_function=_link_or_copy)
                else:
                    _link_or_copy(entry, staging / entry.name)
            report_path = out_dir / "build_report.json"
            if report_path.exists():
                try:
                    previous = json.loads(report_path.read_text(encoding="utf-8"))
                except json.JSONDecodeError:
                    previous = {}
        yield staging, previous


def _link_or_copy(src: str | Path, dst: str | Path) -> None:
    # Hard links cost nothing and are safe: a build never writes into a finished folder.
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


@contextmanager
def _quiet_progress() -> Iterator[None]:
    """No per-split "Saving the dataset" bars (eight per build); restore the caller's choice."""
    import datasets

    was_disabled = not datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if not was_disabled:
            datasets.enable_progress_bars()


def to_dataset(rows: list[Example], features):
    from datasets import Dataset

    # Column-wise: from_list([]) would lose the schema, and columns convert faster.
    return Dataset.from_dict({name: [row[name] for row in rows] for name in features},
                             features=features)


def relevance_applies(example: Example) -> bool:
    """The label of a relevance row: its assistant answer's ``applies``."""
    return bool(json.loads(example["messages"][-1]["content"]).get("applies"))


def _applies(rule: str, role: str) -> bool:
    for event_filter in EVENT_FILTERS:
        if event_filter.name == rule:
            return role in event_filter.roles
    if rule == "verifier_balance":
        return role == "verifier"
    if rule == "relevance_balance":
        return role == "primitive"
    return rule != "unknown_role"


def headline_checks(report: BuildReport) -> list[str]:
    """The four learnability checks (tools retrieved, literals grounded, targets schema-valid,
    Verifier FAILs on clean executions), over the built datasets (all splits)."""
    q = {role: r.get("quality", {}) for role, r in report.roles.items()}

    def rate(value: float | None) -> str:
        return "n/a (no examples)" if value is None else f"{100 * value:.1f}%"

    valid = {role: rate(stats.get("schema_valid_rate")) for role, stats in q.items()}
    lines = ["checks:"]
    if "planner" in q:
        lines.append(f"  planner targets using only retrieved tools: {rate(q['planner'].get('only_shown_tools_rate'))}")
    if "router" in q:
        lines.append(f"  router literal values found in the router's input: {rate(q['router'].get('grounded_rate'))}")
    lines.append("  targets valid against their serving schema: " + ", ".join(f"{r} {v}" for r, v in valid.items()))
    if "verifier" in q:
        lines.append(f"  verifier FAIL examples on steps that executed without error: "
                     f"{rate(q['verifier'].get('clean_execution_fail_rate'))} of {q['verifier'].get('fail_examples', 0)}")
        incomplete = q["verifier"].get("verdicts_by_fault_kind", {}).get("incomplete", {}).get("FAIL", 0)
        lines.append(f"  verifier task_completion FAILs of clean attempts that left the turn unfinished: {incomplete}")
    return lines


def build_flags(settings: dict[str, Any]) -> list[str]:
    """The ``heart datasets build`` flags that set ``settings`` (BuildOptions field → value;
    a pipeline recipe's ``datasets:`` section); a value at its default gives no flag.
    ValueError for a key that is not a build option or a value BuildOptions refuses."""
    flags = {"verifier_balance": "--verifier-balance", "relevance_balance": "--relevance-balance",
             "validation_fraction": "--validation-fraction", "seed": "--seed"}
    unknown = [key for key in settings if key not in flags]
    if unknown:
        raise ValueError(f"not build options: {', '.join(map(str, unknown))} (known: {', '.join(flags)})")
    BuildOptions(**settings)  # values it refuses are refused here, naming the field
    defaults = BuildOptions()
    out: list[str] = []
    for key, value in settings.items():
        if value != getattr(defaults, key):
            out += [flags[key], "none" if value is None else str(value)]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m heart_distill.data.build",
        description="Build one chat dataset per role from a run's traces.",
    )
    parser.add_argument("run_dir", help="the collection run folder (holds traces/*.jsonl)")
    parser.add_argument("--out", help="output folder (default: <run_dir>/datasets)")
    defaults = BuildOptions()  # the one declaration of each build option's default
    parser.add_argument("--verifier-balance", type=ratio_or_none, default=defaults.verifier_balance,
                        help=f"max majority/minority verdict ratio per Verifier split, or 'none' (default "
                             f"{defaults.verifier_balance})")
    parser.add_argument("--relevance-balance", type=ratio_or_none, default=defaults.relevance_balance,
                        help="max majority/minority label ratio of the Primitive's relevance rows per split, "
                             "or 'none' (default: keep all)")
    parser.add_argument("--validation-fraction", type=fraction, default=defaults.validation_fraction,
                        help="share of task ids held out when the run has no dev-split task")
    parser.add_argument("--seed", type=nonnegative_int, default=defaults.seed,
                        help="seed of the Verifier downsampling")
    parser.add_argument("--tokenizer", default="default",
                        help="'default' (SmolLM2, else whitespace), 'whitespace', or a tokenizer")
    parser.add_argument("--roles", default=",".join(ROLES), help="comma-separated roles to build")
    parser.add_argument("--overwrite", action="store_true", help="replace existing role folders")
    args = parser.parse_args(argv)

    try:
        options = BuildOptions(
            verifier_balance=args.verifier_balance,
            relevance_balance=args.relevance_balance,
            validation_fraction=args.validation_fraction,
            seed=args.seed,
            token_counter=args.tokenizer,
            overwrite=args.overwrite,
            roles=tuple(r.strip() for r in args.roles.split(",") if r.strip()),
        )
        out = Path(args.out) if args.out else Path(args.run_dir) / "datasets"
        report = build_role_datasets(args.run_dir, out, options)
    except (TraceFormatError, FileNotFoundError, FileExistsError, ValueError) as err:
        print(f"datasets build: error: {err}", file=sys.stderr)
        return 2

    print(f"read {report.read['lines']} lines from {len(report.trace_files)} file(s) "
          f"({report.read['torn_lines']} torn line(s) skipped); "
          f"{report.episodes.get('records', 0)} episodes, "
          f"{report.episodes['without_record']} without a record (dropped)")
    print(f"episodes: {report.episodes.get('successful', 0)}/{report.episodes.get('records', 0)} valid by the "
          f"checker; {report.episodes.get('with_retrieval_miss', 0)} with a retrieval miss (a gold tool not shown "
          f"to the Planner), {report.episodes.get('successful_without_retrieval_miss', 0)} valid of the others")
    print(f"validation: {report.validation_source}; token lengths counted as {report.token_counter}")
    for role, r in report.roles.items():
        counts = ", ".join(f"{split} {n}" for split, n in r["splits"].items())
        extra = ""
        if role == "verifier":
            extra = "  " + "; ".join(
                f"{split} PASS {v.get('PASS', 0)} / FAIL {v.get('FAIL', 0)}"
                for split, v in r["verdicts"].items()
            )
        print(f"  {role:<9} {counts}{'  EMPTY' if sum(r['splits'].values()) == 0 else ''}{extra}")
    for line in headline_checks(report):
        print(line)
    print(f"wrote {out}/<role> and {out / 'build_report.json'} in {report.elapsed_s:.1f} s")
    if report.all_empty:
        print("datasets build: error: every role is empty (see the removed counts in "
              f"{out / 'build_report.json'})", file=sys.stderr)
        return 1
    if report.empty_roles:
        print(f"datasets build: warning: empty role(s): {', '.join(report.empty_roles)}",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
