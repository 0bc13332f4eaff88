"""The train / dev / test split: a pure function of (environment, task id)."""

from __future__ import annotations

import math

import pytest

from heart.environments import BFCL_CATEGORIES, SPLITS, load_environment, split_of
from heart.environments.splits import bfcl_canonical_ids
from heart.environments.agentdojo import AgentDojoEnvironment
from heart.environments.bfcl import BFCLEnvironment

SPLIT_COUNTS = {
    "bfcl": {"train": 122, "dev": 22, "test": 56},
    "agentdojo": {"train": 50, "dev": 17, "test": 30},
}
"""Pinned: a change here moves tasks between splits and leaks training data into tests."""


@pytest.fixture(scope="module", params=["bfcl", "agentdojo"])
def env(request):
    return BFCLEnvironment() if request.param == "bfcl" else AgentDojoEnvironment()


def test_split_of_is_deterministic():
    assert split_of("bfcl", "multi_turn_base_0") == split_of("bfcl", "multi_turn_base_0")
    assert split_of("bfcl", "multi_turn_base_0") in SPLITS
    assert sum(SPLITS.values()) == pytest.approx(1.0)


def test_split_depends_on_the_environment_name():
    ids = [f"task_{i}" for i in range(200)]
    assert [split_of("bfcl", i) for i in ids] != [split_of("agentdojo", i) for i in ids]


def test_splits_are_disjoint_and_cover_all_tasks_in_order(env):
    all_ids = env.task_ids()
    parts = {name: env.task_ids(name) for name in SPLITS}
    for name, ids in parts.items():
        assert ids == [i for i in all_ids if i in set(ids)]  # the stable order is kept
        for other, other_ids in parts.items():
            if other != name:
                assert not set(ids) & set(other_ids)
    assert sorted(sum(parts.values(), [])) == sorted(all_ids)
    assert len(set(all_ids)) == len(all_ids)


def test_split_fractions_are_near_their_targets(env):
    n = len(env.task_ids())
    for name, fraction in SPLITS.items():
        observed = len(env.task_ids(name)) / n
        # three binomial standard deviations: hashing is uniform, but n is small
        assert abs(observed - fraction) <= 3 * math.sqrt(fraction * (1 - fraction) / n), name


def test_split_counts_are_pinned(env):
    assert {name: len(env.task_ids(name)) for name in SPLITS} == SPLIT_COUNTS[env.name]


def test_splits_are_stable_across_calls_and_instances(env):
    fresh = type(env)()
    for name in SPLITS:
        assert env.task_ids(name) == env.task_ids(name) == fresh.task_ids(name)


def _first_turns(split: str) -> dict[str, tuple[str, str]]:
    """First user turn → (category, task id) of every task of ``split`` in every BFCL
    category a command can run."""
    out = {}
    for category in BFCL_CATEGORIES:
        environment = load_environment("bfcl", category)
        for task_id in environment.task_ids(split):
            out.setdefault(environment.load_task(task_id).turns[0].strip(), (category, task_id))
    return out


def test_no_bfcl_test_task_shares_its_first_turn_with_a_train_or_dev_task_of_any_category():
    test = _first_turns("test")
    assert len(test) > 300  # every category contributes: the check below is not vacuous
    for split in ("train", "dev"):
        leaks = [(test[turn], where) for turn, where in _first_turns(split).items() if turn in test]
        assert not leaks, f"{len(leaks)} test tasks ask what a {split} task asks, e.g. {leaks[:3]}"


@pytest.mark.parametrize("family", ["multi_turn_long_context", "multi_turn_miss_func", "multi_turn_miss_param"])
def test_a_bfcl_rewrite_takes_the_split_of_the_base_task_it_rewrites(family):
    assert all(split_of("bfcl", f"{family}_{i}") == split_of("bfcl", f"multi_turn_base_{i}") for i in range(200))


def test_a_multiple_task_built_from_a_simple_one_takes_its_split():
    canonical = bfcl_canonical_ids()
    built = {t: c for t, c in canonical.items() if t.startswith("multiple_") and c.startswith("simple_python_")}
    assert len(built) >= 90  # BFCL's multiple category reuses 96 simple_python queries
    assert all(split_of("bfcl", t) == split_of("bfcl", c) for t, c in built.items())
