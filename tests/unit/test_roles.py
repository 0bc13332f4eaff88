"""Each role's parser on good and malformed outputs."""

import json

import pytest

from heart.roles import planner, primitive, router, verifier
from heart.roles.common import extract_json_object, read_input, render_input

TOOLS = {"cd", "mkdir", "mv"}


def test_render_and_read_input_round_trip():
    payload = {"user_query": "move a file", "n": [1, 2], "nested": {"a": "b```c"}}
    assert read_input(render_input("Do it.", payload)) == payload


@pytest.mark.parametrize("text", [
    '{"a": 1}',
    'Sure! Here is the plan:\n```json\n{"a": 1}\n```',
    '<think>maybe {"b": 2}</think>{"a": 1}',
    'noise { not json } then {"a": 1} trailing',
])
def test_extract_json_object_finds_the_object(text):
    assert extract_json_object(text) == {"a": 1}


@pytest.mark.parametrize("text", ["", "no json here", "{'a': 1}", '{"a": 1', "[1, 2]"])
def test_extract_json_object_rejects_non_objects(text):
    with pytest.raises(ValueError):
        extract_json_object(text)


def test_a_truncated_answer_reports_its_decode_error_not_a_nested_object():
    text = '{"status": "SUFFICIENT", "plan": [{"step": 1, "tool": "cd"}, "objective": "x"'
    result = planner.parse(text, TOOLS)
    assert not result.ok and result.error.startswith("no valid JSON object")


def test_the_first_object_that_fits_the_schema_wins():
    text = 'Example: {"note": 1}. Answer: {"status": "INSUFFICIENT", "clarification": "Which file?"}'
    assert planner.parse(text, TOOLS).value.clarification == "Which file?"


def test_planner_parses_a_good_plan():
    text = json.dumps({"status": "SUFFICIENT", "intent": "move", "plan": [
        {"step": 1, "tool": "cd", "objective": "go", "depends_on": []},
        {"step": 2, "tool": "mv", "objective": "move", "depends_on": [1]}]})
    result = planner.parse(text, TOOLS)
    assert result.ok and [s.tool for s in result.value.plan] == ["cd", "mv"]


def test_planner_accepts_an_empty_plan_when_no_tool_serves_the_request():
    result = planner.parse('{"status": "SUFFICIENT", "intent": "weather", "plan": []}', TOOLS)
    assert result.ok and result.value.plan == []


def test_planner_parses_a_clarification():
    result = planner.parse('{"status": "INSUFFICIENT", "clarification": "Which file?"}', TOOLS)
    assert result.ok and result.value.clarification == "Which file?"


@pytest.mark.parametrize("text, reason", [
    ("I will move the file.", "no JSON object"),
    ('{"status": "MAYBE"}', "status"),
    ('{"status": "INSUFFICIENT"}', "clarification"),
    ('{"status": "SUFFICIENT", "plan": [{"step": 1, "tool": "rm"}]}', "do not exist"),
    ('{"status": "SUFFICIENT", "plan": [{"step": 2, "tool": "cd"}]}', "numbered"),
    ('{"status": "SUFFICIENT", "plan": [{"step": 1, "tool": "cd", "depends_on": [1]}]}', "depends"),
])
def test_planner_records_malformed_outputs(text, reason):
    result = planner.parse(text, TOOLS)
    assert not result.ok and result.value is None
    assert reason in result.error


def test_router_parses_dispatch_with_references_and_hparams():
    text = json.dumps({"status": "READY", "dispatch": [
        {"step": 1, "target_tool": "cd", "invocation_request": "go to docs",
         "resolved_bindings": {"folder": "docs"}, "h_params": {"retry": 2, "priority": 1, "timeout_s": 5}},
        {"step": 2, "target_tool": "mv", "invocation_request": "move it",
         "resolved_bindings": {"source": "$step_1.result.name"}}]})
    result = router.parse(text, {1: "cd", 2: "mv"})
    assert result.ok
    assert result.value.dispatch[0].h_params.retry == 2
    assert result.value.dispatch[1].h_params.timeout_s == 10.0  # default


@pytest.mark.parametrize("text, reason", [
    ('{"status": "READY", "dispatch": [{"step": 1, "target_tool": "cd"}]}', "plan has steps"),
    ('{"status": "READY", "dispatch": [{"step": 1, "target_tool": "mv"}, {"step": 2, "target_tool": "mv"}]}',
     "changes the tool"),
    ('{"status": "READY", "dispatch": [{"step": 1, "target_tool": "cd", "h_params": {"retry": 9}},'
     ' {"step": 2, "target_tool": "mv"}]}', "retry"),
    ('{"status": "GO", "dispatch": []}', "status"),
    ("dispatch: cd then mv", "no JSON object"),
])
def test_router_records_malformed_outputs(text, reason):
    result = router.parse(text, {1: "cd", 2: "mv"})
    assert not result.ok and reason in result.error


def test_primitive_parses_arguments_and_unresolvable():
    ok = primitive.parse('{"tool": "cd", "arguments": {"folder": "docs"}}', "cd")
    assert ok.ok and ok.value.arguments == {"folder": "docs"}
    no = primitive.parse('{"status": "UNRESOLVABLE", "tool": "cd", "reason": "no folder named"}', "cd")
    assert no.ok and no.value.status == "UNRESOLVABLE"


@pytest.mark.parametrize("text, reason", [
    ('{"tool": "mv", "arguments": {}}', "wraps 'cd'"),
    ('{"tool": "cd", "arguments": "docs"}', "arguments"),
    ('{"status": "UNRESOLVABLE", "tool": "cd"}', "reason"),
    ("cd docs", "no JSON object"),
])
def test_primitive_records_malformed_outputs(text, reason):
    result = primitive.parse(text, "cd")
    assert not result.ok and reason in result.error


def test_verifier_parses_pass_and_fail():
    crit = {"task_completion": True, "argument_consistency": True,
            "execution_validity": True, "constraint_satisfaction": True}
    ok = verifier.parse(json.dumps({"verdict": "PASS", "criteria": crit, "response": "Moved."}))
    assert ok.ok and ok.value.response == "Moved."
    bad = dict(crit, execution_validity=False)
    fail = verifier.parse(json.dumps({"verdict": "FAIL", "criteria": bad, "feedback": "step 2 failed"}))
    assert fail.ok and fail.value.feedback == "step 2 failed"


@pytest.mark.parametrize("payload, reason", [
    ({"verdict": "PASS", "criteria": {"task_completion": False, "argument_consistency": True,
                                      "execution_validity": True, "constraint_satisfaction": True}},
     "all four criteria"),
    ({"verdict": "FAIL", "criteria": {"task_completion": False, "argument_consistency": True,
                                      "execution_validity": True, "constraint_satisfaction": True}},
     "feedback"),
    ({"verdict": "PASS"}, "criteria"),
    ({"verdict": "OK", "criteria": {}}, "verdict"),
])
def test_verifier_records_malformed_outputs(payload, reason):
    result = verifier.parse(json.dumps(payload))
    assert not result.ok and reason in result.error


def test_every_role_has_a_full_and_short_system_prompt():
    for module in (planner, router, primitive, verifier):
        assert len(module.SHORT_SYSTEM_PROMPT) < len(module.SYSTEM_PROMPT) / 4
        assert module.ROLE in ("planner", "router", "primitive", "verifier")
