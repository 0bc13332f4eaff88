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


PLANNER_INPUT = planner.build_payload(
    "move a file", [{"name": t, "description": f"Tool description: {t} things. More.", "category": "fs"}
                    for t in sorted(TOOLS)])
INTENT = {"task": "move", "objective": "move a file", "tool_categories": ["fs"], "constraints": []}


def step(n, tool, deps=()):
    return {"step": n, "tool_category": "fs", "tool_hint": tool, "objective": "o", "dependencies": list(deps)}


def test_planner_input_shows_each_tool_by_its_own_first_sentence_grouped_by_category():
    assert PLANNER_INPUT["available_tools"] == {"fs": {"cd": "cd things", "mkdir": "mkdir things", "mv": "mv things"}}


def test_a_truncated_answer_reports_its_decode_error_not_a_nested_object():
    text = '{"status": "SUFFICIENT", "plan": [{"step": 1, "tool_hint": "cd"}, "objective": "x"'
    result = planner.parse_for_input(text, PLANNER_INPUT)
    assert not result.ok and result.error.startswith("no valid JSON object")


def test_the_first_object_that_fits_the_schema_wins():
    answer = {"status": "INSUFFICIENT", "intent": INTENT, "clarification": "Which file?"}
    text = f'Example: {{"note": 1}}. Answer: {json.dumps(answer)}'
    assert planner.parse_for_input(text, PLANNER_INPUT).value.clarification == "Which file?"


def test_planner_parses_a_good_plan():
    text = json.dumps({"status": "SUFFICIENT", "intent": INTENT, "plan": [step(1, "cd"), step(2, "mv", [1])],
                       "replanned": False})
    result = planner.parse_for_input(text, PLANNER_INPUT)
    assert result.ok and [s.tool_hint for s in result.value.plan] == ["cd", "mv"]
    assert result.value.intent.tool_categories == ["fs"] and result.value.plan[1].dependencies == [1]


def test_planner_accepts_an_empty_plan_when_no_tool_serves_the_request():
    result = planner.parse_for_input(json.dumps({"status": "SUFFICIENT", "intent": INTENT, "plan": []}), PLANNER_INPUT)
    assert result.ok and result.value.plan == [] and result.value.replanned is False


def test_planner_parses_a_clarification():
    result = planner.parse_for_input(json.dumps({"status": "INSUFFICIENT", "intent": INTENT,
                                                 "clarification": "Which file?"}), PLANNER_INPUT)
    assert result.ok and result.value.clarification == "Which file?"


@pytest.mark.parametrize("answer, reason", [
    ("I will move the file.", "no JSON object"),
    ({"status": "MAYBE", "intent": INTENT}, "status"),
    ({"status": "INSUFFICIENT", "intent": INTENT}, "clarification"),
    ({"status": "SUFFICIENT", "plan": []}, "intent"),
    ({"status": "SUFFICIENT", "intent": INTENT, "plan": [step(1, "rm")]}, "not shown"),
    ({"status": "SUFFICIENT", "intent": INTENT, "plan": [step(2, "cd")]}, "numbered"),
    ({"status": "SUFFICIENT", "intent": INTENT, "plan": [step(1, "cd", [1])]}, "depends"),
])
def test_planner_records_malformed_outputs(answer, reason):
    text = answer if isinstance(answer, str) else json.dumps(answer)
    result = planner.parse_for_input(text, PLANNER_INPUT)
    assert not result.ok and result.value is None
    assert reason in result.error


ROUTER_INPUT = router.build_payload(
    "go to docs and move it", [{"step": 1, "tool_hint": "cd", "objective": "o", "dependencies": []},
                               {"step": 2, "tool_hint": "mv", "objective": "o", "dependencies": [1]}],
    {"cd": {"required": ["folder"], "optional": []}, "mv": {"required": ["source"], "optional": ["destination"]}})


def test_router_parses_dispatch_with_references_and_hparams():
    text = json.dumps({"status": "READY", "dispatch": [
        {"step": 1, "target_tool": "cd", "invocation_request": "go to docs",
         "resolved_bindings": {"folder": "docs"}, "h_params": {"retry": 2, "priority": "high", "timeout_s": 5}},
        {"step": 2, "target_tool": "mv", "invocation_request": "move it",
         "resolved_bindings": {"source": "$step_1.result.name"}}]})
    result = router.parse_for_input(text, ROUTER_INPUT)
    assert result.ok
    assert result.value.dispatch[0].h_params.retry == 2 and result.value.dispatch[0].h_params.priority == "high"
    defaults = result.value.dispatch[1].h_params
    assert (defaults.retry, defaults.priority, defaults.timeout_s) == (1, "normal", 30)  # D.2 defaults


@pytest.mark.parametrize("text, reason", [
    ('{"status": "READY", "dispatch": [{"step": 1, "target_tool": "cd", "resolved_bindings": {"folder": "d"}}]}',
     "plan has steps"),
    ('{"status": "READY", "dispatch": [{"step": 1, "target_tool": "mv"}, {"step": 2, "target_tool": "mv"}]}',
     "changes the tool"),
    ('{"status": "READY", "dispatch": [{"step": 1, "target_tool": "cd", "h_params": {"retry": 9}},'
     ' {"step": 2, "target_tool": "mv"}]}', "retry"),
    ('{"status": "READY", "dispatch": [{"step": 1, "target_tool": "cd", "h_params": {"priority": 2}},'
     ' {"step": 2, "target_tool": "mv"}]}', "priority"),
    ('{"status": "READY", "dispatch": [{"step": 1, "target_tool": "cd", "resolved_bindings": {}},'
     ' {"step": 2, "target_tool": "mv", "resolved_bindings": {"source": "a"}}]}', "required parameter"),
    ('{"status": "GO", "dispatch": []}', "status"),
    ("dispatch: cd then mv", "no JSON object"),
])
def test_router_records_malformed_outputs(text, reason):
    result = router.parse_for_input(text, ROUTER_INPUT)
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


PASSING = dict.fromkeys(verifier.CRITERIA, "pass")


def test_verifier_parses_pass_and_fail():
    ok = verifier.parse(json.dumps({"status": "PASS", "step": 1, "criteria": PASSING, "feedback": ""}))
    assert ok.ok and ok.value.criteria.failed() == []
    bad = dict(PASSING, execution_validity="fail")
    fail = verifier.parse(json.dumps({"status": "FAIL", "step": 2, "criteria": bad, "feedback": "step 2 failed"}))
    assert fail.ok and fail.value.feedback == "step 2 failed" and fail.value.criteria.failed() == ["execution_validity"]


@pytest.mark.parametrize("payload, reason", [
    ({"status": "PASS", "step": 1, "criteria": dict(PASSING, task_completion="fail")}, "all four criteria"),
    ({"status": "PASS", "step": 1, "criteria": PASSING, "feedback": "but"}, "no feedback"),
    ({"status": "FAIL", "step": 1, "criteria": dict(PASSING, task_completion="fail")}, "feedback"),
    ({"status": "FAIL", "step": 1, "criteria": PASSING, "feedback": "x"}, "failed criterion"),
    ({"status": "PASS", "step": 1}, "criteria"),
    ({"status": "OK", "step": 1, "criteria": PASSING}, "status"),
])
def test_verifier_records_malformed_outputs(payload, reason):
    result = verifier.parse(json.dumps(payload))
    assert not result.ok and reason in result.error


def test_every_role_has_a_full_and_short_system_prompt():
    for module in (planner, router, primitive, verifier):
        assert len(module.SHORT_SYSTEM_PROMPT) < len(module.SYSTEM_PROMPT) / 4
        assert module.ROLE in ("planner", "router", "primitive", "verifier")


def test_verifier_schema_admits_exactly_the_verdict_its_criteria_imply():
    """Criteria come before the status; over all 16 criteria marks, the serving schema admits
    PASS only when all pass and FAIL only when one fails, and ``verifier.answer`` writes it."""
    import itertools

    import jsonschema

    schema = verifier.output_schema([3])
    for marks in itertools.product(["pass", "fail"], repeat=4):
        criteria = dict(zip(verifier.CRITERIA, marks))
        good = verifier.answer(3, criteria, "fix step 3")
        assert list(good) == list(verifier.ANSWER_ORDER)
        jsonschema.validate(good, schema)
        assert verifier.parse(json.dumps(good)).ok
        flipped = dict(good, status="PASS" if good["status"] == "FAIL" else "FAIL",
                       feedback="" if good["status"] == "FAIL" else "fix step 3")
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(flipped, schema)
