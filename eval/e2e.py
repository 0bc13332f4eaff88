"""End-to-end evaluation: the whole HEART loop on held-out tasks, scored by the benchmark.

    heart eval e2e --env bfcl --split test --roles base --limit 2 --out runs/NAME/eval/e2e-base
    heart eval e2e --env bfcl --category simple --split test --roles runs/NAME/adapters --out …
    heart eval e2e --env agentdojo --split test --roles teacher:gold --seeds 0 1 2 --out …
    heart eval e2e --env bfcl --category simple --roles runs/NAME/adapters --out …/e2e-distilled --base-out …/e2e-base

The loop's flags (``--replan-budget``, ``--verify``, ``--middleware``, ``--relevance``,
``--no-messages``, ``--validation``, ``--router-mode``, ``--max-plan-steps``, …) are ``heart
collect``'s and ``heart run``'s, derived from :class:`heart.settings.LoopConfig` (one
declaration, one default each); single-turn BFCL categories run with B = 0.

Each (task, seed) is one :func:`heart.episode.run_episode` with the benchmark's own checker
(BFCL's multi-turn checker, BFCL's AST checker for the single-turn categories via
:mod:`heart.environments.bfcl_ast`, AgentDojo's utility check). Episodes run concurrently in threads, so
a remote backend serves several at once, and an in-process transformers model sits behind
the batching scheduler (:class:`heart.runtime.scheduler.BatchingBackend`), which serves the
episodes' pending role calls as one mixed-role batch.
``--executor ray`` runs the same (side, task, seed) episodes on Ray Data actors
(:mod:`heart_distill.executors`), each building its own :class:`E2EWorker` (environment and
backends); their rows come back to this process, which writes the files.

An episode is *errored* — infrastructure, not the model — when it raises, when its record
says so (``EpisodeRecord.errored``), when a role call failed inside the backend (the loop
records it as "backend error: …"), or when BFCL's checker crashed. Errored episodes are
counted and listed, never scored as failures; a run where every episode errored exits 1.

Writes ``<out>/e2e.json`` (figures with bootstrap intervals over tasks and n, pass^k over
seeds, provenance), ``<out>/episodes.jsonl`` (one row per episode: score, tokens, role
calls, wall time) and ``<out>/trace.jsonl`` (every role call), the last two appended as each
episode finishes, and ``<out>/e2e-run.json`` (what the episodes are measured with).
``--resume`` continues a killed run in the same folders: its finished episodes are kept, the
missing and the errored ones run, and ``e2e.json`` is computed from all rows as one
uninterrupted run would compute it (:mod:`heart_distill.eval.e2e_folder`). Without
``--resume`` a run replaces what its folders held.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import sys
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from heart.atomic import publish_text
from heart.argtypes import nonnegative_float, nonnegative_int, positive_int
from heart.environments import BFCL_CATEGORIES, BFCL_SINGLE_TURN_CATEGORIES, ENVIRONMENTS, load_environment
from heart_distill.eval import e2e_folder
from heart_distill.eval.e2e_folder import EPISODES, RESULTS, TRACE
from heart_distill.eval.formats import ROLES
from heart_distill.eval.models import (RoleModels, check_served_modes, check_sides_agree, resolve_role_models,
                                      shared_backend, shared_backends, with_base_side)
from heart_distill.eval.roles import MAX_NEW_TOKENS
from heart_distill.eval.stats import bootstrap, pass_hat_k
from heart_distill.arguments import custom_arguments, executor_arguments, loop_arguments, loop_settings
from heart_distill.executors import LOCAL, ExecutorError, ExecutorOptions, options_from_args, run_jobs
from heart.runtime.base import Backend, SamplingConfig
from heart.runtime.engines import ENGINE_SPECS
from heart.runtime.scheduler import BatchingBackend
from heart.settings import POLICY, TURN, LoopConfig

E2E_SETTINGS = (*POLICY, *TURN)
"""The loop settings ``heart eval e2e`` takes as flags (:mod:`heart.settings`)."""

BACKEND_ERROR = "backend error:"
"""How heart.calls records a role call whose backend raised."""


@dataclass
class E2EConfig:
    """One ``heart eval e2e`` run."""

    env: str
    """bfcl or agentdojo."""
    out: str
    """Where e2e.json, episodes.jsonl and trace.jsonl go."""
    category: str | None = None
    """BFCL category: a multi-turn one (default multi_turn_base) or simple, multiple,
    parallel, parallel_multiple (single-turn, AST-checked)."""
    tasks_file: str | None = None
    """``custom``: the tasks file."""
    tools: str | None = None
    """``custom``: where its tools come from (:func:`heart.environments.custom_environment`)."""
    split: str = "test"
    roles_spec: str = "base"
    """base | an adapters folder | teacher:SPEC (see eval.models)."""
    model: str = "smollm2-135m"
    seeds: tuple[int, ...] = (0,)
    """One episode per task per seed (seeds vary sampling when temperature > 0, and the
    gold teacher's phrasing)."""
    limit: int | None = None
    """Only the first N tasks of the split."""
    tasks: tuple[str, ...] = ()
    """Only these tasks (each must belong to ``split``: held-out discipline)."""
    concurrency: int | None = None
    """Episodes in flight at once, per side; None: :func:`episodes_in_flight` for the engine."""
    engine: str = "peft"
    """In-process engine for the base and its adapters: peft or llamacpp (heart.runtime.engines)."""
    loop: LoopConfig = dataclasses.field(default_factory=LoopConfig)
    """How the loop runs a turn (:data:`E2E_SETTINGS` from the flags, the loop's defaults for the
    rest); each episode adds its models' short prompts and the harness's fields."""
    max_new_tokens: int | None = None
    """Per role call; None: each role's own budget (:data:`eval.roles.MAX_NEW_TOKENS`, above the
    teacher's 95th percentile), as in the per-role evaluation."""
    temperature: float = 0.0
    seed: int = 0
    """Seed of the bootstrap."""
    harness: str | None = None
    """A harness folder (:mod:`heart.harness`: role prompt edits + middleware); None: the
    shipped prompts and the default middleware."""
    allow_other_modes: bool = False
    """Serve an adapter inputs of a mode its manifest says it never trained on (refused
    otherwise: :func:`heart_distill.eval.models.check_served_modes`)."""


EPISODES_IN_FLIGHT = {"peft": 4, "llamacpp": 16}
"""Episodes in flight per side when ``--concurrency`` is not given. An episode has one role call
pending at a time, so the episodes in flight bound the engine's batch. peft's continuous batch
gains little past a few rows on a CPU; llama.cpp's grows to 7.8x one call at a time with 64
calls in flight (bench/results/runtime_llamacpp64.json), but its calls split by role (one
context per adapter), so 16 episodes a side (32 in flight, both sides) keep each role's batch
several rows deep while the contexts' caches (slots x 2,048 tokens each) stay near 1.5 GB."""


def episodes_in_flight(config: "E2EConfig") -> int:
    """The episodes ``config`` runs at once per side: its ``concurrency``, or the engine's default."""
    return config.concurrency or EPISODES_IN_FLIGHT[config.engine.partition(":")[0]]


class EpisodeEvents:
    """A per-episode trace sink (threads never share a file handle); flushed by the caller."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def write(self, item: Any) -> None:
        self.rows.append(item if isinstance(item, dict) else dataclasses.asdict(item))


def infrastructure_error(record: Any, events: list[dict[str, Any]]) -> str | None:
    """Why an episode says nothing about the model, or None when it is a fair measurement."""
    if record.errored:  # EpisodeRecord.errored (set by the loop, when it can tell)
        return record.error or "episode record marked errored"
    backend_errors = [e["parse_error"] for e in events
                      if e.get("kind") != "episode" and (e.get("parse_error") or "").startswith(BACKEND_ERROR)]
    if backend_errors:
        return f"{len(backend_errors)} role call(s) failed in the backend: {backend_errors[0]}"
    error_type = str((record.checker or {}).get("error_type") or "")
    if error_type.startswith("checker_exception"):
        return f"the benchmark's checker crashed: {error_type}: {record.checker.get('error_message', '')}"[:500]
    return None


def episode_row(task_id: str, seed: int, events: list[dict[str, Any]], record: Any, wall_s: float,
                error: str | None) -> dict[str, Any]:
    calls = [e for e in events if e.get("kind") != "episode"]
    per_role = Counter(e["role"] for e in calls)
    return {
        "task_id": task_id, "seed": seed, "errored": error is not None, "error": error,
        "score": None if error else record.score, "success": None if error else record.success,
        "verdicts": record.verdicts if record else None, "replans_used": record.replans_used if record else None,
        "checker": record.checker if record else None, "wall_s": round(wall_s, 3),
        "prompt_tokens": sum(e["prompt_tokens"] for e in calls),
        "completion_tokens": sum(e["completion_tokens"] for e in calls),
        "role_calls": sum(per_role.values()), **{f"{role}_calls": per_role.get(role, 0) for role in ROLES},
        "parse_failures": sum(1 for e in calls if e.get("parse_error")),
    }


def harness_fields(path: str | None) -> dict[str, Any]:
    """The LoopConfig fields of the harness at ``path`` (none: {})."""
    from heart.harness import load_harness, loop_fields

    return loop_fields(load_harness(path)) if path else {}


def gold_teacher(task, environment, seed: int) -> Backend:
    from heart_distill.data.gold_teacher import GoldTeacher

    return GoldTeacher(task, environment.catalog(), seed=seed)


def run_one(environment, task_id: str, seed: int, backend: Backend | None, models: RoleModels,
            config: E2EConfig, teacher_for_task=gold_teacher) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One episode → (its row, its trace rows). Never raises. Without a shared backend the
    teacher is built per task (``teacher_for_task(task, environment, seed)``)."""
    from heart.episode import run_episode

    start = time.perf_counter()
    events = EpisodeEvents()
    single_turn = config.category in BFCL_SINGLE_TURN_CATEGORIES
    # a single-turn BFCL answer is the one set of calls an attempt makes: a re-plan would add
    # calls that the AST checker counts against it
    loop_config = dataclasses.replace(config.loop, short_prompts=models.short_prompts,
                                      **({"replan_budget": 0} if single_turn else {}),
                                      **harness_fields(config.harness))
    sampling = {r: SamplingConfig(max_new_tokens=config.max_new_tokens or MAX_NEW_TOKENS[r],
                                  temperature=config.temperature, seed=seed if config.temperature > 0 else None)
                for r in ROLES}
    try:
        task = environment.load_task(task_id)
        if backend is None:  # the gold teacher answers from this task's gold calls
            backend = teacher_for_task(task, environment, seed)
        with backend.client() if hasattr(backend, "client") else contextlib.nullcontext():
            result = run_episode(environment, task, backend, config=loop_config, trace=events, seed=seed,
                                 sampling=sampling)
    except Exception as err:  # infrastructure (out of memory, a crashed server, a broken tool env)
        error = f"{type(err).__name__}: {err}"[:500]
        return episode_row(task_id, seed, events.rows, None, time.perf_counter() - start, error), events.rows
    error = infrastructure_error(result.record, events.rows)
    return episode_row(task_id, seed, events.rows, result.record, time.perf_counter() - start, error), events.rows


def summarize_episodes(rows: list[dict[str, Any]], seeds: Sequence[int], seed: int = 0) -> dict[str, Any]:
    """Figures over tasks (per-task means over seeds, errored episodes left out), each with
    a bootstrap interval over tasks and n; pass^k for k = 1..#seeds over tasks with every
    seed measured."""
    by_task: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        if not row["errored"]:
            by_task[row["task_id"]].append(row)

    def per_task(key: str) -> np.ndarray:
        return np.array([np.mean([r[key] for r in runs]) for runs in by_task.values()], dtype=float)

    figures = {"success_rate": bootstrap(per_task("score"), seed=seed).to_dict()}
    for key in ("prompt_tokens", "completion_tokens", "role_calls", "wall_s", "parse_failures",
                *(f"{r}_calls" for r in ROLES)):
        figures[f"{key}_per_task"] = bootstrap(per_task(key), seed=seed).to_dict()
    from heart_distill.eval.metrics import clarification_figures  # asked when needed, and not otherwise
    figures.update(clarification_figures(rows, seed=seed))  # ({} where the environment records none)
    complete = [runs for runs in by_task.values() if len(runs) == len(seeds)]
    pass_k = {}
    for k in range(1, len(seeds) + 1):
        if complete:
            pass_k[str(k)] = {"value": pass_hat_k([sum(bool(r["success"]) for r in runs) for runs in complete],
                                                  [len(runs) for runs in complete], k), "n": len(complete)}
    return {"figures": figures, "pass_hat_k": pass_k,
            "per_task_score": {task: float(np.mean([r["score"] for r in runs])) for task, runs in by_task.items()}}


@dataclass
class Side:
    """One ``--roles`` of a run: its models, the name of its backend and its rows."""

    config: E2EConfig
    models: RoleModels
    backend_name: str = "gold (per task)"
    """As the worker that ran its episodes reports it (the gold teacher is built per task)."""
    rows: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    resumed: dict[str, int] | None = None
    """With ``--resume``: episodes kept from the earlier run, errored ones run again, torn lines dropped."""


def shared_sides(configs: Sequence[E2EConfig], models: Sequence[RoleModels]) -> list[Any]:
    """One backend per side: in-process sides on one base share it (:func:`eval.models.shared_backends`)."""
    concurrency = sum(episodes_in_flight(c) for c, m in zip(configs, models) if m.teacher is None)
    return shared_backends(models, concurrency, configs[0].engine)


def run(config: E2EConfig, backend: Backend | None = None, argv: list[str] | None = None,
        teacher_for_task=gold_teacher, resume: bool = False) -> dict[str, Any]:
    """Run every (task, seed) of ``config``; write and return the results. ``backend``
    replaces the one ``config.roles_spec`` names (tests pass scripted ones)."""
    return run_sides([config], [backend], argv, teacher_for_task, resume=resume)[0]


@dataclass(frozen=True)
class E2EWorkerSpec:
    """What an :class:`E2EWorker` is built from, in whichever process runs it (picklable)."""

    configs: tuple[E2EConfig, ...]
    """The sides run together."""
    teacher_for_task: Any = gold_teacher
    """Builds the per-task teacher of a ``teacher:gold`` side (a module-level function)."""


class E2EWorker:
    """Runs shards of (side, task id, seed) episodes (:mod:`heart_distill.executors`): one
    environment, one backend per side (sides on one in-process model share it), each
    episode's row and trace rows reported to the process that writes the files."""

    def __init__(self, spec: E2EWorkerSpec, environment=None, models: Sequence[RoleModels] | None = None,
                 backends: Sequence[Backend | None] | None = None):
        configs = spec.configs
        self.spec = spec
        self.models = list(models or [resolve_role_models(c.roles_spec, c.model) for c in configs])
        self.environment = environment or load_environment(configs[0].env, configs[0].category,
                                                           configs[0].tasks_file, configs[0].tools)
        given = list(backends or [None] * len(configs))
        shared = shared_sides(configs, self.models) if not any(given) else [None] * len(configs)
        self.backends = []
        for config, side_models, backend, together in zip(configs, self.models, given, shared):
            backend = backend or together
            if backend is None:
                backend = shared_backend(side_models, episodes_in_flight(config), engine=config.engine)
                if backend is not None and (side_models.teacher is None or side_models.teacher.startswith("hf:")):
                    # concurrent episodes share the one in-process model through the scheduler, which
                    # serves their pending role calls as one batch (decoding is memory-bound: a batch
                    # of 2-4 costs little more per step than one call)
                    backend = BatchingBackend(backend, max_batch_size=episodes_in_flight(config))
            self.backends.append(backend)

    def run_shard(self, shard_index: int | None, jobs: list, report) -> None:
        configs = self.spec.configs
        with ThreadPoolExecutor(max_workers=sum(episodes_in_flight(c) for c in configs)) as pool:
            futures = {pool.submit(run_one, self.environment, str(task_id), int(seed), self.backends[side],
                                   self.models[side], configs[side], self.spec.teacher_for_task): side
                       for side, task_id, seed in jobs}
            for future in as_completed(futures):
                side = futures[future]
                row, events = future.result()  # run_one never raises
                backend = self.backends[side]
                report({"side": side, "row": row, "events": events,
                        "backend": backend.name if backend is not None else "gold (per task)"})


def run_sides(configs: Sequence[E2EConfig], backends: Sequence[Backend | None] | None = None,
              argv: list[str] | None = None, teacher_for_task=gold_teacher,
              executor: ExecutorOptions = LOCAL, resume: bool = False) -> list[dict[str, Any]]:
    """Run several ``--roles`` on the same tasks at once (e.g. base and distilled), each side
    written to its own ``out``; sides on one in-process model share it (:func:`shared_sides`).
    ``executor`` says where the episodes run (:mod:`heart_distill.executors`); ``backends``
    (scripted ones, in tests) are objects of this process: the local executor only.
    ``resume``: keep the episodes each ``out`` holds from an interrupted run of the same
    configuration and run only the others (ValueError, touching nothing, when it differs)."""
    from heart.progress import progress_bar

    first = configs[0]
    check_sides_agree(configs)
    models = [resolve_role_models(c.roles_spec, c.model) for c in configs]
    for config, side in zip(configs, models):
        if not config.allow_other_modes:
            check_served_modes(side, config.loop)
    environment = load_environment(first.env, first.category, first.tasks_file, first.tools)
    harness_fingerprint = None
    if first.harness:  # refused before any episode, naming the file and field
        from heart.harness import load_harness

        if first.loop.middleware != "default":
            raise ValueError("--harness brings its own middleware: drop --middleware (or edit the harness)")
        harness_fingerprint = load_harness(first.harness).fingerprint()
    first.loop.check_files(environment.catalog())
    task_ids = environment.task_ids(first.split)
    if first.tasks:
        outside = [t for t in first.tasks if t not in task_ids]
        if outside:
            raise ValueError(f"task(s) {outside} are not in the {first.split!r} split of {first.env}")
        task_ids = list(first.tasks)
    if first.limit is not None:
        task_ids = task_ids[:first.limit]
    if not task_ids:
        raise ValueError(f"no {first.env} task in split {first.split!r}")
    if backends and any(backends) and executor.kind != "local":
        raise ValueError("backends given in-process run on the local executor only")
    identities = [e2e_folder.run_identity(config, side_models, task_ids, harness_fingerprint)
                  for config, side_models in zip(configs, models)]
    every_job = [(seed, task_id) for seed in first.seeds for task_id in task_ids]
    # every side is read (and may be refused) before any folder is touched
    resumptions = [e2e_folder.read_resumption(Path(config.out), identity, [(t, s) for s, t in every_job])
                   if resume else None for config, identity in zip(configs, identities)]
    sides = [Side(config, side_models) for config, side_models in zip(configs, models)]
    for side, resumption in zip(sides, resumptions):
        if resumption is not None and not resumption.fresh:
            side.rows, side.resumed = list(resumption.rows), resumption.summary()
            if side.models.teacher != "gold" and resumption.backend:  # a side with nothing left to run
                side.backend_name = resumption.backend
    done = [set() if resumption is None else resumption.finished for resumption in resumptions]
    jobs = [(index, task_id, seed) for seed, task_id in every_job for index in range(len(sides))
            if (task_id, seed) not in done[index]]
    spec = E2EWorkerSpec(tuple(configs), teacher_for_task)
    local_worker = (E2EWorker(spec, environment, models, backends) if executor.kind == "local" and jobs else None)
    for config, identity, resumption in zip(configs, identities, resumptions):
        if resumption is not None:
            resumption.compact()
        e2e_folder.start(Path(config.out), identity)
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        files = [e2e_folder.EpisodeFiles(Path(side.config.out), fresh=resumption is None or resumption.fresh)
                 for side, resumption in zip(sides, resumptions)]
        for side_files in files:
            stack.callback(side_files.close)
        progress = stack.enter_context(progress_bar(total=len(jobs), desc=f"e2e {first.env}", unit="ep"))

        def report(result: dict[str, Any]) -> None:
            side, row = sides[result["side"]], result["row"]
            key = (row["task_id"], row["seed"])
            if key in done[result["side"]]:  # one row per episode, whatever an executor reports twice
                return
            done[result["side"]].add(key)
            side.backend_name = result["backend"]
            side.rows.append(row)
            files[result["side"]].write(row, result["events"])
            progress.set_postfix({side_.models.label: _success(side_.rows) for side_ in sides})
            progress.update(1)

        if jobs:
            run_jobs(jobs, functools.partial(E2EWorker, spec), executor, report, local_worker)
    wall_s = round(time.perf_counter() - started, 3)
    batching = batching_record(local_worker.backends, configs, len(jobs)) if local_worker is not None else None
    return [write_results(side, task_ids, wall_s, len(sides), argv, executor, batching, len(jobs)) for side in sides]


def batching_record(backends: Sequence[Backend | None], configs: Sequence[E2EConfig],
                    jobs: int) -> dict[str, Any] | None:
    """How full the engine's batches were over the run, from the in-process backends' own
    counters (sides sharing one model count once): role calls, calls handed over per admission
    (the scheduler), and rows per decoding step (the engine; what batching buys). None when
    no in-process model served the run (the gold teacher, a remote server)."""
    seen: dict[int, Any] = {}
    for backend in backends:
        backend = getattr(backend, "backend", backend)  # an UnadaptedView's shared backend
        if isinstance(backend, BatchingBackend):
            seen[id(backend)] = backend
    if not seen:
        return None
    calls = admissions = max_rows = 0
    totals = dict.fromkeys(["steps", "row_steps", "prompt_tokens", "prompt_tokens_computed", "prefill_s", "step_s",
                            "choose_s"], 0)
    for scheduler in seen.values():
        stats = scheduler.stats()
        calls, admissions = calls + stats.calls, admissions + stats.batches
        engine = getattr(scheduler.inner, "stats", None) or getattr(scheduler.inner, "last_decode_stats", None)
        if engine is not None:
            for key in totals:
                totals[key] += getattr(engine, key)
            max_rows = max(max_rows, engine.max_running)
    in_flight = min(jobs, sum(episodes_in_flight(c) for c in configs))  # fewer episodes than slots: all at once
    steps = totals["steps"]
    return {"episodes_in_flight": in_flight, "role_calls": calls,
            "calls_per_admission": round(calls / admissions, 2) if admissions else None,
            "decode_steps": steps, "rows_per_step": round(totals["row_steps"] / steps, 2) if steps else None,
            "max_rows": max_rows,
            # where the engine's time went: prompt tokens computed (the rest came from the prefix
            # cache), seconds in the model prefilling and stepping, and choosing tokens
            "prompt_tokens": totals["prompt_tokens"], "prompt_tokens_computed": totals["prompt_tokens_computed"],
            **{key: round(totals[key], 1) for key in ("prefill_s", "step_s", "choose_s")},
            "ms_per_step": round(1000 * totals["step_s"] / steps, 1) if steps else None}


def _success(rows: list[dict[str, Any]]) -> str:
    scored = [r["score"] for r in rows if not r["errored"]]
    return f"{np.mean(scored):.0%}" if scored else "-"


def write_results(side: Side, task_ids: list[str], wall_s: float, sides: int, argv: list[str] | None,
                  executor: ExecutorOptions = LOCAL, batching: dict[str, Any] | None = None,
                  ran: int = 0) -> dict[str, Any]:
    """Write ``side``'s e2e.json. ``ran``: episodes this invocation ran, every side together (with
    ``wall_s``, the run's episodes per hour); ``batching``: :func:`batching_record`."""
    from heart_distill.eval.provenance import provenance

    config, models, rows = side.config, side.models, side.rows
    rows.sort(key=lambda r: (r["seed"], task_ids.index(r["task_id"])))
    summary = summarize_episodes(rows, config.seeds, config.seed)
    results = {
        "kind": "e2e", "label": models.label, "roles_spec": models.spec, "model": models.model,
        "env": config.env, "category": config.category or ("multi_turn_base" if config.env == "bfcl" else None),
        "config": dataclasses.asdict(config), **summary,
        "counts": {"episodes": len(rows), "errored": sum(r["errored"] for r in rows), "tasks": len(task_ids),
                   "wall_s": wall_s, "sides_run_together": sides},
        # how fast, not what: a resumed run measures the same and runs fewer episodes
        "throughput": {"episodes_run": ran, "episodes_per_hour": round(3600 * ran / wall_s, 1) if ran and wall_s else None,
                       "batching": batching},
        "errored": [{"task_id": r["task_id"], "seed": r["seed"], "error": r["error"]} for r in rows if r["errored"]],
        "adapters": {role: {"path": path, "manifest": models.manifests.get(role, {})}
                     for role, path in models.adapters.items()},
        "backend": side.backend_name, "executor": executor.describe(), "resumed": side.resumed,
        "provenance": provenance(argv),
    }
    publish_text(Path(config.out) / RESULTS, json.dumps(results, indent=2, default=str) + "\n")
    return results


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--env", required=True, choices=ENVIRONMENTS)
    parser.add_argument("--category", choices=BFCL_CATEGORIES, help="bfcl only (default multi_turn_base)")
    custom_arguments(parser)
    parser.add_argument("--split", default="test", choices=["train", "dev", "test"])
    parser.add_argument("--roles", dest="roles_spec", default="base", help="base | ADAPTERS_DIR | teacher:SPEC")
    parser.add_argument("--model", default="smollm2-135m", help="base model (when no manifest names one)")
    parser.add_argument("--seeds", type=nonnegative_int, nargs="+", default=[0])
    parser.add_argument("--limit", type=positive_int, help="first N tasks of the split")
    parser.add_argument("--task", action="append", default=[], help="only this task of the split (repeatable)")
    parser.add_argument("--concurrency", type=positive_int, default=None,
                        help="episodes in flight per side (default: 4 on peft, 16 on llamacpp; "
                             "eval.e2e.EPISODES_IN_FLIGHT)")
    parser.add_argument("--engine", choices=ENGINE_SPECS, default="peft",
                        help="in-process engine (llamacpp: GGUF on CPU, same greedy answers up to arithmetic order, "
                             "faster; llamacpp:f16 for f16 base weights, faster again)")
    loop_arguments(parser, E2E_SETTINGS)  # single-turn BFCL categories run with B = 0 whatever --budget says
    parser.add_argument("--max-new-tokens", type=positive_int, default=None,
                        help="per role call (default: each role's own budget, eval.roles.MAX_NEW_TOKENS)")
    parser.add_argument("--temperature", type=nonnegative_float, default=0.0)
    parser.add_argument("--harness", help="a harness folder (heart optimize writes one): role prompt edits "
                                          "and tool-boundary middleware (docs/optimize.md)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--base-out", help="also run the unadapted base on the same tasks, at the same time and on "
                                           "the same in-process model (one batch serves both sides), into this folder")
    parser.add_argument("--resume", action="store_true",
                        help="continue a killed run in --out (and --base-out): keep its finished episodes, run the "
                             "missing ones and the errored ones again (they were never scored); refused when the "
                             "folder was run with other options. Without it a run replaces what the folders hold")
    parser.add_argument("--allow-other-modes", action="store_true",
                        help="serve an adapter inputs of a mode it never trained on (--router-mode, --planner-form, "
                             "--verify other than its manifest's input_modes); refused without it")
    executor_arguments(parser)


def config_from_args(args: argparse.Namespace) -> E2EConfig:
    # numeric ranges are checked by the parser (heart.argtypes)
    if len(set(args.seeds)) != len(args.seeds):
        raise ValueError(f"--seeds must be distinct, got {args.seeds}")
    return E2EConfig(env=args.env, out=args.out, category=args.category, tasks_file=args.tasks, tools=args.tools,
                     split=args.split,
                     roles_spec=args.roles_spec, model=args.model, seeds=tuple(args.seeds), limit=args.limit,
                     tasks=tuple(args.task),
                     concurrency=args.concurrency, engine=args.engine,
                     loop=LoopConfig(**loop_settings(args, E2E_SETTINGS)),
                     max_new_tokens=args.max_new_tokens, temperature=args.temperature, harness=args.harness,
                     allow_other_modes=args.allow_other_modes)


def main(argv: list[str], full_argv: list[str] | None = None) -> int:
    from heart.user_errors import UserError
    from heart_distill.eval.stats import Estimate

    parser = argparse.ArgumentParser(prog="heart eval e2e", description="end-to-end evaluation on held-out tasks")
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
        configs = with_base_side(config, args.base_out)
        all_results = run_sides(configs, argv=full_argv, executor=options_from_args(args), resume=args.resume)
    except (FileNotFoundError, ValueError, KeyError, UserError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except ExecutorError as err:
        print(f"error: --executor {args.executor}: {err}; the same command with --resume runs the missing "
              "episodes", file=sys.stderr)
        return 1
    status = 0
    for side, results in zip(configs, all_results):
        counts = results["counts"]
        if results["resumed"]:
            resumed = results["resumed"]
            print(f"  {results['label']}: resumed: kept {resumed['episodes_kept']} finished episode(s), ran "
                  f"{counts['episodes'] - resumed['episodes_kept']} ({resumed['errored_rerun']} errored ones again)")
        print(f"  {results['label']}: success {Estimate(**results['figures']['success_rate']).format(100)} over "
              f"tasks; {counts['errored']}/{counts['episodes']} episodes errored")
        for k, p in results["pass_hat_k"].items():
            if int(k) > 1:  # pass^1 is the success rate just printed
                print(f"  pass^{k} {100 * p['value']:.1f} (n={p['n']} tasks)")
        if "clarification_precision" in results["figures"]:
            print(f"  clarification precision {Estimate(**results['figures']['clarification_precision']).format(100)}, "
                  f"recall {Estimate(**results['figures']['clarification_recall']).format(100)}")
        if results["throughput"]["batching"] and side is configs[0]:  # one engine for every side: print it once
            b = results["throughput"]["batching"]
            print(f"  engine: {b['role_calls']} role calls, {b['rows_per_step']} rows per decoding step on average "
                  f"(max {b['max_rows']}), {b['episodes_in_flight']} episodes in flight; "
                  f"{b['prompt_tokens_computed']:,} of {b['prompt_tokens']:,} prompt tokens computed; model "
                  f"{b['prefill_s']:.0f} s prefilling, {b['step_s']:.0f} s stepping ({b['ms_per_step']} ms a step), "
                  f"{b['choose_s']:.0f} s choosing tokens, of {results['counts']['wall_s']:.0f} s")
        for item in results["errored"][:5]:
            print(f"  errored: {item['task_id']} seed {item['seed']}: {item['error']}", file=sys.stderr)
        print(f"wrote {Path(side.out) / RESULTS}")
        if counts["errored"] == counts["episodes"]:
            print(f"error: every episode errored ({results['label']}; infrastructure): nothing measures the model",
                  file=sys.stderr)
            status = 1
    return status
