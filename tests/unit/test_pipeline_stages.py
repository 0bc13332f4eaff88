"""heart pipeline's stage logic with a fake command runner: order, stamps, skipping, reruns.

The real commands (collect, build, train) run in tests/integration/test_pipeline.py.
"""

import json
from pathlib import Path

import pytest
import yaml

from heart_distill import pipeline
from heart_distill.pipeline import PipelineError, load_pipeline, run_pipeline

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture()
def recipe(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(pipeline, "_model_manifest", lambda name: [])  # no embedded model needed here
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump({
        "run_dir": "run", "collect": {"envs": ["bfcl"], "limit": 3},
        "train": {"recipe": str(REPO / "recipes/smollm2-135m/roles.yaml"), "roles": ["planner", "router"],
                  "overrides": ["sft.max_steps=1"]}}))
    return path


@pytest.fixture()
def calls(monkeypatch):
    """Record each command; write it into the folder it names after --out / output.dir (same command, same bytes)."""
    seen = []

    def fake_call(argv, env=None):
        command = argv[3:] if argv[1:3] == ["-m", "heart_distill.cli"] else argv[1:]
        seen.append(" ".join(command))
        for index, arg in enumerate(command):
            target = command[index + 1] if arg == "--out" else arg.split("=", 1)[1] if arg.startswith("output.dir=") else None
            roles = command[command.index("--roles") + 1].split(",") if "--roles" in command else [""]
            for role in roles if target else []:  # one training process writes every role's adapter
                folder = Path(target.replace("{role}", role)) / ("traces" if command[0] == "collect" else "")
                folder.mkdir(parents=True, exist_ok=True)
                (folder / "written-by.txt").write_text(" ".join(command))
        return 0

    monkeypatch.setattr(pipeline.subprocess, "Popen", lambda argv, env=None: _Finished(fake_call(argv, env)))
    return seen


class _Finished:
    """A started command that has already exited with ``status``."""

    def __init__(self, status):
        self.status = status

    def wait(self):
        return self.status


def test_until_train_runs_three_stages_in_order_and_stamps_them(recipe, calls, capsys):
    assert run_pipeline(recipe, until="train") == 0
    assert [c.split()[0] for c in calls] == ["collect", "datasets", "train"]  # every role in one process
    assert "--limit 3" in calls[0] and "--roles planner,router" in calls[2] and "sft.max_steps=1" in calls[2]
    assert "output.dir=run/adapters/{role}" in calls[2] and "data.dataset_dir=run/datasets/{role}" in calls[2]
    stamps = {p.stem: json.loads(p.read_text()) for p in Path("run/stamps").glob("*.json")}
    assert set(stamps) == {"collect", "datasets", "train"}
    assert all(s["key"].startswith("sha256:") and s["wall_s"] >= 0 for s in stamps.values())
    timings = json.loads(Path("run/pipeline.json").read_text())["stages"]
    assert set(timings) == {"collect", "datasets", "train"} and not any(t["skipped"] for t in timings.values())
    assert "total" in capsys.readouterr().out


def test_same_config_and_inputs_are_skipped_with_a_line_saying_so(recipe, calls, capsys):
    run_pipeline(recipe, until="train")
    calls.clear()
    capsys.readouterr()
    assert run_pipeline(recipe, until="train") == 0
    assert calls == []
    err = capsys.readouterr().err
    assert err.count("up to date") == 3 and "skipped" in err


def test_a_changed_override_reruns_train_only(recipe, calls):
    run_pipeline(recipe, until="train")
    calls.clear()
    config = yaml.safe_load(recipe.read_text())
    config["train"]["overrides"] = ["sft.max_steps=2"]
    recipe.write_text(yaml.safe_dump(config))
    run_pipeline(recipe, until="train")
    assert [c.split()[0] for c in calls] == ["train"]


def test_new_upstream_data_reruns_downstream_and_identical_data_does_not(recipe, calls):
    run_pipeline(recipe, until="train")
    calls.clear()
    (Path("run/collect/traces") / "extra.jsonl").write_text("{}\n")  # outputs changed under collect's stamp
    run_pipeline(recipe, until="train")
    # collect reruns from scratch (the stray file is gone) and writes the same bytes: nothing downstream reruns
    assert [c.split()[0] for c in calls] == ["collect"]
    assert not (Path("run/collect/traces") / "extra.jsonl").exists()

    calls.clear()
    config = yaml.safe_load(recipe.read_text())
    config["collect"]["limit"] = 4  # other traces: the datasets' input changed
    recipe.write_text(yaml.safe_dump(config))
    run_pipeline(recipe, until="train")
    # the fake build writes the same bytes from other traces: the adapters' input did not change
    assert [c.split()[0] for c in calls] == ["collect", "datasets"]


def test_deleted_outputs_rerun_the_stage(recipe, calls):
    run_pipeline(recipe, until="train")
    calls.clear()
    for f in Path("run/adapters/planner").iterdir():
        f.unlink()
    run_pipeline(recipe, until="train")
    assert [c.split()[0] for c in calls] == ["train"]


def test_one_stage_alone_and_a_missing_input(recipe, calls, capsys):
    assert run_pipeline(recipe, only=["datasets"]) == 2
    assert "missing input(s) run/collect/traces" in capsys.readouterr().err and calls == []
    run_pipeline(recipe, only=["collect"])
    assert run_pipeline(recipe, only=["datasets"]) == 0
    assert [c.split()[0] for c in calls] == ["collect", "datasets"]


def test_a_failing_command_stops_the_pipeline_without_a_stamp(recipe, monkeypatch, capsys):
    monkeypatch.setattr(pipeline.subprocess, "Popen", lambda argv, env=None: _Finished(3))
    assert run_pipeline(recipe) == 3
    assert "collect: failed" in capsys.readouterr().err
    assert not Path("run/stamps/collect.json").exists()


def test_concurrent_commands_start_together_and_one_failure_fails_the_stage(tmp_path, capsys):
    """A concurrent stage starts every command before waiting for any (each waits until the
    other has started: run one after the other, the first would give up and fail), waits for
    all, and fails with the failing one's status. No wall-clock bound: the outcome does not
    depend on how fast the machine is."""
    import sys

    def meet(me: str, other: str) -> list[str]:
        code = (f"import pathlib, sys, time; pathlib.Path({str(tmp_path / me)!r}).touch(); "
                f"deadline = time.monotonic() + 60\n"
                f"while not pathlib.Path({str(tmp_path / other)!r}).exists():\n"
                f"    time.sleep(0.01)\n"
                f"    if time.monotonic() > deadline: sys.exit(9)")
        return [sys.executable, "-c", code]

    stage = pipeline.Stage("collect", [meet("a", "b"), meet("b", "a")], [], [tmp_path / "out"], concurrent=True)
    assert pipeline.run_stage(tmp_path, stage, "k")[0] == 0
    assert json.loads((tmp_path / "stamps" / "collect.json").read_text())["key"] == "k"

    fail = [sys.executable, "-c", "import sys, time; time.sleep(0.2); sys.exit(4)"]
    marker = tmp_path / "finished.txt"
    slow = [sys.executable, "-c", f"import time; time.sleep(1); open({str(marker)!r}, 'w').write('done')"]
    failing = pipeline.Stage("collect", [fail, slow], [], [tmp_path / "out"], concurrent=True)
    assert pipeline.run_stage(tmp_path, failing, "k2")[0] == 4
    assert marker.exists()  # the other command ran to its end before the stage reported
    assert "collect: failed" in capsys.readouterr().err
    assert not (tmp_path / "stamps" / "collect.json").exists()


def test_concurrent_commands_share_the_cores_among_their_llamacpp_engines(tmp_path, monkeypatch):
    """Each of a concurrent stage's commands gets its share of the cores for llama.cpp (ggml's
    threads spin while they wait: engines holding more threads than cores slow each other
    several-fold); a command run alone gets none set (its engine takes every core), and a
    value the user set is kept."""
    import os
    import sys

    from heart.runtime.llamacpp_threads import THREADS_ENV

    monkeypatch.delitem(pipeline.STAGE_ENV, THREADS_ENV, raising=False)

    def report(name: str) -> list[str]:
        code = f"import os, pathlib; pathlib.Path({str(tmp_path / name)!r}).write_text(os.environ.get({THREADS_ENV!r}, 'unset'))"
        return [sys.executable, "-c", code]

    together = pipeline.Stage("collect", [report("a"), report("b"), report("c")], [], [tmp_path / "o1"], concurrent=True)
    assert pipeline.run_stage(tmp_path, together, "k")[0] == 0
    share = str(max(1, len(os.sched_getaffinity(0)) // 3))
    assert [(tmp_path / n).read_text() for n in "abc"] == [share] * 3

    alone = pipeline.Stage("train", [report("d")], [], [tmp_path / "o2"])
    assert pipeline.run_stage(tmp_path, alone, "k")[0] == 0
    assert (tmp_path / "d").read_text() == "unset"

    monkeypatch.setitem(pipeline.STAGE_ENV, THREADS_ENV, "7")
    assert pipeline.run_stage(tmp_path, together, "k2")[0] == 0
    assert (tmp_path / "a").read_text() == "7"


def test_llamacpp_threads_come_from_the_environment_or_the_cpus(monkeypatch):
    import os

    from heart.runtime.llamacpp_threads import THREADS_ENV, default_threads

    monkeypatch.delenv(THREADS_ENV, raising=False)
    assert default_threads() == len(os.sched_getaffinity(0))
    monkeypatch.setenv(THREADS_ENV, "3")
    assert default_threads() == 3
    for bad in ("0", "two", "-1"):
        monkeypatch.setenv(THREADS_ENV, bad)
        with pytest.raises(ValueError, match=THREADS_ENV):
            default_threads()


def test_collections_run_concurrently_and_the_rest_one_at_a_time(recipe):
    config, folder = load_pipeline(recipe)
    concurrent = {s.name for s in pipeline.stages(config, folder) if s.concurrent}
    assert concurrent == {"collect", "collect_test"}


def test_eval_stages_call_the_eval_commands(recipe):
    config, folder = load_pipeline(recipe)
    by_name = {s.name: s for s in pipeline.stages(config, folder)}
    assert list(by_name) == list(pipeline.STAGE_NAMES)
    roles = [" ".join(c) for c in by_name["eval_roles"].commands]
    assert len(roles) == 1  # base and distilled in one process, sharing the model's batches
    assert roles[0].startswith("heart eval roles --data run/heldout --split test --adapters run/adapters "
                               "--model smollm2-135m --engine peft")
    assert roles[0].endswith("--out run/eval/roles-distilled --base-out run/eval/roles-base")
    e2e = [" ".join(c) for c in by_name["eval_e2e"].commands]
    assert len(e2e) == 1  # base and distilled in one process, sharing the model's batches
    assert e2e[0].startswith("heart eval e2e --env bfcl --split test --roles run/adapters --model smollm2-135m "
                             "--engine peft --limit 2")
    assert e2e[0].endswith("--out run/eval/e2e-distilled --base-out run/eval/e2e-base")
    assert " ".join(by_name["report"].commands[0]) == "heart report run/eval --out run/report"
    assert "--split test" in " ".join(by_name["collect_test"].commands[0])


def test_the_end_to_end_evaluation_may_run_on_its_own_engine(recipe):
    import dataclasses

    config, folder = load_pipeline(recipe)
    config = dataclasses.replace(config, eval=dataclasses.replace(config.eval, e2e_engine="llamacpp"))
    by_name = {s.name: s for s in pipeline.stages(config, folder)}
    assert "--engine peft" in " ".join(by_name["eval_roles"].commands[0])
    assert "--engine llamacpp" in " ".join(by_name["eval_e2e"].commands[0])


def test_a_student_reaches_both_collections_with_the_evaluation_engine(recipe):
    content = yaml.safe_load(recipe.read_text())
    recipe.write_text(yaml.safe_dump({**content, "collect": {**content.get("collect", {}), "student": "base",
                                                             "student_rate": 0.5},
                                      "eval": {**content.get("eval", {}), "engine": "llamacpp:f16"}}))
    config, folder = load_pipeline(recipe)
    by_name = {s.name: s for s in pipeline.stages(config, folder)}
    for stage in ("collect", "collect_test"):
        for command in by_name[stage].commands:
            assert "--student base --student-rate 0.5 --student-engine llamacpp:f16" in " ".join(command)


def test_an_engine_may_name_its_base_weights(recipe, tmp_path):
    content = yaml.safe_load(recipe.read_text())
    recipe.write_text(yaml.safe_dump({**content, "eval": {"engine": "llamacpp:f16"}}))
    config, folder = load_pipeline(recipe)
    by_name = {s.name: s for s in pipeline.stages(config, folder)}
    assert "--engine llamacpp:f16" in " ".join(by_name["eval_roles"].commands[0])
    assert "--engine llamacpp:f16" in " ".join(by_name["eval_e2e"].commands[0])
    recipe.write_text(yaml.safe_dump({**content, "eval": {"engine": "llamacpp:f8"}}))
    with pytest.raises(PipelineError, match="'eval.engine'.*llamacpp:f16"):
        load_pipeline(recipe)


@pytest.mark.parametrize("content, expected", [
    ({"colect": {}}, "unknown key 'colect'"),
    ({"collect": {"limt": 2}}, "unknown key 'collect.limit'".replace("limit", "limt")),
    ({"collect": {"envs": ["webshop"]}}, "'collect.envs.0'"),
    ({"eval": {"e2e": [{"limit": -1}]}}, "'eval.e2e.0.limit'"),
    ({"eval": {"e2e": [{"enf": "bfcl"}]}}, "'eval.e2e.0.enf'"),
    ("run_dir: [unclosed", "malformed YAML"),  # the one recipe reader's message (heart_distill.recipes)
    ({"eval": {"e2e": [{"loop": {"max_plan_step": 4}}]}}, "eval.e2e.0.loop: not loop settings: max_plan_step"),
    ({"eval": {"e2e": [{"loop": {"router_mode": "steps"}}]}}, "eval.e2e.0.loop: router_mode must be one of"),
    ({"collect": {"student": "base"}}, "collect.student and collect.student_rate go together"),
    ({"collect": {"student_rate": 0.5}}, "collect.student and collect.student_rate go together"),
    ({"collect": {"student": "runs/nowhere", "student_rate": 0.5}}, "collect.student must be 'base' or an adapters"),
    ({"collect": {"student_rate": 1.5, "student": "base"}}, "'collect.student_rate'"),
    ({"collect": {"router_mode": "step"}}, "collect.router_mode is now a setting of the recipe's loop: section"),
    ({"datasets": {"verifier_balanse": 2.0}}, "datasets: not build options: verifier_balanse"),
    ({"datasets": {"verifier_balance": 0.5}}, "datasets: verifier_balance must be >= 1.0"),
    ({"loop": {"planner_form": "essay"}}, "loop: planner_form must be 'plan' or 'subgoals'"),
    ({"collect": {"bfcl_categories": ["parallel_multi"]}}, "'collect.bfcl_categories.0'"),
    ({"collect": {"envs": ["custom"]}}, "the environment custom needs the recipe's tasks:"),
    ({"tasks": "tasks.jsonl", "tools": "tools.py"}, "tasks: and tools: are read by the environment custom only"),
    ({"collect": {"envs": ["custom"]}, "tasks": "nowhere.jsonl", "tools": "tools.py"},
     "tasks: nowhere.jsonl is not a file"),
])
def test_bad_pipeline_recipe_names_what_is_wrong(tmp_path, content, expected):
    path = tmp_path / "pipeline.yaml"
    path.write_text(content if isinstance(content, str) else yaml.safe_dump(content))
    with pytest.raises(PipelineError, match=expected.replace("[", r"\[").replace(".", r"\.")):
        load_pipeline(path)


@pytest.mark.parametrize("path", sorted([*(REPO / "recipes").glob("*/pipeline.yaml"), *(REPO / "recipes").glob("*/benchmark*.yaml"),
                                         *(REPO / "recipes").glob("*/your-tools*.yaml")]),
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_shipped_pipeline_recipes_load(path):
    config, folder = load_pipeline(path)
    assert path.read_text().startswith(f"# heart pipeline --recipe recipes/{path.parent.name}/{path.name}")
    assert (folder / config.train.recipe).is_file()
    assert pipeline._recipe_files(folder / config.train.recipe, config.train.roles)


def test_cache_files_a_reader_leaves_do_not_make_a_stage_stale(recipe, calls):
    run_pipeline(recipe, until="train")
    calls.clear()
    (Path("run/datasets") / "cache-0123abcd.arrow").write_bytes(b"datasets' map/filter cache")  # training read it
    run_pipeline(recipe, until="train")
    assert calls == []


def _killed_after(monkeypatch, word, leave):
    """The next command starting with ``word`` calls ``leave(command)`` (the part of its outputs
    it wrote) and dies as a SIGKILL'd process does (status -9); every other command runs as before."""
    run = pipeline.subprocess.Popen
    killed = []

    def popen(argv, env=None):
        command = argv[3:] if argv[1:3] == ["-m", "heart_distill.cli"] else argv[1:]
        if command[0] == word and not killed:
            killed.append(command)
            leave(command)
            return _Finished(-9)
        return run(argv, env=env)

    monkeypatch.setattr(pipeline.subprocess, "Popen", popen)
    return killed


def _partial_collection(command):
    traces = Path(command[command.index("--out") + 1]) / "traces"
    traces.mkdir(parents=True, exist_ok=True)
    (traces / "shard-killed.jsonl").write_text('{"kind": "episode"}\n')


def test_a_killed_stage_continues_over_its_outputs_with_its_resume_commands(recipe, calls, monkeypatch, capsys):
    killed = _killed_after(monkeypatch, "collect", _partial_collection)
    assert run_pipeline(recipe, until="train") == -9 and killed
    started = json.loads(Path("run/stamps/collect.started.json").read_text())
    assert started["key"].startswith("sha256:") and not Path("run/stamps/collect.json").exists()
    calls.clear()
    capsys.readouterr()

    assert run_pipeline(recipe, until="train") == 0
    assert "[1/3] collect: continuing an interrupted run" in capsys.readouterr().err
    assert calls[0].startswith("collect --env bfcl") and calls[0].endswith("--resume")  # the rest as before
    assert [c.split()[0] for c in calls] == ["collect", "datasets", "train"]
    assert Path("run/collect/traces/shard-killed.jsonl").exists()  # the killed run's episodes kept
    stamp = json.loads(Path("run/stamps/collect.json").read_text())
    assert stamp["key"] == started["key"] and stamp["continued_with"][0][-1] == "--resume"
    assert "--resume" not in stamp["commands"][0]  # the key hashes the stage's own commands
    assert not Path("run/stamps/collect.started.json").exists()
    assert json.loads(Path("run/pipeline.json").read_text())["stages"]["collect"]["continued"] is True

    calls.clear()
    assert run_pipeline(recipe, until="train") == 0 and calls == []  # finished: skipped as before
    assert capsys.readouterr().err.count("up to date") == 3


def test_a_changed_key_or_force_starts_an_interrupted_stage_over(recipe, calls, monkeypatch, capsys):
    _killed_after(monkeypatch, "collect", _partial_collection)
    run_pipeline(recipe, until="train")
    config = yaml.safe_load(recipe.read_text())
    config["collect"]["limit"] = 4
    recipe.write_text(yaml.safe_dump(config))
    calls.clear()
    capsys.readouterr()
    assert run_pipeline(recipe, until="train") == 0
    assert "collect: running from empty outputs" in capsys.readouterr().err
    assert "--resume" not in calls[0] and not Path("run/collect/traces/shard-killed.jsonl").exists()

    _killed_after(monkeypatch, "collect", _partial_collection)
    run_pipeline(recipe, only=["collect"], force=True)
    calls.clear()
    capsys.readouterr()
    assert run_pipeline(recipe, only=["collect"], force=True) == 0
    assert "--force: an interrupted run is not continued" in capsys.readouterr().err
    assert "--resume" not in calls[0] and not Path("run/collect/traces/shard-killed.jsonl").exists()


def test_a_stage_that_cannot_continue_starts_over(recipe, calls, monkeypatch, capsys):
    run_pipeline(recipe, only=["collect"])
    _killed_after(monkeypatch, "datasets", lambda command: Path("run/datasets/planner").mkdir(parents=True))
    assert run_pipeline(recipe, only=["datasets"]) == -9
    calls.clear()
    capsys.readouterr()
    assert run_pipeline(recipe, only=["datasets"]) == 0
    assert "an interrupted run of this stage is not continued" in capsys.readouterr().err
    assert calls == ["datasets build run/collect --out run/datasets --overwrite"]
    assert not Path("run/datasets/planner").exists()


def _planner_done_router_halfway(command):
    adapters = Path("run/adapters")
    (adapters / "planner").mkdir(parents=True)
    (adapters / "planner" / "manifest.json").write_text('{"role": "planner"}')
    (adapters / "router" / "checkpoints" / "checkpoint-4").mkdir(parents=True)


def test_the_train_continuation_skips_finished_roles_and_keeps_checkpoints(recipe, calls, monkeypatch, capsys):
    run_pipeline(recipe, until="datasets")
    _killed_after(monkeypatch, "train", _planner_done_router_halfway)
    assert run_pipeline(recipe, only=["train"]) == -9
    calls.clear()
    assert run_pipeline(recipe, only=["train"]) == 0
    assert len(calls) == 1 and "--roles router " in calls[0]  # the planner's adapter is finished
    assert "output.overwrite" not in calls[0]  # so train/sft.py resumes from the router's checkpoint
    assert "output.dir=run/adapters/{role}" in calls[0] and "sft.max_steps=1" in calls[0]
    assert Path("run/adapters/router/checkpoints/checkpoint-4").is_dir()
    assert Path("run/adapters/planner/manifest.json").read_text() == '{"role": "planner"}'  # not retrained


def test_a_train_run_killed_after_its_last_role_finishes_by_stamping(recipe, calls, monkeypatch):
    run_pipeline(recipe, until="datasets")

    def every_role_done(command):
        for role in ("planner", "router"):
            (Path("run/adapters") / role).mkdir(parents=True)
            (Path("run/adapters") / role / "manifest.json").write_text("{}")

    _killed_after(monkeypatch, "train", every_role_done)
    run_pipeline(recipe, only=["train"])
    calls.clear()
    assert run_pipeline(recipe, only=["train"]) == 0 and calls == []
    assert json.loads(Path("run/stamps/train.json").read_text())["continued_with"] == []


def test_episode_stages_continue_with_resume_and_the_rest_start_over(recipe):
    config, folder = load_pipeline(recipe)
    by_name = {s.name: s for s in pipeline.stages(config, folder)}
    for name in ("collect", "collect_test", "eval_e2e"):
        stage = by_name[name]
        assert stage.resume() == [[*command, "--resume"] for command in stage.commands]
    assert all(by_name[name].resume is None for name in ("datasets", "heldout", "eval_roles", "eval_attack", "report"))


def test_the_library_stage_puts_each_trained_adapter_before_the_runs_library(recipe, calls):
    config, folder = load_pipeline(recipe)
    assert {s.name: s for s in pipeline.stages(config, folder)}["library"].commands == []  # off by default
    content = yaml.safe_load(recipe.read_text())
    recipe.write_text(yaml.safe_dump({**content, "library": {"roles": ["planner", "router"], "rows": 8},
                                      "eval": {"engine": "llamacpp:f16"}}))
    run_pipeline(recipe, until="library")
    admissions = [c for c in calls if c.startswith("library adapter")]
    assert admissions == [f"library adapter --library run/library --role {role} --adapter run/adapters/{role} "
                          "--data run/datasets --limit 8 --engine llamacpp:f16" for role in ("planner", "router")]
    Path("run/library").mkdir(parents=True, exist_ok=True)
    (Path("run/library") / "library.json").write_text("{}")
    run_pipeline(recipe, ["library"], force=True)
    assert (Path("run/library") / "library.json").is_file()  # a rerun keeps the library and its history


def test_a_library_stage_needs_an_engine_the_library_validates_with(recipe):
    content = yaml.safe_load(recipe.read_text())
    recipe.write_text(yaml.safe_dump({**content, "library": {"roles": ["verifier"]}, "eval": {"engine": "llamacpp:q8_0"}}))
    with pytest.raises(PipelineError, match="library.roles needs eval.engine one of peft, llamacpp"):
        load_pipeline(recipe)


def test_the_datasets_section_reaches_heart_datasets_build_as_flags(tmp_path):
    recipe = tmp_path / "pipeline.yaml"
    recipe.write_text(yaml.safe_dump({"run_dir": str(tmp_path / "run"),
                                      "train": {"recipe": str(REPO / "recipes/smollm2-135m/roles.yaml")},
                                      "datasets": {"verifier_balance": 2.0, "relevance_balance": None, "seed": 3}}))
    config, folder = load_pipeline(recipe)
    (command,) = next(s for s in pipeline.stages(config, folder) if s.name == "datasets").commands
    assert command[command.index("--verifier-balance") + 1] == "2.0" and "--relevance-balance" not in command
    assert command[command.index("--seed") + 1] == "3"


def test_the_recipes_loop_section_reaches_every_stage_that_runs_episodes(tmp_path):
    """One declaration of the Router's mode and the Planner's form: both collections take the
    loop's policy settings (the datasets learn those modes), every end-to-end run all of them,
    its own loop over them; one collection per BFCL category."""
    recipe = tmp_path / "pipeline.yaml"
    recipe.write_text(yaml.safe_dump({
        "run_dir": str(tmp_path / "run"), "train": {"recipe": str(REPO / "recipes/smollm2-135m/roles.yaml")},
        "loop": {"router_mode": "step", "planner_form": "subgoals", "max_plan_steps": 4},
        "collect": {"bfcl_categories": ["multi_turn_base", "parallel"]},
        "heldout": {"bfcl_categories": ["parallel_multiple"]},
        "eval": {"e2e": [{"env": "bfcl", "loop": {"max_plan_steps": 3}}]}}))
    config, folder = load_pipeline(recipe)
    by_name = {s.name: s for s in pipeline.stages(config, folder)}
    for stage in ("collect", "collect_test"):
        for command in by_name[stage].commands:
            assert command[command.index("--router-mode") + 1] == "step"
            assert command[command.index("--planner-form") + 1] == "subgoals"
            assert "--max-plan-steps" not in command  # a turn setting: heart collect does not take it
    assert [c[c.index("--category") + 1] if "--category" in c else c[c.index("--env") + 1]
            for c in by_name["collect"].commands] == ["bfcl", "parallel", "agentdojo"]
    assert "parallel_multiple" in by_name["collect_test"].commands[0]
    assert "--verifier-balance" not in by_name["datasets"].commands[0]  # the default: no flag
    (e2e_command,) = by_name["eval_e2e"].commands
    assert e2e_command[e2e_command.index("--max-plan-steps") + 1] == "3"  # the run's own loop over the recipe's
    assert e2e_command[e2e_command.index("--planner-form") + 1] == "subgoals"


def test_an_e2e_runs_loop_section_reaches_heart_eval_e2e_as_the_flags_its_settings_derive(tmp_path):
    """Typed loop settings in the recipe, flags on the command line: only what differs from the
    loop's defaults, spelt as ``heart eval e2e`` parses it back to the same LoopConfig."""
    import argparse

    from heart.settings import LoopConfig
    from heart_distill.eval import e2e

    recipe = tmp_path / "pipeline.yaml"
    loop = {"max_plan_steps": 4, "router_mode": "step", "messages": False, "replan_budget": 3}
    recipe.write_text(yaml.safe_dump({"run_dir": str(tmp_path / "run"),
                                      "train": {"recipe": str(REPO / "recipes/smollm2-135m/roles.yaml")},
                                      "eval": {"e2e": [{"env": "bfcl", "args": ["--category", "simple"],
                                                        "loop": loop}]}}))
    config, folder = load_pipeline(recipe)
    (command,) = next(s for s in pipeline.stages(config, folder) if s.name == "eval_e2e").commands
    assert command[command.index("--category"):command.index("--out")] == [
        "--category", "simple", "--max-plan-steps", "4", "--no-messages", "--router-mode", "step"]  # (YAML key order)
    parser = argparse.ArgumentParser()
    e2e.add_arguments(parser)
    parsed = e2e.config_from_args(parser.parse_args(command[3:]))
    assert parsed.loop == LoopConfig(**loop)


def test_a_custom_recipe_runs_every_episode_stage_over_its_tasks_file_and_tools(tmp_path, monkeypatch):
    """env: custom in a pipeline recipe: each collection and end-to-end run gets --tasks and
    --tools, and the tasks file's bytes enter the keys of the stages that read it."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tasks.jsonl").write_text('{"id": "a", "request": "Say hi."}\n')
    recipe = tmp_path / "pipeline.yaml"
    recipe.write_text(yaml.safe_dump({
        "run_dir": "run", "tasks": "tasks.jsonl", "tools": "mcp:python -m my_server",
        "train": {"recipe": str(REPO / "recipes/smollm2-135m/roles.yaml")},
        "collect": {"envs": ["custom"]}, "heldout": {"envs": ["custom"]}, "eval": {"e2e": [{"env": "custom"}]}}))
    config, folder = load_pipeline(recipe)
    by_name = {s.name: s for s in pipeline.stages(config, folder)}
    for name in ("collect", "collect_test", "eval_e2e"):
        (command,) = by_name[name].commands
        assert command[command.index("--env") + 1] == "custom"
        assert command[command.index("--tasks") + 1] == "tasks.jsonl"
        assert command[command.index("--tools") + 1] == "mcp:python -m my_server"
        assert Path("tasks.jsonl") in by_name[name].inputs
    before = pipeline.stage_key(by_name["collect"])
    (tmp_path / "tasks.jsonl").write_text('{"id": "a", "request": "Say hello."}\n')
    assert pipeline.stage_key(by_name["collect"]) != before
    # a script a task's setup runs is an input too: its bytes decide the tasks' initial state
    (tmp_path / "make_state.py").write_text("print('v1')\n")
    (tmp_path / "tasks.jsonl").write_text('{"id": "a", "request": "Say hi.", "setup": "python make_state.py"}\n')
    config, folder = load_pipeline(recipe)
    collect = {s.name: s for s in pipeline.stages(config, folder)}["collect"]
    assert Path("make_state.py") in collect.inputs
    before = pipeline.stage_key(collect)
    (tmp_path / "make_state.py").write_text("print('v2')\n")
    assert pipeline.stage_key(collect) != before
