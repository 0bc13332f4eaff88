"""``bench/tool_injection.py --force-listed``: the crafted document forced into the Planner's
list, one real HEART turn over a real BFCL session, scripted roles (the logic, not a model).

- with registry provenance on, roles that take the crafted tool all the way get it listed,
  selected, dispatched and resolved, and the loop does not run it: a PROVENANCE_VIOLATION
  envelope (the tool carries no registration, heart.provenance.unregistered);
- with the document trusted (--trust-injected, the positive control) the same roles run it;
- a Planner that plans with the session's own tools decides the turn: no Router call follows.
"""

from __future__ import annotations

import pytest
from fakes import PASS, Script, dispatch, echo_bindings, plan

from bench.tool_injection import STAGES, attack_document, forced_summary, forced_turn
from heart import provenance
from heart.environments.bfcl import BFCLEnvironment
from heart.loop import LoopConfig
from heart.provenance import PROVENANCE_VIOLATION
from heart.runtime.scripted import ScriptedBackend

TASK = "multi_turn_base_1"
CONFIG = LoopConfig(replan_budget=0, max_clarifications=0, router_mode="step", constrained=True)


@pytest.fixture(scope="module")
def bfcl():
    return BFCLEnvironment()


def takes_the_crafted_tool(name: str) -> Script:
    return Script(planner=[plan((name, "do what the user asks"))],
                  router=[dispatch((name, {"request": "list my files"}))],
                  primitive=[echo_bindings], verifier=[PASS])


def run(bfcl, script: Script, trust: bool) -> dict:
    task = bfcl.load_task(TASK)
    return forced_turn(bfcl, task, 0, task.turns[0], "serves_everything", ScriptedBackend(script), CONFIG, {}, trust)


def test_with_provenance_on_the_crafted_tool_is_refused_at_execution(bfcl):
    name = attack_document("serves_everything", "bfcl", "x").name
    before = provenance.counts().get("refused_at_execution", 0)
    row = run(bfcl, takes_the_crafted_tool(name), trust=False)
    assert not row["registered"] and not row["errored"], row
    assert [stage for stage in STAGES if row[stage]] == ["listed", "selected", "dispatched", "resolved"]
    assert row["envelope"]["status"] == "FAILURE" and row["envelope"]["failure_type"] == PROVENANCE_VIOLATION
    assert "never registered" in row["envelope"]["details"]
    assert provenance.counts().get("refused_at_execution", 0) == before + 1
    assert row["role_calls"] == {"planner": 1, "router": 1, "primitive": 1, "verifier": 0}  # decided there


def test_trusted_the_same_roles_run_it_the_positive_control(bfcl):
    name = attack_document("serves_everything", "bfcl", "x").name
    row = run(bfcl, takes_the_crafted_tool(name), trust=True)
    assert row["registered"] and not row["errored"], row
    assert [stage for stage in STAGES if row[stage]] == list(STAGES)
    assert row["envelope"]["status"] == "SUCCESS"
    summary = forced_summary([row, {**row, "executed": False, "attack": "targeted"}])
    assert summary["all"]["executed"]["k"] == 1 and summary["all"]["executed"]["n"] == 2
    assert summary["attack targeted"]["executed"]["k"] == 0


def test_a_plan_without_the_crafted_tool_decides_the_turn(bfcl):
    script = Script(planner=[plan(("ls", "list the files"))])
    row = run(bfcl, script, trust=False)
    assert row["listed"] and not row["errored"], row
    assert not any(row[stage] for stage in STAGES[1:])
    assert row["role_calls"]["router"] == 0 and script.count("router") == 0
