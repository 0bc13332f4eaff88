"""heart eval e2e --resume: a killed run continued in its folder gives the figures of an
uninterrupted run, runs only the missing (and errored) episodes, and duplicates nothing."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter

import pytest

from heart_distill.eval import e2e
from heart_distill.eval.e2e import E2EConfig, gold_teacher, run


class Killed(BaseException):
    """Stands in for SIGKILL: nothing in the run catches it."""


class CountingGold:
    """The gold teacher, built per episode and counted; past ``kill_after`` episodes the
    process 'dies'."""

    def __init__(self, kill_after: int | None = None):
        self.kill_after, self.started = kill_after, []

    def __call__(self, task, environment, seed):
        if self.kill_after is not None and len(self.started) >= self.kill_after:
            raise Killed()
        self.started.append((task.task_id, seed))
        return gold_teacher(task, environment, seed)


def _rows(folder):
    rows = [json.loads(line) for line in (folder / e2e.EPISODES).read_text().splitlines()]
    return sorted(({k: v for k, v in row.items() if k != "wall_s"} for row in rows),
                  key=lambda row: (row["seed"], row["task_id"]))


def _trace(folder):
    return Counter((row["episode_id"], row["kind"], row.get("role")) for row in
                   map(json.loads, (folder / e2e.TRACE).read_text().splitlines()))


def _measured(results):
    """What a resumed run must reproduce: everything but wall time and provenance."""
    figures = {k: v for k, v in results["figures"].items() if k != "wall_s_per_task"}
    counts = {k: v for k, v in results["counts"].items() if k != "wall_s"}
    return figures, results["pass_hat_k"], results["per_task_score"], counts, results["errored"]


CONFIG = E2EConfig(env="bfcl", category="simple", limit=3, seeds=(0, 1), roles_spec="teacher:gold",
                   concurrency=1, out="")


def test_a_killed_run_resumed_gives_the_figures_of_an_uninterrupted_run(tmp_path):
    whole = run(dataclasses.replace(CONFIG, out=str(tmp_path / "whole")))
    assert whole["counts"]["episodes"] == 6 and whole["resumed"] is None

    folder = tmp_path / "killed"
    config = dataclasses.replace(CONFIG, out=str(folder))
    with pytest.raises(Killed):
        run(config, teacher_for_task=CountingGold(kill_after=4))
    assert len(_rows(folder)) == 4  # each episode was on disk as soon as it finished
    assert not (folder / e2e.RESULTS).exists()
    # killed while writing the next episode: its role calls are on disk, its row is torn
    finished = {(row["task_id"], row["seed"]) for row in _rows(folder)}
    whole_trace = [json.loads(line) for line in (tmp_path / "whole" / e2e.TRACE).read_text().splitlines()]
    unfinished = next(row["episode_id"] for row in whole_trace
                      if row["kind"] == "episode" and (row["task_id"], row["seed"]) not in finished)
    with open(folder / e2e.TRACE, "a") as f:
        f.writelines(json.dumps(row) + "\n" for row in whole_trace if row["episode_id"] == unfinished)
    with open(folder / e2e.EPISODES, "a") as f:
        f.write('{"task_id": "simple_python_')

    again = CountingGold()
    resumed = run(config, teacher_for_task=again, resume=True)
    assert len(again.started) == 2  # only the missing episodes ran
    assert _measured(resumed) == _measured(whole)
    assert resumed["resumed"] == {"episodes_kept": 4, "errored_rerun": 0, "torn_lines": 1}
    assert _rows(folder) == _rows(tmp_path / "whole")  # each episode once, torn line gone
    assert _trace(folder) == _trace(tmp_path / "whole")  # each role call once
    on_disk = json.loads((folder / e2e.RESULTS).read_text())
    assert _measured(on_disk) == _measured(whole)

    nothing_left = CountingGold()  # resuming a finished run runs nothing and says the same
    assert _measured(run(config, teacher_for_task=nothing_left, resume=True)) == _measured(whole)
    assert nothing_left.started == []


def test_errored_episodes_run_again_on_resume(tmp_path, monkeypatch):
    from heart.environments import bfcl_ast

    original = bfcl_ast.BFCLASTSession.score

    def flaky(self):
        if self.task.task_id == "simple_python_3":
            raise RuntimeError("checker crashed")
        return original(self)

    config = dataclasses.replace(CONFIG, seeds=(0,), tasks=("simple_python_3", "simple_python_6"), limit=None,
                                 out=str(tmp_path))
    with monkeypatch.context() as patch:
        patch.setattr(bfcl_ast.BFCLASTSession, "score", flaky)
        assert run(config)["counts"]["errored"] == 1
    again = CountingGold()
    results = run(config, teacher_for_task=again, resume=True)
    assert again.started == [("simple_python_3", 0)]
    assert results["counts"]["errored"] == 0 and results["resumed"]["errored_rerun"] == 1
    assert results["figures"]["success_rate"]["value"] == 1.0
    assert [(r["task_id"], r["errored"]) for r in _rows(tmp_path)] == [("simple_python_3", False),
                                                                      ("simple_python_6", False)]


def test_resume_refuses_another_configuration_and_touches_nothing(tmp_path, capsys):
    folder = tmp_path / "run"
    common = ["--env", "bfcl", "--category", "simple", "--roles", "teacher:gold", "--out", str(folder)]
    assert e2e.main([*common, "--limit", "1", "--resume"]) == 0  # nothing to resume yet: a fresh run
    before = {path.name: path.read_bytes() for path in folder.iterdir()}

    assert e2e.main([*common, "--limit", "2", "--budget", "1", "--resume"]) == 2
    err = capsys.readouterr().err
    assert "different configuration" in err and "budget: 3 there, 1 now" in err and "simple_python_" in err
    assert {path.name: path.read_bytes() for path in folder.iterdir()} == before

    # a row that does not parse in the middle of the file is corruption, not a torn tail
    lines = (folder / e2e.EPISODES).read_text().splitlines()
    (folder / e2e.EPISODES).write_text("\n".join(["{not json", *lines]) + "\n")
    assert e2e.main([*common, "--limit", "1", "--resume"]) == 2
    assert f"{e2e.EPISODES}:1: not an episode row" in capsys.readouterr().err

    # without --resume a run replaces what the folder held
    assert e2e.main([*common, "--limit", "1"]) == 0
    assert len(_rows(folder)) == 1


def test_both_sides_resume_and_a_mismatch_on_either_touches_neither(tmp_path):
    from heart_distill.eval.e2e_folder import RUN

    a, b = tmp_path / "a", tmp_path / "b"
    configs = [dataclasses.replace(CONFIG, out=str(a)), dataclasses.replace(CONFIG, out=str(b))]
    with pytest.raises(Killed):
        e2e.run_sides(configs, teacher_for_task=CountingGold(kill_after=5))
    written = len(_rows(a)) + len(_rows(b))
    again = CountingGold()
    results = e2e.run_sides(configs, teacher_for_task=again, resume=True)
    assert len(again.started) == 12 - written
    assert [r["counts"]["episodes"] for r in results] == [6, 6] and len(_rows(a)) == len(_rows(b)) == 6

    record = json.loads((b / RUN).read_text())
    (b / RUN).write_text(json.dumps({**record, "engine": "llamacpp"}))
    before = {path: path.read_bytes() for path in [*a.iterdir(), *b.iterdir()]}
    with pytest.raises(ValueError, match='engine: "llamacpp" there, "peft" now'):
        e2e.run_sides(configs, resume=True)
    assert {path: path.read_bytes() for path in [*a.iterdir(), *b.iterdir()]} == before


def test_resume_refuses_another_loop_policy_or_an_edited_policy_file(tmp_path, capsys):
    from heart.middleware import DEFAULT_PATH

    folder, middleware = tmp_path / "run", tmp_path / "middleware.yaml"
    middleware.write_text(DEFAULT_PATH.read_text())
    common = ["--env", "bfcl", "--category", "simple", "--roles", "teacher:gold", "--limit", "1",
              "--middleware", str(middleware), "--out", str(folder)]
    assert e2e.main(common) == 0
    before = {path.name: path.read_bytes() for path in folder.iterdir()}

    assert e2e.main([*common, "--relevance", "--no-messages", "--resume"]) == 2
    err = capsys.readouterr().err
    assert "relevance: false there, true now" in err and "messages: true there, false now" in err

    with open(middleware, "a") as f:  # the same path, other intercepts: another policy
        f.write("# edited\n")
    assert e2e.main([*common, "--resume"]) == 2
    assert "middleware_sha256" in capsys.readouterr().err
    assert {path.name: path.read_bytes() for path in folder.iterdir()} == before
