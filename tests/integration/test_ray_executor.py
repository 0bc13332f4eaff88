"""``--executor ray`` (heart_distill/executors.py) against the local executor, on a Ray
instance this module starts (2 CPUs, no dashboard) and every test shares.

- a gold collection on Ray yields exactly the episodes of the local executor, and
  ``heart datasets build`` turns both into byte-identical datasets;
- a collection killed under the local executor is resumed on Ray, where a worker is killed
  in the middle of a shard: Ray restarts it, the shard runs again, and the run ends with
  every episode written exactly once;
- ``heart eval e2e`` on Ray writes the rows the local executor writes.

Ray is the ``ray`` extra, which scripts/setup.sh installs: this module runs in CI.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import ray

from heart.traces import read_trace

HEART = [sys.executable, "-m", "heart_distill.cli"]
# BFCL's error texts print Python sets, whose order follows the hash seed: every process
# that runs episodes (the heart subprocesses, the Ray workers) uses the same one.
SEEDED = {"PYTHONHASHSEED": "0", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
COLLECT = ["collect", "--env", "bfcl", "--split", "train", "--teacher", "gold", "--fault-rate", "0.3",
           "--limit", "10", "--seeds", "0", "1", "--concurrency", "2"]
SHARD_SIZE = 6
KILL_AFTER = 2
"""Episodes a worker writes into its shard before the armed kill ends it."""


def _kill_after_episodes() -> None:
    """Ray worker setup hook: once the test arms it (a file named in KILL_ARM), the worker
    that writes its KILL_AFTER-th episode record exits on the spot, as a crashed or
    OOM-killed process does. Claiming the arm by rename makes it fire once, in one worker."""
    from heart.traces import EpisodeRecord, TraceWriter

    arm = os.environ["KILL_ARM"]
    original = TraceWriter.write
    written = []

    def write(self, item):
        original(self, item)
        if isinstance(item, EpisodeRecord):
            written.append(item.episode_id)
            if len(written) == KILL_AFTER and os.path.exists(arm):
                try:
                    os.rename(arm, arm + ".fired")
                except FileNotFoundError:  # another worker claimed it
                    return
                os._exit(1)

    TraceWriter.write = write


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """(address, arm file) of a Ray instance for this module; its workers carry the kill hook."""
    arm = tmp_path_factory.mktemp("kill") / "armed"
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the hook travels by value
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="WARNING",
             runtime_env={"env_vars": {**SEEDED, "KILL_ARM": str(arm)},
                          "worker_process_setup_hook": _kill_after_episodes})
    try:
        yield ray.get_runtime_context().gcs_address, arm
    finally:
        ray.shutdown()


def heart(*args, address=None):
    env = {**os.environ, **SEEDED, **({"RAY_ADDRESS": address} if address else {})}
    return subprocess.run([*HEART, *args], capture_output=True, text=True, timeout=600, env=env)


def records(run: Path) -> list[dict]:
    return [row for shard in sorted((run / "traces").glob("*.jsonl")) for row in read_trace(shard)
            if row["kind"] == "episode"]


def without_timings(value):
    """A trace row with its wall-clock fields removed (they differ run to run)."""
    if isinstance(value, dict):
        return {k: without_timings(v) for k, v in value.items() if k not in ("latency_s", "wall_s")}
    if isinstance(value, list):
        return [without_timings(v) for v in value]
    return value


def episodes(run: Path) -> dict[str, list[str]]:
    """Episode id → its finished events and record, timings removed, in a canonical order."""
    by_episode: dict[str, list[str]] = {}
    for shard in sorted((run / "traces").glob("*.jsonl")):
        rows = list(read_trace(shard))
        finished = {r["episode_id"] for r in rows if r["kind"] == "episode"}
        for row in rows:
            if row["episode_id"] in finished:
                by_episode.setdefault(row["episode_id"], []).append(json.dumps(without_timings(row), sort_keys=True))
    return {episode: sorted(rows) for episode, rows in by_episode.items()}


@pytest.fixture(scope="module")
def local_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("local") / "run"
    done = heart(*COLLECT, "--out", str(run))
    assert done.returncode == 0, done.stderr[-2000:]
    return run


def dataset_files(datasets: Path) -> dict[str, bytes]:
    """The saved datasets' bytes (arrow files, schema and state), cards and reports left out:
    they name the run folder."""
    return {str(p.relative_to(datasets)): p.read_bytes() for p in sorted(datasets.rglob("*"))
            if p.suffix in (".arrow", ".json") and p.name != "build_report.json"}


def test_gold_collection_on_ray_equals_the_local_one_and_builds_identical_datasets(cluster, local_run, tmp_path):
    address, _ = cluster
    run = tmp_path / "ray"
    done = heart(*COLLECT, "--out", str(run), "--executor", "ray", "--workers", "2",
                 "--shard-size", str(SHARD_SIZE), address=address)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((run / "last_collect.json").read_text())
    assert summary["executor"]["kind"] == "ray" and len(summary["shards"]) == 20 // SHARD_SIZE + 1

    expected = episodes(local_run)
    assert len(expected) == 20
    assert episodes(run) == expected  # the same episodes, event for event

    for folder in (local_run, run):
        built = heart("datasets", "build", str(folder), "--out", str(folder / "datasets"), "--tokenizer", "whitespace")
        assert built.returncode == 0, built.stderr[-2000:]
    local_files, ray_files = dataset_files(local_run / "datasets"), dataset_files(run / "datasets")
    assert sum(name.endswith(".arrow") for name in local_files) == 8  # 4 roles x (train, validation)
    assert ray_files == local_files


def test_a_local_collection_resumes_on_ray_through_a_killed_worker(cluster, local_run, tmp_path):
    from heart_distill.cli import build_parser

    _, arm = cluster
    run = tmp_path / "run"
    # 1. a local collection, killed once a few episodes are on disk
    proc = subprocess.Popen([*HEART, *COLLECT, "--out", str(run)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**os.environ, **SEEDED})
    deadline = time.time() + 120
    while time.time() < deadline and len(records(run) if (run / "traces").exists() else []) < 3:
        time.sleep(0.005)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    before = {r["episode_id"] for r in records(run)}
    assert 3 <= len(before) < 20, "the kill must land mid-run"

    # 2. resumed on Ray (this process drives it), where the first worker to write its
    # KILL_AFTER-th episode record dies in the middle of its shard
    arm.touch()
    args = build_parser().parse_args([*COLLECT, "--out", str(run), "--resume", "--executor", "ray",
                                      "--workers", "2", "--shard-size", str(SHARD_SIZE)])
    assert args.func(args) == 0
    assert not arm.exists() and Path(str(arm) + ".fired").exists(), "the armed worker never died"

    ids = Counter(r["episode_id"] for r in records(run))
    assert set(ids) == set(episodes(local_run))  # none lost
    assert set(ids.values()) == {1}  # none written twice
    ray_shards = [p for p in (run / "traces").glob("*.jsonl") if p.stem.count("-") == 5]  # <run>-<index>
    by_index = Counter(p.stem.rsplit("-", 1)[1] for p in ray_shards)
    retried = [index for index, files in by_index.items() if files == 2]
    assert len(retried) == 1, by_index  # the killed shard: its first attempt and its retry
    first, _retry = sorted((p for p in ray_shards if p.stem.endswith("-" + retried[0])),
                           key=lambda p: p.stat().st_mtime)  # the dead attempt wrote last before the retry began
    # the first attempt died mid-shard (another of the worker's threads may have closed one more)
    assert KILL_AFTER <= sum(1 for r in read_trace(first) if r["kind"] == "episode") < SHARD_SIZE
    summary = json.loads((run / "last_collect.json").read_text())
    assert summary["n"] + summary["errored"] == 20 - len(before)


def test_eval_e2e_on_ray_writes_the_rows_of_the_local_executor(cluster, tmp_path):
    address, _ = cluster
    # --relevance: the loop policy travels to the workers with the spec Ray ships them
    common = ["eval", "e2e", "--env", "bfcl", "--category", "simple", "--split", "test", "--roles", "teacher:gold",
              "--limit", "4", "--relevance"]
    local = heart(*common, "--out", str(tmp_path / "local"))
    assert local.returncode == 0, local.stderr[-2000:]
    on_ray = heart(*common, "--out", str(tmp_path / "ray"), "--executor", "ray", "--shard-size", "2", address=address)
    assert on_ray.returncode == 0, on_ray.stderr[-2000:]

    def rows(folder: Path) -> list[dict]:
        return sorted((without_timings(json.loads(line)) for line in (folder / "episodes.jsonl").open()),
                      key=lambda row: row["task_id"])

    assert rows(tmp_path / "ray") == rows(tmp_path / "local")
    assert len(rows(tmp_path / "local")) == 4 and not any(row["errored"] for row in rows(tmp_path / "local"))
    results = json.loads((tmp_path / "ray" / "e2e.json").read_text())
    assert results["executor"]["kind"] == "ray" and results["counts"]["episodes"] == 4
    judged = [row for row in map(json.loads, (tmp_path / "ray" / "trace.jsonl").open())
              if (row.get("extra") or {}).get("mode") == "relevance"]
    assert judged and {row["task_id"] for row in judged} == {row["task_id"] for row in rows(tmp_path / "ray")}


def test_bad_executor_options_are_refused_before_any_work(tmp_path):
    stray = heart(*COLLECT, "--out", str(tmp_path / "a"), "--workers", "3")
    assert stray.returncode != 0 and "--workers apply to --executor ray only" in stray.stderr
    assert not (tmp_path / "a").exists()
