"""Where episodes run: threads in this process (``local``) or Ray Data actors on a Ray cluster
(``ray``). One home for both commands that run many episodes, so collection and end-to-end
evaluation cut work into the same shards and follow the same retry rules::

    heart collect --env bfcl --split train --teacher gold --out runs/NAME --executor ray --workers 4
    heart eval e2e --env bfcl --roles teacher:gold --out runs/NAME/e2e --executor ray

A run is a list of *jobs* (one episode each: a task and a seed, and for evaluation the side),
cut into *shards* of ``shard_size`` jobs. An *episode worker* is built in the process that
runs it, from a picklable ``build`` callable, and holds what its episodes share: the
environment, the teacher or model client, an in-process engine. Called with a shard, it runs
the shard's episodes on its own threads and reports one JSON-able result per job; it never
raises for one episode.

- ``local`` builds one worker here and hands it every job as one shard (the threads of
  ``--concurrency``), as the toolkit always ran;
- ``ray`` turns the shards into a Ray Data dataset and maps a callable class over it on an
  actor pool (``map_batches``, one shard per call): each actor builds its worker once and runs
  shard after shard; results stream back to this process as shards finish. Ray restarts an
  actor that died and gives its shard to a live one (:data:`RAY_RETRIES` times), so a worker
  must tell a shard's earlier attempt from a new shard (collection does: ``shard_index``).

The Ray executor connects to ``address`` (``ray.init``: None means ``RAY_ADDRESS``, else the
cluster ``ray start`` began on this machine, else a new local instance); a driver that has
called ``ray.init`` already is used as it is. Ray is an optional extra
(``pip install 'heart-distill[ray]'``); nothing here imports it for the local executor.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Protocol, Sequence

EXECUTORS = ("local", "ray")
FORWARDED_ENV = ("PYTHONHASHSEED", "HF_HUB_OFFLINE", "HEART_CACHE")
"""Variables of this process that Ray workers get too: the hash seed (BFCL's error texts
print Python sets; the pipeline fixes the seed so a stage gives the same bytes from the same
inputs), offline mode, the model cache."""
RAY_RETRIES = 3
"""Times Ray restarts a dead worker actor and retries its shard before the run fails: a
worker that dies on every attempt (out of memory loading its model) must end the run with an
error, not loop."""


class ExecutorError(RuntimeError):
    """An executor that cannot run (Ray missing, a cluster out of reach, a shard that kept
    killing its worker); the message says what to do."""


@dataclass(frozen=True)
class ExecutorOptions:
    """``--executor`` and the Ray options beside it (heart_distill.arguments.executor_arguments)."""

    kind: str = "local"
    """local (threads in this process) or ray (Ray Data actors)."""
    address: str | None = None
    """Ray cluster address; None: RAY_ADDRESS, else the cluster ``ray start`` began here, else a local one."""
    workers: int = 2
    """Ray: worker actors (each holds one environment and one model client or engine)."""
    shard_size: int = 16
    """Ray: episodes per shard (one ``map_batches`` call, one trace shard when collecting)."""
    worker_gpus: float = 0.0
    """Ray: GPUs each worker actor reserves (an in-process engine per worker)."""

    def describe(self) -> dict[str, Any]:
        if self.kind == "local":
            return {"kind": "local"}
        return {"kind": "ray", "address": self.address, "workers": self.workers, "shard_size": self.shard_size,
                "worker_gpus": self.worker_gpus}


LOCAL = ExecutorOptions()


def options_from_args(args: argparse.Namespace) -> ExecutorOptions:
    """The executor a command's parsed arguments ask for; ValueError naming a Ray option
    given to the local executor (it would be silently ignored)."""
    kind = getattr(args, "executor", "local")
    given = {name: getattr(args, name, None) for name in ("ray_address", "workers", "shard_size", "worker_gpus")}
    if kind == "local":
        stray = [f"--{name.replace('_', '-')}" for name, value in given.items() if value is not None]
        if stray:
            raise ValueError(f"{', '.join(stray)} apply to --executor ray only")
        return LOCAL
    defaults = ExecutorOptions(kind="ray")
    return ExecutorOptions(
        kind="ray", address=given["ray_address"],
        workers=given["workers"] if given["workers"] is not None else defaults.workers,
        shard_size=given["shard_size"] if given["shard_size"] is not None else defaults.shard_size,
        worker_gpus=given["worker_gpus"] if given["worker_gpus"] is not None else defaults.worker_gpus)


class EpisodeWorker(Protocol):
    """What an executor runs: built once per process, called once per shard."""

    def run_shard(self, shard_index: int | None, jobs: list[Any], report: Callable[[dict[str, Any]], None]) -> None:
        """Run ``jobs`` (JSON-able, as the command made them) and ``report`` one JSON-able
        result per job, from any thread. ``shard_index`` is None for the local executor's
        single shard; under Ray it numbers the shard, the same on every attempt."""


def shards(jobs: Sequence[Any], size: int) -> list[list[Any]]:
    """``jobs`` cut into consecutive shards of at most ``size``."""
    return [list(jobs[start:start + size]) for start in range(0, len(jobs), size)]


def run_jobs(jobs: Sequence[Any], build: Callable[[], EpisodeWorker], options: ExecutorOptions,
             report: Callable[[dict[str, Any]], None], local_worker: EpisodeWorker | None = None) -> None:
    """Run every job with the executor ``options`` names; ``report`` gets each job's result in
    this process, in the order episodes (local) or shards (Ray) finish. ``local_worker``
    saves the local executor a second build when the caller holds one already."""
    if options.kind == "local":
        (local_worker or build()).run_shard(None, list(jobs), report)
        return
    for result in _ray_results(jobs, build, options):
        report(result)


class _RayShardMapper:
    """The callable class Ray Data runs on each actor: one episode worker per actor, one
    shard per call. Results travel as JSON text (one column of strings), which every block
    format carries unchanged."""

    def __init__(self, build: Callable[[], EpisodeWorker]):
        self.worker = build()

    def __call__(self, batch: dict[str, Any]) -> dict[str, list[str]]:
        results: list[dict[str, Any]] = []
        for index, jobs in zip(batch["shard"], batch["jobs"]):
            self.worker.run_shard(int(index), json.loads(jobs), results.append)
        return {"result": [json.dumps(r, ensure_ascii=False, default=str) for r in results]}


def connect_ray(address: str | None):
    """``ray``, initialised: the driver's own connection if it has one, else ``address``."""
    try:
        import ray
    except ImportError:
        raise ExecutorError("--executor ray needs Ray: pip install 'heart-distill[ray]' "
                            "(or 'ray[data]==2.60.0')") from None
    if not ray.is_initialized():
        try:
            ray.init(address=address, include_dashboard=False, logging_level="WARNING",
                     log_to_driver=sys.stderr.isatty())
        except (ConnectionError, ValueError, RuntimeError) as err:
            raise ExecutorError(f"cannot reach the Ray cluster at {address or 'RAY_ADDRESS / the local cluster'}: "
                                f"{err}") from None
    return ray


def _ray_results(jobs: Sequence[Any], build: Callable[[], EpisodeWorker],
                 options: ExecutorOptions) -> Iterable[dict[str, Any]]:
    ray = connect_ray(options.address)
    import ray.data
    from ray.exceptions import RayError

    logging.getLogger("ray.data").setLevel(logging.WARNING)  # per-dataset INFO lines; errors still show
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False  # the command draws its own bar over episodes (heart.progress)
    context.verbose_stats_logs = False
    parts = shards(jobs, options.shard_size)
    dataset = ray.data.from_items([{"shard": index, "jobs": json.dumps(part)} for index, part in enumerate(parts)],
                                  override_num_blocks=len(parts))
    with warnings.catch_warnings():
        # Ray 2.60 names no parameter for an actor's restarts: they go as ray_remote_args,
        # which it warns are deprecated (for 2.64)
        warnings.simplefilter("ignore", DeprecationWarning)
        mapped = dataset.map_batches(
            _RayShardMapper, batch_size=1, fn_constructor_kwargs={"build": build},
            # one shard in flight per actor: a queued shard waits for whichever actor frees first
            compute=ray.data.ActorPoolStrategy(size=min(options.workers, len(parts)),
                                               max_tasks_in_flight_per_actor=1),
            num_cpus=1, num_gpus=options.worker_gpus or None,
            runtime_env={"env_vars": {name: os.environ[name] for name in FORWARDED_ENV if name in os.environ}},
            max_restarts=RAY_RETRIES, max_task_retries=RAY_RETRIES)
    try:
        for row in mapped.iter_rows():
            yield json.loads(row["result"])
    except RayError as err:
        raise ExecutorError(f"a Ray worker failed and its shard could not be finished ({type(err).__name__}: "
                            f"{str(err).splitlines()[0] if str(err) else ''}); what finished is kept") from None
