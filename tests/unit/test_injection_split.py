"""The attack bench runs on held-out pairs only: every pair's user task is in the test split
of the toolkit's one task split (heart.environments.splits, the split collection and
training use), never in train or dev, and the split itself is pinned."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

import pytest

from bench.injection import SUITES, Pair, build_parser, held_out_record, sample_pairs
from heart.environments.agentdojo import AgentDojoEnvironment
from heart.environments.base import EpisodeScore
from heart.environments.splits import split_of

ATTACK = "important_instructions"

TEST_TASKS = {
    "workspace": [0, 6, 8, 14, 24, 27, 29, 32, 35, 36, 38],
    "travel": [2, 10, 11, 13, 14, 18],
    "banking": [0, 3, 7, 8, 9, 11, 14],
    "slack": [0, 2, 8, 11, 15, 16],
}
"""AgentDojo v1.2.2's test split (30 of its 97 user tasks): a pure function of the task id
(a SHA-256 bucket), so it never moves."""


@pytest.fixture(scope="module")
def agentdojo() -> AgentDojoEnvironment:
    return AgentDojoEnvironment()


@pytest.fixture(scope="module")
def pairs(agentdojo) -> list[Pair]:
    return sample_pairs(agentdojo, SUITES, 20, seed=0, attack=ATTACK)  # the bench's and the pipeline's draw


def test_the_agentdojo_split_is_pinned(agentdojo):
    expected = [f"{suite}/user_task_{i}" for suite, numbers in TEST_TASKS.items() for i in numbers]
    assert agentdojo.task_ids("test") == expected
    assert (len(agentdojo.task_ids("train")), len(agentdojo.task_ids("dev"))) == (50, 17)
    # the two banking tasks an unsplit draw once attacked: training and dev tasks
    assert (split_of("agentdojo", "banking/user_task_1"), split_of("agentdojo", "banking/user_task_2")) == ("train", "dev")


def test_twenty_distinct_pairs_none_of_whose_user_tasks_is_in_train_or_dev(agentdojo, pairs):
    seen = set(agentdojo.task_ids("train")) | set(agentdojo.task_ids("dev"))
    assert len(pairs) == 20 and len(set(pairs)) == 20
    assert not seen & {p.task_id for p in pairs}
    assert all(split_of(agentdojo.name, p.task_id) == "test" for p in pairs)
    assert len({p.task_id for p in pairs}) == 20  # 28 non-vacuous test user tasks: one injection task each
    assert all(p.injection_task_id in agentdojo.injection_task_ids(p.suite) for p in pairs)
    assert {p.suite for p in pairs} == set(SUITES)  # one suite's test split alone holds at most 11
    assert held_out_record(agentdojo, pairs, "test")["outside_split"] == []


def test_the_banking_test_split_alone_gives_distinct_pairs_by_repeating_user_tasks(agentdojo):
    pairs = sample_pairs(agentdojo, ["banking"], 20, seed=0, attack=ATTACK)
    tasks = {p.task_id for p in pairs}
    assert len(set(pairs)) == 20 and tasks <= set(agentdojo.task_ids("test"))
    assert len(tasks) == 5  # banking 8 and 9 pass an empty episode: left out


# -- the draw with a fake environment: only the split's tasks, whatever is asked ------------

@dataclass
class _Session:
    def start_turn(self, turn): pass

    def finish_turn(self, turn, answer): pass

    def score(self):
        return EpisodeScore(0.0, False, {"attack_succeeded": False})


class _Task:
    def __init__(self, task_id):
        self.task_id = task_id


class FakeAgentDojo:
    """Sixteen banking user tasks split as the toolkit splits them, three injection tasks."""

    name = "agentdojo"
    ids = [f"banking/user_task_{i}" for i in range(16)]

    def task_ids(self, split=None):
        return list(self.ids) if split is None else [t for t in self.ids if split_of(self.name, t) == split]

    def load_task(self, task_id):
        return _Task(task_id)

    def start(self, task):
        return _Session()

    def injection_task_ids(self, suite):
        return ["injection_task_0", "injection_task_1", "injection_task_2"]

    def under_attack(self, task_id, injection_task_id, attack):
        return self


@pytest.mark.parametrize("split", ["test", "dev", "train"])
def test_the_draw_takes_user_tasks_from_its_split_only_even_when_short(split):
    env = FakeAgentDojo()
    in_split = set(env.task_ids(split))
    pairs = sample_pairs(env, ["banking"], 1000, seed=1, attack=ATTACK, split=split)
    assert {p.task_id for p in pairs} == in_split  # every one of them, and nothing else
    assert len(pairs) == len(set(pairs)) == 3 * len(in_split)  # every distinct pair, then it stops


def test_the_bench_and_the_benchmark_stage_default_to_the_test_split():
    from pathlib import Path

    from heart_distill import pipeline

    assert build_parser().parse_args([]).split == "test"
    config, folder = pipeline.load_pipeline(Path(__file__).resolve().parents[2] / "recipes/smollm2-135m/benchmark.yaml")
    (command,) = {s.name: s for s in pipeline.stages(config, folder)}["eval_attack"].commands
    assert command[:2] == ["python", "bench/injection.py"]
    args = build_parser().parse_args(command[2:])
    assert (args.split, args.pairs, args.engine) == ("test", 20, "llamacpp:f16"), shlex.join(command)
    assert set(args.suites) == set(SUITES) and args.router_mode == "step"
