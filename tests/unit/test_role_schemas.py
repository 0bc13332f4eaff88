"""Each role's output schema (for constrained decoding) accepts exactly what its parser accepts."""

import json

import jsonschema
import pytest

from heart.roles import planner, primitive, router, verifier

TOOLS = ["cd", "ls", "mv"]


def valid(schema, value):
    try:
        jsonschema.validate(value, schema)
    except jsonschema.ValidationError:
        return False
    return True


def test_planner_schema_accepts_good_plans_and_rejects_what_the_parser_rejects():
    schema = planner.output_schema(TOOLS)
    good = {"status": "SUFFICIENT", "intent": "i", "plan": [
        {"step": 1, "tool": "cd", "objective": "o", "depends_on": []},
        {"step": 2, "tool": "mv", "objective": "o", "depends_on": [1]}]}
    assert valid(schema, good) and planner.parse(json.dumps(good), set(TOOLS)).ok
    ask = {"status": "INSUFFICIENT", "intent": "i", "clarification": "Which file?"}
    assert valid(schema, ask) and not valid(planner.output_schema(TOOLS, may_ask=False), ask)
    for bad in (
        {**good, "plan": [{**good["plan"][0], "tool": "rm"}]},                       # unknown tool
        {**good, "plan": [{**good["plan"][0], "depends_on": [1]}]},                  # self-dependency
        {**good, "plan": [good["plan"][1]]},                                         # misnumbered
        {**good, "plan": [good["plan"][0]] * 7},                                     # too long
    ):
        assert not valid(schema, bad)
        assert not planner.parse(json.dumps(bad), set(TOOLS)).ok or len(bad["plan"]) > 6


def test_router_schema_pins_steps_tools_and_parameter_names():
    schema = router.output_schema({1: "cd", 2: "mv"}, {"cd": ["folder"], "mv": ["source", "destination"]})
    entry = lambda s, t, b: {"step": s, "target_tool": t, "invocation_request": "r", "resolved_bindings": b,  # noqa: E731
                             "h_params": {"retry": 0, "priority": 0, "timeout_s": 10}}
    good = {"status": "READY", "dispatch": [entry(1, "cd", {"folder": "docs"}),
                                            entry(2, "mv", {"source": "$step_1.result.x"})]}
    assert valid(schema, good) and router.parse(json.dumps(good), {1: "cd", 2: "mv"}).ok
    assert not valid(schema, {**good, "dispatch": good["dispatch"][:1]})
    assert not valid(schema, {**good, "dispatch": [entry(1, "cd", {"colour": 1}), good["dispatch"][1]]})
    assert not valid(schema, {**good, "dispatch": [entry(1, "mv", {}), good["dispatch"][1]]})


def test_primitive_schema_is_the_tools_own_argument_schema():
    params = {"type": "object", "properties": {"folder": {"type": "string"}}, "required": ["folder"]}
    schema = primitive.output_schema("cd", params)
    assert valid(schema, {"tool": "cd", "arguments": {"folder": "docs"}})
    assert valid(schema, {"status": "UNRESOLVABLE", "tool": "cd", "reason": "no folder given"})
    assert not valid(schema, {"tool": "cd", "arguments": {}})
    assert not valid(schema, {"tool": "ls", "arguments": {"folder": "docs"}})


@pytest.mark.parametrize("verdict, holds, feedback, ok", [
    ("PASS", True, "", True), ("MAYBE", True, "", False),
    ("PASS", False, "", False),  # PASS needs all four criteria
    ("FAIL", False, "step 1 failed", True), ("FAIL", False, "", False),  # FAIL needs feedback
])
def test_verifier_schema_matches_the_parser(verdict, holds, feedback, ok):
    value = {"verdict": verdict, "criteria": {c: holds for c in verifier.CRITERIA}, "feedback": feedback,
             "response": "r"}
    assert valid(verifier.output_schema(), value) is ok
    assert verifier.parse(json.dumps(value)).ok is ok
