"""Each role's output schema (for constrained decoding) accepts exactly what its parser accepts."""

import json

import jsonschema
import pytest

from heart.roles import planner, primitive, router, verifier

TOOLS = {"cd": "fs", "ls": "fs", "mv": "fs"}
INTENT = {"task": "t", "objective": "o", "tool_categories": ["fs"], "constraints": []}


def valid(schema, value):
    return jsonschema.Draft202012Validator(schema).is_valid(value)


def step(n, tool, deps=()):
    return {"step": n, "tool_category": "fs", "tool_hint": tool, "objective": "o", "dependencies": list(deps)}


def test_planner_schema_accepts_good_plans_and_rejects_what_the_parser_rejects():
    payload = planner.build_payload("q", [{"name": n, "description": "d", "category": c} for n, c in TOOLS.items()],
                                    max_steps=6)
    schema = planner.schema_for_input(payload)
    good = {"status": "SUFFICIENT", "intent": INTENT, "plan": [step(1, "cd"), step(2, "mv", [1])], "replanned": False}
    assert valid(schema, good) and planner.parse_for_input(json.dumps(good), payload).ok
    ask = {"status": "INSUFFICIENT", "intent": INTENT, "clarification": "Which file?", "replanned": False}
    assert valid(schema, ask)
    assert not valid(planner.schema_for_input({**payload, "may_ask": False}), ask)
    for bad in (
        {**good, "plan": [step(1, "rm")]},                                    # a tool not shown
        {**good, "plan": [step(1, "cd", [1])]},                               # self-dependency
        {**good, "plan": [step(2, "mv")]},                                    # misnumbered
        {**good, "plan": [step(i, "cd") for i in range(1, 8)]},               # longer than max_steps
    ):
        assert not valid(schema, bad)
        assert not planner.parse_for_input(json.dumps(bad), payload).ok
    assert not valid(schema, {**good, "replanned": True})  # not a re-plan: no feedback in the input
    assert not valid(schema, {**good, "intent": {**INTENT, "task": "x" * 200}})  # length limits


def test_router_schema_pins_steps_tools_required_and_parameter_names():
    payload = router.build_payload("q", [{"step": 1, "tool_hint": "cd", "objective": "", "dependencies": []},
                                         {"step": 2, "tool_hint": "mv", "objective": "", "dependencies": [1]}],
                                   {"cd": {"required": ["folder"], "optional": []},
                                    "mv": {"required": ["source"], "optional": ["destination"]}})
    schema = router.schema_for_input(payload)
    entry = lambda s, t, b: {"step": s, "target_tool": t, "invocation_request": "r", "resolved_bindings": b,  # noqa: E731
                             "h_params": {"retry": 1, "priority": "normal", "timeout_s": 30}}
    good = {"status": "READY", "dispatch": [entry(1, "cd", {"folder": "docs"}),
                                            entry(2, "mv", {"source": "$step_1.result.x"})]}
    assert valid(schema, good) and router.parse_for_input(json.dumps(good), payload).ok
    assert not valid(schema, {**good, "dispatch": good["dispatch"][:1]})
    assert not valid(schema, {**good, "dispatch": [entry(1, "cd", {"folder": "d", "colour": 1}), good["dispatch"][1]]})
    assert not valid(schema, {**good, "dispatch": [entry(1, "cd", {}), good["dispatch"][1]]})  # required unbound
    assert not valid(schema, {**good, "dispatch": [entry(1, "mv", {"source": "a"}), good["dispatch"][1]]})
    retry0 = {**entry(1, "cd", {"folder": "d"}), "h_params": {"retry": 0, "priority": "normal", "timeout_s": 30}}
    assert not valid(schema, {**good, "dispatch": [retry0, good["dispatch"][1]]})


def test_router_binding_values_are_flat_as_tool_parameters_are():
    """Scalars, $step references, flat objects and lists of those bind; a dispatch nested
    inside a binding (what runaway small models wrote) does not."""
    payload = router.build_payload("q", [{"step": 1, "tool_hint": "send", "objective": "", "dependencies": []}],
                                   {"send": {"required": ["to"], "optional": ["cc", "attachment"]}})
    schema = router.schema_for_input(payload)

    def answer(bindings):
        return {"status": "READY", "dispatch": [{"step": 1, "target_tool": "send", "invocation_request": "r",
                                                 "resolved_bindings": bindings,
                                                 "h_params": {"retry": 1, "priority": "normal", "timeout_s": 30}}]}

    for bindings in ({"to": "a@b.c"}, {"to": "$step_1.result.email"}, {"to": 3, "cc": None},
                     {"to": ["a@b.c", "d@e.f"], "cc": [1.5, True]}, {"to": "x", "attachment": {"type": "file", "id": "7"}},
                     {"to": "x", "attachment": [{"type": "file", "file_id": "19"}]}):
        assert valid(schema, answer(bindings)), bindings
    for bindings in ({"to": {"target_tool": "send", "resolved_bindings": {"to": "x"}}},  # nested dispatch
                     {"to": [["a"]]}, {"to": [{"id": {"deeper": 1}}]},  # lists hold scalars or flat objects
                     {"to": "x" * (router.VALUE_CHARS + 1)}, {"to": list(range(router.VALUE_ITEMS + 1))},
                     {"to": "x", "attachment": {f"k{i}": i for i in range(router.VALUE_KEYS + 1)}}):
        assert not valid(schema, answer(bindings)), bindings


def test_primitive_schema_is_the_tools_own_argument_schema():
    params = {"type": "object", "properties": {"folder": {"type": "string"}}, "required": ["folder"]}
    schema = primitive.schema_for_input(primitive.build_payload("go", {}, primitive.tool_card("cd", "d", params)))
    assert valid(schema, {"tool": "cd", "arguments": {"folder": "docs"}})
    assert valid(schema, {"status": "UNRESOLVABLE", "tool": "cd", "reason": "no folder given"})
    assert not valid(schema, {"tool": "cd", "arguments": {}})
    assert not valid(schema, {"tool": "ls", "arguments": {"folder": "docs"}})


@pytest.mark.parametrize("status, mark, feedback, ok", [
    ("PASS", "pass", "", True), ("MAYBE", "pass", "", False),
    ("PASS", "fail", "", False),  # PASS needs all four criteria
    ("PASS", "pass", "extra", False),  # PASS carries no feedback
    ("FAIL", "fail", "step 1 failed", True), ("FAIL", "fail", "", False),  # FAIL needs feedback
])
def test_verifier_schema_matches_the_parser(status, mark, feedback, ok):
    payload = verifier.build_payload("q", {}, [{"step": 1}])
    value = {"status": status, "step": 1, "criteria": dict.fromkeys(verifier.CRITERIA, mark), "feedback": feedback}
    assert valid(verifier.schema_for_input(payload), value) is ok
    assert verifier.parse_for_input(json.dumps(value), payload).ok is ok
    assert not valid(verifier.schema_for_input(payload), {**value, "step": 2})



def test_the_served_router_grammar_takes_the_teachers_form_to_its_bounds_and_nothing_looser(smollm2_path):
    """The Router's schema as the engines compile it (SmolLM2's tokenizer, fed token by token):
    ``render_answer``'s spacing with values at their bounds ends the answer; one character,
    item, key or digit more, or whitespace ``json.dumps`` would not write, is refused, so a
    value never closed ends at its bound. A bounded string takes no escape (xgrammar 0.2.9,
    heart/runtime/json_grammar.py): when this changes, say so there and in docs/loop.md."""
    from heart.roles.common import render_answer
    from heart.runtime.chat import ChatFormat
    from heart.runtime.json_grammar import FRACTION_DIGITS, INTEGER_DIGITS

    chat = ChatFormat.from_pretrained(str(smollm2_path))
    payload = router.build_payload("q", [{"step": 1, "tool_hint": "send", "objective": "", "dependencies": []}],
                                   {"send": {"required": ["to"], "optional": ["cc", "attachment"]}})
    schema = json.dumps(router.schema_for_input(payload))

    def takes(text):
        matcher, meta = chat.matcher(schema)
        assert matcher is not None, meta
        ids = chat.tokenizer(text, add_special_tokens=False)["input_ids"]
        return all(matcher.accept_token(token) for token in ids) and matcher.accept_token(chat.stop_token_ids[0])

    def answer(bindings, request="Send it."):
        return {"status": "READY", "dispatch": [{"step": 1, "target_tool": "send", "invocation_request": request,
                                                 "resolved_bindings": bindings,
                                                 "h_params": {"retry": 1, "priority": "normal", "timeout_s": 30}}]}

    text = "Say hi – é " + "1." * router.VALUE_CHARS
    at_bounds = {"to": text[:router.VALUE_CHARS], "cc": list(range(router.VALUE_ITEMS)),
                 "attachment": {"k" * router.KEY_CHARS: "v", **{f"k{i}": "v" for i in range(router.VALUE_KEYS - 1)}}}
    assert takes(render_answer(answer(at_bounds, request=text[:router.REQUEST_CHARS])))
    integer, fraction = int("9" * INTEGER_DIGITS), float("0." + "1" * FRACTION_DIGITS)
    assert takes(render_answer(answer({"to": [integer, -1.5e-05, 227.12460000000002, fraction]})))
    for key, over in (("to", text[:router.VALUE_CHARS + 1]), ("cc", list(range(router.VALUE_ITEMS + 1))),
                      ("attachment", {f"k{i}": "v" for i in range(router.VALUE_KEYS + 1)}),
                      ("attachment", {"k" * (router.KEY_CHARS + 1): "v"})):
        assert not takes(render_answer(answer({**at_bounds, key: over}))), key
    assert not takes(render_answer(answer({"to": "x"}, request=text[:router.REQUEST_CHARS + 1])))
    assert not takes(render_answer(answer({"to": integer * 10})))
    assert not takes(render_answer(answer({"to": "x"})).replace('"x"', "1." + "1" * (FRACTION_DIGITS + 1)))
    assert not takes(render_answer(answer({"to": 'Say "hi"'})))
    assert not takes(render_answer(answer({"to": "line\nbreak"})))
    plain = answer({"to": "a@b.c"})
    assert takes(render_answer(plain))
    for loose in (json.dumps(plain, separators=(",", ":")), json.dumps(plain, indent=1), render_answer(plain) + " ",
                  render_answer(plain).replace(": ", ":  ", 1)):
        assert not takes(loose), loose
