"""End-to-end evaluation: figures come from the benchmarks' own checkers, and
infrastructure errors are counted as errored, never as failures."""

from __future__ import annotations

import dataclasses
import json

import pytest

from heart.settings import POLICY as POLICY_SETTINGS, LoopConfig
from heart_distill.eval import e2e
from heart_distill.eval.e2e import E2EConfig, gold_teacher, run
from heart.runtime.scripted import ScriptedBackend


def _perturb(value):
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 7
    if isinstance(value, str):
        return value + "_perturbed"
    return [] if isinstance(value, list) else value


class PerturbedGold:
    """The gold teacher with the first argument of every Primitive answer changed."""

    def __init__(self, gold):
        self.gold, self.name = gold, gold.name + "+perturbed"

    def generate(self, role, messages, sampling=None):
        generation = self.gold.generate(role, messages, sampling)
        if role != "primitive":
            return generation
        answer = json.loads(generation.text)
        if answer.get("arguments"):
            first = next(iter(answer["arguments"]))
            answer["arguments"][first] = _perturb(answer["arguments"][first])
        return dataclasses.replace(generation, text=json.dumps(answer))

    def generate_batch(self, requests):
        return [self.generate(r.role, r.messages, r.sampling) for r in requests]


def perturbed(task, environment, seed):
    return PerturbedGold(gold_teacher(task, environment, seed))


CASES = [
    # (env, category, tasks) — all test-split tasks whose checker reads the calls' arguments
    ("bfcl", None, ("multi_turn_base_1", "multi_turn_base_2")),
    ("bfcl", "simple", ("simple_python_3", "simple_python_6")),
    ("bfcl", "parallel_multiple", ()),
    ("agentdojo", None, ("workspace/user_task_6", "workspace/user_task_8")),
]


@pytest.mark.parametrize("env, category, tasks", CASES)
def test_gold_scores_one_and_perturbed_zero_by_the_benchmark_checker(tmp_path, env, category, tasks):
    config = E2EConfig(env=env, category=category, tasks=tasks, limit=None if tasks else 2, loop=LoopConfig(replan_budget=0),
                       roles_spec="teacher:gold", out=str(tmp_path / "gold"))
    gold = run(config)
    assert gold["counts"]["errored"] == 0
    assert set(gold["per_task_score"].values()) == {1.0}
    bad = run(dataclasses.replace(config, out=str(tmp_path / "bad")), teacher_for_task=perturbed)
    assert bad["counts"]["errored"] == 0 and set(bad["per_task_score"].values()) == {0.0}
    assert bad["figures"]["success_rate"]["value"] == 0.0
    episodes = [json.loads(line) for line in (tmp_path / "bad" / e2e.EPISODES).read_text().splitlines()]
    # the checker's own verdict is kept with each episode (BFCL names an error type)
    if env == "bfcl":
        assert all(e["checker"].get("error_type") for e in episodes)
    assert all(e["role_calls"] > 0 and e["prompt_tokens"] > 0 for e in episodes)


def test_tasks_outside_the_split_are_refused(tmp_path):
    with pytest.raises(ValueError, match="not in the 'test' split"):
        run(E2EConfig(env="bfcl", category="simple", tasks=("simple_python_0",), roles_spec="teacher:gold",
                      out=str(tmp_path)))


def _raising(role, messages):
    raise RuntimeError("CUDA out of memory")


def test_backend_exceptions_make_episodes_errored_not_failed(tmp_path):
    results = run(E2EConfig(env="bfcl", category="simple", limit=2, roles_spec="teacher:gold", out=str(tmp_path)),
                  backend=ScriptedBackend(_raising, name="broken"))
    assert results["counts"] == {**results["counts"], "episodes": 2, "errored": 2}
    assert "out of memory" in results["errored"][0]["error"]
    assert results["figures"]["success_rate"]["n"] == 0  # nothing scored as a model failure


def test_a_crashing_checker_is_errored_and_the_others_still_count(tmp_path, monkeypatch):
    from heart.environments import bfcl_ast

    original = bfcl_ast.BFCLASTSession.score

    def flaky(self):
        if self.task.task_id == "simple_python_3":
            raise RuntimeError("checker crashed")
        return original(self)

    monkeypatch.setattr(bfcl_ast.BFCLASTSession, "score", flaky)
    results = run(E2EConfig(env="bfcl", category="simple", tasks=("simple_python_3", "simple_python_6"),
                            roles_spec="teacher:gold", out=str(tmp_path)))
    assert results["counts"]["errored"] == 1
    assert results["errored"][0]["task_id"] == "simple_python_3"
    assert results["figures"]["success_rate"] == {**results["figures"]["success_rate"], "value": 1.0, "n": 1}


def test_the_command_exits_non_zero_when_everything_errored(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(e2e, "shared_backend", lambda models, *a, **kw: ScriptedBackend(_raising, name="broken"))
    code = e2e.main(["--env", "bfcl", "--category", "simple", "--limit", "1", "--roles", "base",
                     "--out", str(tmp_path)])
    assert code == 1
    assert "every episode errored" in capsys.readouterr().err


def test_pass_hat_k_over_seeds(tmp_path):
    results = run(E2EConfig(env="bfcl", category="simple", limit=2, seeds=(0, 1), roles_spec="teacher:gold",
                            out=str(tmp_path)))
    assert results["counts"]["episodes"] == 4
    assert results["pass_hat_k"] == {"1": {"value": 1.0, "n": 2}, "2": {"value": 1.0, "n": 2}}


def test_sides_run_together_write_their_own_results_on_the_same_tasks(tmp_path):
    config = E2EConfig(env="bfcl", category="simple", limit=2, roles_spec="teacher:gold", out=str(tmp_path / "a"))
    other = dataclasses.replace(config, out=str(tmp_path / "b"))
    first, second = e2e.run_sides([config, other])
    assert first["per_task_score"].keys() == second["per_task_score"].keys()
    assert first["counts"]["sides_run_together"] == 2
    for side in ("a", "b"):
        assert json.loads((tmp_path / side / e2e.RESULTS).read_text())["counts"]["episodes"] == 2
    with pytest.raises(ValueError, match=r"\['limit'\] differ"):
        e2e.run_sides([config, dataclasses.replace(other, limit=1)])


def test_each_role_call_gets_its_roles_decoding_budget(tmp_path):
    from heart_distill.eval.roles import MAX_NEW_TOKENS

    seen = {}

    def record(role, messages, sampling=None):
        seen[role] = sampling.max_new_tokens
        raise RuntimeError("stop here")

    backend = ScriptedBackend(lambda role, messages: None, name="recorder")
    backend.generate = record
    run(E2EConfig(env="bfcl", category="simple", limit=1, roles_spec="teacher:gold", out=str(tmp_path)),
        backend=backend)
    assert seen and all(seen[role] == MAX_NEW_TOKENS[role] for role in seen)


def test_the_unadapted_view_asks_for_the_base():
    asked = []

    class Recorder:
        name = "recorder"

        def generate(self, role, messages, sampling=None):
            asked.append(role)

        def generate_batch(self, requests):
            asked.extend(r.role for r in requests)

        def client(self):
            return "client"

    from heart.runtime.base import GenerationRequest

    from heart_distill.eval.models import UnadaptedView

    view = UnadaptedView(Recorder())
    view.generate("planner", [])
    view.generate_batch([GenerationRequest("router", [], None)])
    assert asked == ["base", "base"] and view.client() == "client"


POLICY_FLAGS = ["--budget", "1", "--verify", "attempt", "--middleware", "none", "--relevance", "--no-messages",
                "--validation", "none", "--router-mode", "step", "--max-plan-steps", "4", "--no-constrain"]
POLICY = {"replan_budget": 1, "verify": "attempt", "middleware": "none", "relevance": True, "messages": False,
          "validation": "none", "router_mode": "step", "max_plan_steps": 4, "constrained": False}


def _parsed(*argv):
    import argparse

    parser = argparse.ArgumentParser()
    e2e.add_arguments(parser)
    return e2e.config_from_args(parser.parse_args(["--env", "bfcl", "--out", "o", *argv]))


def test_the_loop_policy_flags_reach_the_loop_config_in_the_worker_a_ray_actor_builds(monkeypatch):
    import pickle

    import heart.episode

    assert _parsed().loop == LoopConfig()  # one declaration: the flags' defaults are LoopConfig's
    config = _parsed(*POLICY_FLAGS)
    assert config.loop == LoopConfig(**POLICY)
    seen = []

    def capture(environment, task, backend, config, **kw):
        seen.append(config)
        raise RuntimeError("captured")

    monkeypatch.setattr(heart.episode, "run_episode", capture)
    for category, budget in ((None, 1), ("simple", 0)):  # single-turn BFCL: B = 0 whatever --budget says
        side = dataclasses.replace(config, category=category, roles_spec="teacher:gold")
        # what executors.run_jobs ships to a Ray actor: the spec, pickled
        spec = pickle.loads(pickle.dumps(e2e.E2EWorkerSpec((side,))))
        worker = e2e.E2EWorker(spec)
        task = worker.environment.task_ids("test")[0]
        worker.run_shard(0, [(0, task, 0)], lambda result: None)
        assert {k: getattr(seen[-1], k) for k in POLICY} == {**POLICY, "replan_budget": budget}


def test_an_evaluation_runs_under_the_policy_its_flags_name(tmp_path):
    out = tmp_path / "e2e"
    assert e2e.main(["--env", "bfcl", "--category", "simple", "--limit", "1", "--roles", "teacher:gold",
                     "--relevance", "--verify", "attempt", "--out", str(out)]) == 0
    assert json.loads((out / e2e.RESULTS).read_text())["figures"]["success_rate"]["value"] == 1.0
    events = [json.loads(line) for line in (out / e2e.TRACE).read_text().splitlines()]
    modes = {(e.get("extra") or {}).get("mode") for e in events if e.get("role") == "primitive"}
    assert "relevance" in modes  # ToolFace's candidates judged before the Planner saw them
    recorded = json.loads((out / "e2e-run.json").read_text())
    assert {k: recorded["loop." + k] for k in POLICY_SETTINGS if k not in ("relevance_thresholds", "planner_form")} \
        == {"replan_budget": 3, "verify": "attempt", "relevance": True, "messages": True, "middleware": "default",
            "validation": "default", "router_mode": "plan"}
    assert "loop.relevance_thresholds" not in recorded  # unset: left out, as in the records of earlier runs
    assert "loop.planner_form" not in recorded  # the default form: left out, as in the records of earlier runs


def test_harness_and_middleware_together_are_refused(tmp_path, capsys):
    from heart.harness import Harness, save_harness

    save_harness(Harness("h"), tmp_path / "harness")
    assert e2e.main(["--env", "bfcl", "--category", "simple", "--limit", "1", "--roles", "teacher:gold",
                     "--harness", str(tmp_path / "harness"), "--middleware", "none", "--out", str(tmp_path)]) == 2
    assert "--harness brings its own middleware" in capsys.readouterr().err
