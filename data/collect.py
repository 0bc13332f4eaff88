"""Collection: run the HEART loop with a teacher over an environment's tasks, tracing everything.

    heart collect --env bfcl --split train --teacher gold --out runs/bfcl-gold
    heart collect --env bfcl --category multi_turn_miss_param --split train --teacher gold --out runs/bfcl-gold

Episodes run concurrently (bounded), each with its own environment session and teacher; an
in-process ``hf:`` teacher is shared through a batching scheduler, so concurrent episodes'
role calls decode together as mixed-role batches (heart/runtime/scheduler.py).
Every process writes its own trace shard, named uniquely (time, pid, random) and created
exclusively, so a killed run never leaves a half-written episode inside a shard that a
later run appends to; ``--resume`` skips episodes whose record is already written (episode
ids are deterministic from task id + seed + teacher) and the dataset builder ignores an
episode whose record is missing from its shard. An *errored* episode (infrastructure
failure: a backend exception, a checker crash, a tool call abandoned on timeout) is
recorded and counted apart; ``--resume`` runs it again. ``manifest.json`` is updated under
a file lock and replaced atomically, so concurrent collections into one folder lose nothing.

``--executor ray`` runs the same episodes on Ray Data actors (:mod:`heart_distill.executors`):
the jobs are cut into shards of ``--shard-size``, each run by a :class:`CollectionWorker` into
its own trace shard under the same rules, so either executor resumes what the other began
(``--out`` must then be a folder every Ray node sees).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import hashlib
import json
import os
import platform
import secrets
import sys
import time
from importlib import metadata
from dataclasses import asdict, dataclass
from pathlib import Path

from heart.atomic import publish_text
from heart.embeddings import Embedder
from heart.environments import load_environment
from heart.episode import episode_id, run_episode
from heart.loop import LoopConfig
from heart.settings import POLICY
from heart.traces import TraceFormatError, TraceReadStats, TraceWriter, read_trace
from heart.user_errors import UserError
from heart_distill.arguments import collect_arguments as add_arguments, loop_settings
from heart_distill.data.teachers import TeacherFactory
from heart_distill.executors import ExecutorError, connect_ray, options_from_args, run_jobs, shards

MANIFEST = "manifest.json"


def _versions() -> dict[str, str]:
    names = ["heart-distill", "bfcl-eval", "agentdojo", "transformers", "peft", "trl", "torch", "datasets"]
    found = {}
    for name in names:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return found


def finished_episodes(out: Path) -> set[str]:
    """Episode ids whose episode record is already written in some shard (errored ones are
    not finished: a resumed collection runs them again).

    Raises SystemExit naming the file and line when a shard is corrupt.
    """
    done: set[str] = set()
    for shard in sorted((out / "traces").glob("*.jsonl")):
        stats = TraceReadStats()
        try:
            done |= {row["episode_id"] for row in read_trace(shard, stats)
                     if row.get("kind") == "episode" and not row.get("errored")}
        except (TraceFormatError, KeyError) as err:
            raise SystemExit(f"error: cannot resume from {out}: {err}; move the corrupt shard aside "
                             "(its episodes will run again) or collect into another --out") from None
    return done


def finished_records(shards: list[Path]) -> dict[str, tuple[Path, dict]]:
    """Episode id → (shard, record) of the episodes finished (not errored) in ``shards``."""
    found: dict[str, tuple[Path, dict]] = {}
    for shard in shards:
        for row in read_trace(shard):
            if row.get("kind") == "episode" and not row.get("errored"):
                found.setdefault(row["episode_id"], (shard, row))
    return found


def new_shard_path(traces: Path, tag: str | None = None) -> Path:
    """A shard name no other run has used: UTC time (names sort by start), pid, randomness,
    and the ``tag`` of a Ray shard (its run and index: every attempt at it carries the same)."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    suffix = f"-{tag}" if tag else ""
    return traces / f"shard-{stamp}-{os.getpid()}-{secrets.token_hex(4)}{suffix}.jsonl"


def _label(args: argparse.Namespace) -> str:
    """The collection as messages name it: env[/category]/split."""
    return "/".join([args.env, *([args.category] if args.category else []), args.split])


def _refuse(message: str) -> None:
    """Bad input: the message on stderr, exit status 2."""
    print(message, file=sys.stderr)
    raise SystemExit(2)


def _loop_config(args: argparse.Namespace) -> LoopConfig:
    """How the teacher's episodes run: the loop-policy flags over the loop's defaults."""
    return LoopConfig(**loop_settings(args, POLICY))


def _write_manifest(out: Path, args: argparse.Namespace, teacher: TeacherFactory, task_ids: list[str]) -> None:
    """Record this collection in ``manifest.json``: one entry per (env, split, teacher).

    A run folder may hold several collections (e.g. BFCL and AgentDojo train splits, built
    into one set of role datasets). Each entry records the loop policy its traces were made
    under (``policy``: :meth:`heart.settings.LoopConfig.record` of :data:`heart.settings.POLICY`,
    files named with their content hash), so
    the datasets built from it can say so; resuming one must use the settings and the policy
    it started with (exit 2 naming what differs), or its traces would mix two policies.
    The read-modify-write holds a file lock (other processes and threads) and the new file
    replaces the old by an atomic rename (a reader never sees half a manifest).
    """
    from filelock import FileLock

    entry = {
        "env": args.env,  # (multi_turn_base is BFCL's default: its entries name no category)
        **({"category": args.category} if args.category not in (None, "multi_turn_base") else {}),
        **({"tasks_file": args.tasks, "tasks_sha256": hashlib.sha256(Path(args.tasks).read_bytes()).hexdigest(),
            "tools": args.tools} if args.tasks else {}),
        "split": args.split, "teacher": teacher.name, "teacher_spec": args.teacher,
        "fault_rate": args.fault_rate, **({"student": args.student, "student_rate": args.student_rate}
                                          if args.student else {}),
        "seeds": args.seeds, "policy": _loop_config(args).record(POLICY),
        "limit": args.limit, "tasks": len(task_ids), "episodes": len(task_ids) * len(args.seeds),
        "python": platform.python_version(), "packages": _versions(), "runs": 1,
    }
    path = out / MANIFEST
    with FileLock(str(path) + ".lock"):
        try:
            manifest = json.loads(path.read_text()) if path.exists() else {"collections": []}
        except json.JSONDecodeError as err:
            raise SystemExit(f"error: {path} is not valid JSON ({err}); restore it or choose another --out") from None
        for old in manifest["collections"]:
            # (one collection per category: a BFCL entry without one is multi_turn_base's)
            if (old["env"], old.get("category"), old["split"], old["teacher"]) == \
                    (entry["env"], entry.get("category"), entry["split"], entry["teacher"]):
                if "policy" not in old:
                    _refuse(f"error: {out} holds {_label(args)} with {teacher.name} collected before "
                            "manifests recorded the loop policy: its traces' policy is unknown, so new episodes "
                            "could mix with them; collect into another --out")
                changed = [f"{k}: {old.get(k)} there, {entry[k]} now" for k in ("seeds", "limit")
                           if old.get(k) != entry[k]]
                changed += [f"{k}: {old['policy'].get(k)} there, {entry['policy'][k]} now"
                            for k in sorted(old["policy"].keys() | entry["policy"].keys())
                            if old["policy"].get(k) != entry["policy"].get(k)]
                if changed:
                    _refuse(f"error: {out} holds {_label(args)} with {teacher.name} collected with other "
                            f"settings ({'; '.join(changed)}); use the same settings or another --out")
                if not args.resume:
                    raise SystemExit(f"error: {out} already holds {_label(args)} with {teacher.name}; "
                                     f"pass --resume to continue it or choose another --out")
                old["runs"] = old.get("runs", 1) + 1
                break
        else:
            manifest["collections"].append(entry)
        publish_text(path, json.dumps(manifest, indent=2) + "\n")


@dataclass(frozen=True)
class CollectionSpec:
    """What a :class:`CollectionWorker` is built from, in whichever process runs it (picklable)."""

    env: str
    teacher: str
    fault_rate: float
    quantize: str | None
    max_batch_size: int
    loop: LoopConfig
    out: str
    concurrency: int
    """Episodes one worker runs at once (threads)."""
    run: str
    """Random token of this run: names its Ray shards' trace files, so a retried shard finds
    what its earlier attempt finished."""
    category: str | None = None
    """The BFCL category (None: the environment's default, multi_turn_base)."""
    tasks: str | None = None
    """``custom``: the tasks file."""
    tools: str | None = None
    """``custom``: where its tools come from (:func:`heart.environments.custom_environment`)."""
    student: str | None = None
    """The gold teacher's student (natural faults): ``base`` or an adapters folder."""
    student_rate: float = 0.0
    student_engine: str = "llamacpp:f16"

    def teacher_factory(self, environment) -> TeacherFactory:
        return TeacherFactory(self.teacher, self.fault_rate, environment, quantize=self.quantize,
                              max_batch_size=self.max_batch_size, student=self.student,
                              student_rate=self.student_rate, student_engine=self.student_engine)


class CollectionWorker:
    """Runs shards of (task id, seed) episodes with one environment and one teacher, each
    shard into a trace shard of its own, created exclusively (:mod:`heart_distill.executors`).

    Under Ray a shard's trace file carries ``<run>-<shard index>`` in its name. Ray runs a
    shard again when the actor running it died; the new attempt reads the episode records its
    earlier attempts wrote, reports them instead of running them again, and writes the rest
    into a new file: no episode lost or written twice, and the dead attempt's unfinished
    episode (events without a record) is dropped by the dataset builder as after any kill.
    """

    def __init__(self, spec: CollectionSpec, environment=None, teacher: TeacherFactory | None = None):
        self.spec = spec
        self.environment = environment or load_environment(spec.env, spec.category, spec.tasks, spec.tools)
        self.teacher = teacher or spec.teacher_factory(self.environment)
        self.traces = Path(spec.out) / "traces"

    def run_shard(self, shard_index: int | None, jobs: list, report) -> None:
        tag = None if shard_index is None else f"{self.spec.run}-{shard_index:05d}"
        jobs = [(str(task_id), int(seed)) for task_id, seed in jobs]
        if tag is not None:
            earlier = finished_records(sorted(self.traces.glob(f"shard-*-{tag}.jsonl")))
            for path, record in earlier.values():
                report({"shard": str(path), "record": record})
            jobs = [(t, s) for t, s in jobs
                    if episode_id(self.spec.env, t, s, self.teacher.name) not in earlier]
        if not jobs:
            return
        # Embed every query of the shard in one batch: one batched pass is far cheaper than
        # one model call per turn, and ToolFace then finds each query in the embedding cache.
        Embedder().embed(sorted({q for tid, _ in jobs for q in self.environment.load_task(tid).turns}))
        shard = new_shard_path(self.traces, tag)

        def one(job):
            task_id, seed = job
            task = self.environment.load_task(task_id)
            with self.teacher.client():
                return run_episode(self.environment, task, self.teacher(task, seed), config=self.spec.loop,
                                   trace=writer, seed=seed)

        with TraceWriter(shard, exclusive=True) as writer, \
                concurrent.futures.ThreadPoolExecutor(max_workers=self.spec.concurrency) as pool:
            futures = {pool.submit(one, job): job for job in jobs}
            for future in concurrent.futures.as_completed(futures):
                try:
                    record = asdict(future.result().record)
                except Exception as err:  # reported as errored: --resume runs it again
                    task_id, seed = futures[future]
                    record = {"raised": True, "errored": True, "task_id": task_id, "seed": seed,
                              "error": f"{type(err).__name__}: {err}"}
                report({"shard": str(shard), "record": record})


def collect(args: argparse.Namespace) -> int:
    out = Path(args.out)
    try:
        executor = options_from_args(args)
        if executor.kind == "ray":  # before anything is written: an unreachable cluster changes nothing
            connect_ray(executor.address)
    except ValueError as err:
        raise SystemExit(f"error: {err}") from None
    except ExecutorError as err:
        raise SystemExit(f"error: --executor ray: {err}") from None
    try:
        environment = load_environment(args.env, args.category, args.tasks, args.tools)
    except ValueError as err:
        _refuse(f"error: {err}")
    except UserError as err:  # a tasks file or a tool that cannot be read, named
        _refuse(f"error: {err}")

    config = _loop_config(args)
    config.check_files(environment.catalog())
    spec = CollectionSpec(env=args.env, teacher=args.teacher, fault_rate=args.fault_rate, quantize=args.quantize,
                          max_batch_size=args.max_batch_size, loop=config, out=str(out),
                          concurrency=args.concurrency, run=secrets.token_hex(4), category=args.category,
                          tasks=args.tasks, tools=args.tools,
                          student=args.student, student_rate=args.student_rate, student_engine=args.student_engine)
    try:
        teacher = spec.teacher_factory(environment)
    except (ValueError, FileNotFoundError, UserError) as err:
        raise SystemExit(f"error: --teacher: {err}") from None
    task_ids = environment.task_ids(args.split)
    if args.limit:
        task_ids = task_ids[: args.limit]
    out.mkdir(parents=True, exist_ok=True)
    _write_manifest(out, args, teacher, task_ids)

    done = finished_episodes(out)
    wanted = [(tid, seed) for seed in args.seeds for tid in task_ids]
    jobs = [(tid, seed) for tid, seed in wanted if episode_id(args.env, tid, seed, teacher.name) not in done]
    if not jobs:  # a finished collection: nothing to embed, no empty shard
        print(f"collect: {_label(args)} with {teacher.name}: all {len(wanted)} episodes "
              f"already done in {out}; nothing to run", file=sys.stderr)
        return 0
    (out / "traces").mkdir(exist_ok=True)
    where = (f"a new shard in {out / 'traces'}" if executor.kind == "local" else
             f"{len(shards(jobs, executor.shard_size))} shards of <= {executor.shard_size} on "
             f"{executor.workers} Ray workers")
    print(f"collect: {_label(args)} with {teacher.name}: {len(wanted)} episodes, "
          f"{len(wanted) - len(jobs)} already done, {len(jobs)} to run → {where}", file=sys.stderr)

    from heart.progress import progress_bar

    stats = {"ok": 0, "n": 0, "replans": 0, "recovered": 0, "errored": 0, "reused_steps": 0,
             "passed_steps_reexecuted": 0, "state_changing_executed_twice": 0}
    written: set[str] = set()

    with progress_bar(total=len(jobs), unit="ep", desc=f"collect {args.env}") as bar:
        def report(result: dict) -> None:
            written.add(result["shard"])
            record = result["record"]
            if record.get("raised"):  # one broken episode never stops the collection (--resume retries it)
                stats["errored"] += 1
                print(f"collect: episode failed: {record['error']}", file=sys.stderr)
            elif record["errored"]:  # infrastructure, not the teacher: counted apart, retried on --resume
                stats["errored"] += 1
                print(f"collect: episode {record['task_id']} errored: {record['error']}", file=sys.stderr)
            else:
                stats["n"] += 1
                stats["ok"] += record["success"]
                stats["replans"] += sum(record["replans_used"])
                stats["recovered"] += sum(1 for v, r in zip(record["verdicts"], record["replans_used"])
                                          if v == "PASS" and r > 0)
                for name in ("reused_steps", "passed_steps_reexecuted", "state_changing_executed_twice"):
                    stats[name] += record[name]
            bar.update(1)  # the bar shows episodes/s itself
            bar.set_postfix(success=f"{stats['ok'] / max(stats['n'], 1):.0%}", errored=stats["errored"])

        try:
            run_jobs(jobs, functools.partial(CollectionWorker, spec), executor, report,
                     local_worker=CollectionWorker(spec, environment, teacher) if executor.kind == "local" else None)
        except ExecutorError as err:
            raise SystemExit(f"error: --executor {executor.kind}: {err}; --resume runs the missing episodes") from None
    summary = {**stats, "success_rate": stats["ok"] / max(stats["n"], 1), "shards": sorted(written),
               "executor": executor.describe()}
    publish_text(out / "last_collect.json", json.dumps(summary, indent=2) + "\n")
    print(f"collect: {stats['ok']}/{stats['n']} episodes valid by the {args.env} checker; "
          f"{stats['replans']} re-plans, {stats['recovered']} turns recovered after a re-plan, "
          f"{stats['reused_steps']} executed steps kept instead of run again; "
          f"{stats['errored']} episodes errored (infrastructure; --resume runs them again)", file=sys.stderr)
    return 0 if stats["errored"] == 0 else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="heart collect", description=__doc__.split("\n")[0])
    add_arguments(parser)
    return collect(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
