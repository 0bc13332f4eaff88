"""heart_distill/executors.py without Ray: options, shards, the local executor, and the
pipeline's ``executor:`` section. Ray itself runs in tests/integration/test_ray_executor.py."""

from __future__ import annotations

import argparse
import threading
from pathlib import Path

import pytest
import yaml

from heart_distill import pipeline
from heart_distill.arguments import executor_arguments
from heart_distill.executors import LOCAL, ExecutorOptions, options_from_args, run_jobs, shards
from heart_distill.pipeline import PipelineError, load_pipeline

REPO = Path(__file__).resolve().parents[2]


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    executor_arguments(parser)
    return parser.parse_args(argv)


def test_options_default_to_local_and_ray_options_need_ray():
    assert options_from_args(parse()) == LOCAL
    ray = options_from_args(parse("--executor", "ray", "--workers", "4", "--shard-size", "8"))
    assert ray == ExecutorOptions(kind="ray", workers=4, shard_size=8)
    with pytest.raises(ValueError, match="--workers, --shard-size apply to --executor ray only"):
        options_from_args(parse("--workers", "4", "--shard-size", "8"))
    with pytest.raises(SystemExit):
        parse("--executor", "ray", "--workers", "0")
    with pytest.raises(SystemExit):
        parse("--executor", "threads")


def test_shards_cut_jobs_in_order_and_cover_each_once():
    jobs = [("t", seed) for seed in range(7)]
    parts = shards(jobs, 3)
    assert [len(p) for p in parts] == [3, 3, 1]
    assert [job for part in parts for job in part] == jobs


def test_the_local_executor_hands_every_job_to_one_worker_as_one_shard():
    class Worker:
        built = 0

        def __init__(self):
            Worker.built += 1
            self.calls = []

        def run_shard(self, shard_index, jobs, report):
            self.calls.append((shard_index, list(jobs)))
            threads = [threading.Thread(target=report, args=({"job": job},)) for job in jobs]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()

    got = []
    run_jobs([1, 2, 3], Worker, LOCAL, got.append)
    assert Worker.built == 1 and sorted(r["job"] for r in got) == [1, 2, 3]
    held = Worker()
    run_jobs([4], Worker, LOCAL, got.append, local_worker=held)
    assert Worker.built == 2 and held.calls == [(None, [4])]  # the caller's worker, no second build


@pytest.fixture()
def recipe(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(pipeline, "_model_manifest", lambda name: [])

    def write(**extra):
        path = tmp_path / "pipeline.yaml"
        path.write_text(yaml.safe_dump({"run_dir": "run", "collect": {"envs": ["bfcl"], "limit": 3},
                                        "train": {"recipe": str(REPO / "recipes/smollm2-135m/roles.yaml")},
                                        **extra}))
        return path
    return write


def test_the_pipeline_runs_collection_and_e2e_stages_on_the_executor_its_recipe_names(recipe):
    config, folder = load_pipeline(recipe())
    local = {s.name: s.commands for s in pipeline.stages(config, folder)}
    assert not any("--executor" in c for commands in local.values() for c in commands)  # keys unchanged

    config, folder = load_pipeline(recipe(executor={"kind": "ray", "address": "10.0.0.1:6379", "workers": 4}))
    by_name = {s.name: s.commands for s in pipeline.stages(config, folder)}
    wanted = ["--executor", "ray", "--ray-address", "10.0.0.1:6379", "--workers", "4", "--shard-size", "16"]
    for name in ("collect", "collect_test", "eval_e2e"):
        for command in by_name[name]:
            at = command.index("--executor")
            assert command[at:at + len(wanted)] == wanted, (name, command)
    for name in ("datasets", "train", "eval_roles", "report"):
        assert not any("--executor" in c for c in by_name[name])


def test_a_bad_executor_section_fails_at_load_naming_the_field(recipe):
    with pytest.raises(PipelineError, match="executor.kind"):
        load_pipeline(recipe(executor={"kind": "threads"}))
    with pytest.raises(PipelineError, match="unknown key 'executor.worker'; did you mean 'executor.workers'"):
        load_pipeline(recipe(executor={"worker": 2}))
