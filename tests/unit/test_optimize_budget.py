"""heart optimize's budget rule and per-run proposal counts.

A fake evaluator stands in for rollouts: every episode is fresh (a rollout, as a prompt edit
always is), the seed harness fails every task, and a candidate passes every task when the
test says it improves. A scripted proposer hands out the proposals a test needs, one per
mutation slot, so each outcome (gated, rejected, out of budget, duplicate, bad, none) can be
made to happen and counted.
"""

from __future__ import annotations

import argparse
import random
import re
from pathlib import Path

import pytest

from heart.harness import Harness
from heart_distill.eval.optimize.clusters import Cluster
from heart_distill.eval.optimize.proposers import Proposal
from heart_distill.eval.optimize.protocol import load_recipe
from heart_distill.eval.optimize.rollouts import Episode, Evaluation, TaskRef
from heart_distill.eval.optimize.search import SearchConfig, min_budget, search

REPAIR = [TaskRef("bfcl:simple", f"train_{i}") for i in range(4)]
GATE = [TaskRef("bfcl:simple", f"dev_{i}") for i in range(4)]


class FakeEvaluator:
    """The seed (c000) and every candidate not in ``improving`` fail each task; the rest pass."""

    def __init__(self, improving: set[str]):
        self.improving = improving

    def __call__(self, tasks: list[TaskRef], folder: str) -> Evaluation:
        score = 1.0 if Path(folder).name in self.improving else 0.0
        checker = {} if score else {"error_type": "wrong_result", "error": "wrong value"}
        return Evaluation({t.key: Episode(t, score, False, True, 1, 10, {"score": score, "checker": checker})
                           for t in tasks})


def edit(text: str) -> Harness:
    return Harness(text, (("router", "append", text),))


class ScriptedProposer:
    """Hands out ``script`` in order (then fresh prompt edits): a Harness, None (nothing to
    propose) or an error string (an unusable answer)."""

    name = "scripted"

    def __init__(self, script: list[Harness | str | None] | None = None):
        self.script = list(script or [])

    def propose(self, parent: Harness, slot: str, cluster: Cluster, catalog: list, name: str,
                rng: random.Random) -> Proposal:
        step = self.script.pop(0) if self.script else edit(f"hint {name}")
        if isinstance(step, str):
            return Proposal(None, error=step, raw=step)
        if step is None:
            return Proposal(None, rationale="nothing for this slot")
        return Proposal(step, rationale=f"scripted {name}")


def run(tmp_path: Path, budget: int, improving: set[str], generations: int = 1, mutations: int = 3,
        script: list | None = None):
    config = SearchConfig(generations=generations, mutations=mutations, population=5, budget=budget,
                          slots=("prompt",))
    return search(Harness("shipped"), REPAIR, GATE, FakeEvaluator(improving), ScriptedProposer(script), {},
                  config, random.Random(0), tmp_path)


def write_recipe(tmp_path: Path, budget: int) -> Path:
    """2 conditions x 2 tasks per set: 4 repair + 4 gate tasks per run, as the CPU recipe has."""
    path = tmp_path / "optimize.yaml"
    path.write_text(f"out: {tmp_path / 'out'}\nconditions: [bfcl:simple, bfcl:multiple]\n"
                    "pools: {repair: 2, gate: 3, scorecard: 3}\nsizes: {repair: 2, gate: 2, scorecard: 2}\n"
                    f"search: {{generations: 2, mutations: 3, population: 5, budget: {budget}}}\n")
    return path


ARITHMETIC = "budget 12 < 16 = seed 8 (4 repair + 4 gate episodes) + one candidate's 4 repair + 4 gate episodes"


def test_the_budget_rule_is_the_seed_plus_each_candidates_worst_case():
    assert min_budget(4, 4) == 16 and min_budget(4, 4, candidates=2) == 24
    assert min_budget(42, 42) == 168  # the Qwen3-8B recipe: 7 conditions x 6 repair, 6 gate; B = 400


def test_a_recipe_under_the_rule_is_refused_at_load_with_the_arithmetic(tmp_path):
    with pytest.raises(ValueError, match=re.escape(f"search.budget: {ARITHMETIC}")):
        load_recipe(write_recipe(tmp_path, 12))
    assert load_recipe(write_recipe(tmp_path, 16)).search_config.budget == 16


def test_the_cli_refuses_it_before_any_rollout(tmp_path, capsys):
    from heart_distill.eval.optimize.cli import add_arguments, main

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--recipe", str(write_recipe(tmp_path, 12)), "--stage", "search"])
    assert main(args) == 2
    assert ARITHMETIC in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_search_refuses_it_too(tmp_path):
    with pytest.raises(ValueError, match="budget 15 < 16"):
        run(tmp_path, 15, improving={"c001"})


def test_at_the_rule_an_improving_candidate_is_gated_and_selected(tmp_path):
    result = run(tmp_path, min_budget(4, 4), improving={"c001"}, generations=2, mutations=1)
    assert result.selected.id == "c001" and result.gate_lift == 100.0
    assert result.spent["rollouts"] == 16
    # the second generation's parent is c001, which fails no repair task: nothing left to repair
    assert result.proposals["gated"] == 1 and result.proposals["unfilled"] == {
        "not asked: parent c001 fails no repair task": 1}


@pytest.mark.parametrize("budget, statuses", [
    (min_budget(4, 4, candidates=2), ["gated", "gated", "out of budget (repair)"]),
    (min_budget(4, 4, candidates=2) - 1, ["gated", "out of budget (gate)"]),  # the rule is tight
])
def test_the_rule_counts_as_the_search_charges(tmp_path, budget, statuses):
    result = run(tmp_path, budget, improving={"c001", "c002", "c003"})
    assert [c.status for c in result.candidates[1:]] == statuses
    assert result.spent["rollouts"] <= budget


def test_each_run_counts_what_it_proposed_gated_and_why_not(tmp_path):
    a, b, c = edit("a"), edit("b"), edit("c")
    # c001 nothing, c002 gated (16), c003 the same harness, c004 unusable (17), c005 no repair gain (21),
    # c006 improving but 21 + 4 > 24; the second generation is never asked
    result = run(tmp_path, 24, improving={"c002", "c006"}, generations=2, mutations=6,
                 script=[None, a, a, "not JSON", b, c])
    tally = result.proposals
    assert tally["planned"] == 12 and tally["proposed"] == 5 and tally["gated"] == 1
    assert tally["not_gated"] == {"rejected (repair)": 1, "out of budget (repair)": 1, "duplicate": 1,
                                  "bad proposal": 1}
    assert tally["unfilled"] == {"no proposal": 1, "not asked: the budget ran out (21 of B=24 spent)": 6}
    assert tally["planned"] == tally["gated"] + sum(tally["not_gated"].values()) + sum(tally["unfilled"].values())
    assert tally["outcome"] == {"c001": "no proposal", "c002": "gated", "c003": "duplicate", "c004": "bad proposal",
                                "c005": "rejected (repair)", "c006": "out of budget (repair)"}
    assert "proposed 5 of 12 slots, gated 1" in result.why
    assert any(e["event"] == "out_of_budget" and e["why"] == "spent 21 + 4 repair episodes > B=24"
               for e in result.events)


def test_the_report_states_the_counts_per_run(tmp_path):
    from heart_distill.eval.optimize.report import search_lines

    result = run(tmp_path, 16, improving={"c001"}, mutations=2)
    lines = search_lines({"base/s0r0": {"selected": result.selected.id, "spent": result.spent, "budget": 16,
                                        "proposals": result.proposals},
                          "base/s0r1": {"selected": "c000", "spent": {"rollouts": 12}, "budget": 12}})
    assert "| base/s0r0 | 16 / 16 | 2 of 2 | 1 | 1 out of budget (repair) | – | c001 |" in lines
    assert "| base/s0r1 | 12 / 12 | – | – | not counted in this log | – | c000 |" in lines
