"""The Code primitive (HEELO's Code family): a sandboxed expression over earlier results.

The sandbox's refusals are pinned here (a handful: each evaluation that passes the static
check starts a process, ~0.1-0.2 s); bench/sandbox.py throws thousands of generated hostile
expressions at it."""

import json

import jsonschema
import pytest
from fakes import PASS, HashingEmbedder, Script, dispatch, plan

from heart.calls import EpisodeContext, RoleClient
from heart.families import CODE_PRIMITIVE
from heart.loop import HeartLoop, LoopConfig
from heart.primitives import CONSTRAINT_VIOLATION, RUNTIME_ERROR, SCHEMA_RESOLUTION, execute_code
from heart.roles import planner, primitive, router
from heart.runtime import ScriptedBackend
from heart.sandbox import SandboxLimits, check, evaluate
from heart.toolface import Tool, ToolFace, ToolSpec


@pytest.mark.parametrize("expression", [
    "__import__('os').system('true')",          # import by builtin
    "().__class__.__bases__[0].__subclasses__()",  # the classic dunder escape
    "(lambda: 1)()",                             # no functions of its own
    "[x := 1]",                                  # no assignment
    "import os",                                 # a statement
    "f'{1:>99999999}'",                          # an f-string width that allocates
    "x" * 2000,                                  # too long
])
def test_the_static_check_refuses_escapes_without_a_process(expression):
    outcome = evaluate(expression, {})
    assert not outcome.ok and outcome.kind in ("refused", "syntax") and outcome.latency_s < 0.05


@pytest.mark.parametrize("expression, kind", [
    ("10**10**10", "refused"),                   # a huge power
    ("'a' * 10**12", "refused"),                 # a huge string
    ("sum(range(10**12))", "error"),             # a C loop past any hook: range is capped
    ("open('/etc/passwd').read()", "refused"),  # no I/O function exists
    ("{1, 2}", "not_json"),                      # a value JSON cannot hold
    ("float('inf')", "not_json"),
])
def test_the_evaluator_process_turns_hostile_expressions_into_typed_outcomes(expression, kind):
    outcome = evaluate(expression, {})
    assert (outcome.ok, outcome.kind) == (False, kind), outcome


def test_memory_time_and_output_are_bounded():
    limits = SandboxLimits(timeout_s=3.0)
    grow = evaluate("('a' * 99999).replace('a', 'b' * 99999)", {}, limits)  # ~10 GB, asked for in C
    assert (grow.ok, grow.kind) == (False, "memory") and grow.latency_s < limits.timeout_s
    big = evaluate("[n for n in range(5000)]", {}, SandboxLimits(max_output_chars=100))
    assert (big.ok, big.kind) == (False, "too_large")
    # 9 million generator steps of simpleeval (microseconds each: minutes on any machine) with its
    # comprehension bound lifted, so the only way out is the clock: a timeout whatever the speed.
    slow = evaluate("sum(x * y for x in s for y in s)", {"s": list(range(3000))},
                    SandboxLimits(timeout_s=1.0, max_comprehension=10**9))
    assert (slow.ok, slow.kind) == (False, "timeout")


def test_a_computation_over_results_and_its_envelopes():
    transactions = [{"amount": 50.0, "date": "2022-03-01", "sender": "me"},
                    {"amount": 1000.0, "date": "2022-03-04", "sender": "me"},
                    {"amount": 10.0, "date": "2022-03-07", "sender": "bob"}]
    total = execute_code("sum(t['amount'] for t in transactions if t['date'].startswith('2022-03') "
                         "and t['sender'] == 'me')", {"transactions": transactions})
    assert total.ok and total.result == 1050.0 and total.meta["family"] == "code"
    assert total.bound_arguments["inputs"] == ["transactions"]
    assert execute_code("hhmm(minutes_between('2024-05-15T11:00:00', '2024-05-15T12:30:00'))", {}).result == "01:30"
    assert execute_code("clock('meet at the trailhead at 8 AM on Saturday')", {}).result == "08:00"
    # every failure is a typed FAILURE envelope
    assert execute_code("1 +", {}).failure_type == SCHEMA_RESOLUTION
    assert execute_code("1", {"_x": 1}).failure_type == SCHEMA_RESOLUTION  # an input name that escapes
    assert execute_code("().__class__", {}).failure_type == CONSTRAINT_VIOLATION
    assert execute_code("1 / 0", {}).failure_type == RUNTIME_ERROR
    assert check("a['b'] + 1")  # a plain expression passes the static check


def test_a_code_step_through_the_loop(tmp_path):
    def ls():
        return {"files": ["a.txt", "b.txt", "c.txt"]}

    tool = Tool(ToolSpec("ls", "List the files.", {"type": "object", "properties": {}}), ls)
    toolface = ToolFace([tool], cache_dir=tmp_path / "cache", embedder=HashingEmbedder())
    code_step = {"step": 2, "family": "code", "tool_category": "code", "tool_hint": CODE_PRIMITIVE,
                 "objective": "count the files", "dependencies": [1]}
    expressions = iter(["len(listing['files'])", "().__class__.__base__"])
    script = Script(
        planner=[lambda p: {**plan(("ls", "list")), "plan": [plan(("ls", "list"))["plan"][0], code_step]}],
        router=[{"status": "READY", "dispatch": [dispatch(("ls", {}))["dispatch"][0],
                                                 {**dispatch(("ls", {}))["dispatch"][0], "step": 2,
                                                  "target_tool": CODE_PRIMITIVE,
                                                  "resolved_bindings": {"listing": "$step_1.result"}}]}],
        primitive=[lambda p: {"tool": p["tool"]["name"], "arguments": {}} if p["tool"].get("family") != "code"
                   else {"tool": CODE_PRIMITIVE, "family": "code", "expression": next(expressions)}],
        verifier=[PASS])
    client = RoleClient(ScriptedBackend(script), EpisodeContext("ep", "t", "test"))
    loop = HeartLoop(client, toolface, lambda q: "", LoopConfig())
    result = loop.solve("how many files are there?")
    assert result.verdict == "PASS" and result.attempts[0].results[2].result == 3
    assert "compute: 3" in result.response
    planner_input = next(p for role, p in script.calls if role == "planner")
    assert CODE_PRIMITIVE in planner_input["available_tools"]["code"]
    router_input = next(p for role, p in script.calls if role == "router")
    assert router_input["tools"][CODE_PRIMITIVE] == router.code_parameters()
    code_input = [p for role, p in script.calls if role == "primitive"][1]
    assert code_input["resolved_bindings"] == {"listing": ls()} and code_input["tool"]["family"] == "code"
    # a hostile expression the next time: a typed FAILURE the Verifier sees, not a crash
    script.queues["verifier"] = [lambda p: PASS(p) if p["steps"][0]["envelope"]["status"] == "SUCCESS" else
                                 {"step": p["steps"][0]["step"], "criteria": {
                                     "task_completion": "fail", "argument_consistency": "pass",
                                     "execution_validity": "fail", "constraint_satisfaction": "pass"},
                                  "status": "FAIL", "feedback": "the expression was refused"}]
    result = HeartLoop(client, toolface, lambda q: "", LoopConfig(replan_budget=0)).solve("how many files?")
    refused = result.attempts[0].results[2]
    assert result.verdict == "FAIL" and refused.failure_type == CONSTRAINT_VIOLATION
    assert refused.meta["sandbox"] == "refused"


def test_code_steps_in_the_role_schemas():
    tools = [{"name": "ls", "description": "List files.", "category": "fs"},
             {"name": CODE_PRIMITIVE, "description": "Compute.", "category": "code"}]
    payload = planner.build_payload("count the files", tools)
    answer = {"status": "SUFFICIENT", "intent": {"task": "t", "objective": "o", "tool_categories": ["code", "fs"],
                                                 "constraints": []},
              "plan": [{"step": 1, "tool_category": "fs", "tool_hint": "ls", "objective": "", "dependencies": []},
                       {"step": 2, "family": "code", "tool_category": "code", "tool_hint": CODE_PRIMITIVE,
                        "objective": "count", "dependencies": [1]}], "replanned": False}
    validator = jsonschema.Draft202012Validator(planner.schema_for_input(payload))
    assert validator.is_valid(answer) and planner.parse_for_input(json.dumps(answer), payload).ok
    wrong = json.loads(json.dumps(answer))
    wrong["plan"][0]["family"] = "code"  # a tool step cannot claim the code family
    assert not validator.is_valid(wrong) and not planner.parse_for_input(json.dumps(wrong), payload).ok
    card = primitive.build_payload("count", {"listing": {"files": []}}, primitive.code_card())
    good = {"tool": CODE_PRIMITIVE, "family": "code", "expression": "len(listing['files'])"}
    assert jsonschema.Draft202012Validator(primitive.schema_for_input(card)).is_valid(good)
    assert primitive.parse_for_input(json.dumps(good), card).ok
    assert not primitive.parse_for_input(json.dumps({"tool": CODE_PRIMITIVE, "arguments": {}}), card).ok
    route = router.build_payload("q", [{"step": 1, "tool_hint": CODE_PRIMITIVE, "objective": "", "dependencies": []}],
                                 {CODE_PRIMITIVE: router.code_parameters()})
    dispatched = {"status": "READY", "dispatch": [{"step": 1, "target_tool": CODE_PRIMITIVE, "invocation_request": "",
                                                   "resolved_bindings": {"a": "$step_1.result", "b": 2},
                                                   "h_params": {"retry": 1, "priority": "normal", "timeout_s": 30}}]}
    assert jsonschema.Draft202012Validator(router.schema_for_input(route)).is_valid(dispatched)


@pytest.fixture(scope="module")
def agentdojo():
    from heart.environments import load_environment

    return load_environment("agentdojo")


def test_agentdojo_computations_hold_no_value_of_the_answer(agentdojo):
    """Written from the prompt: a number in an expression that the answer holds is one the
    prompt holds too (the answer key's own values come from the results at run time)."""
    import re

    from heart.environments.agentdojo import COMPUTATIONS

    number = re.compile(r"\d+(?:\.\d+)?")
    for task_id, computations in COMPUTATIONS.items():
        task = agentdojo.load_task(task_id)
        answer = set(number.findall(" ".join(task.gold_response or []).replace(",", "")))
        for c in computations:
            leaked = (set(number.findall(c.expression + c.objective)) & answer) - set(number.findall(task.turns[0]))
            assert not leaked, (task_id, leaked)
            assert all(0 <= i < len(task.gold[0]) for i in c.inputs.values())


def test_the_gold_teacher_plans_code_steps_and_the_checker_accepts_them(agentdojo):
    from heart.episode import run_episode
    from heart_distill.data.gold_teacher import GoldTeacher

    for task_id in ("banking/user_task_1", "workspace/user_task_17", "travel/user_task_16"):
        task = agentdojo.load_task(task_id)
        result = run_episode(agentdojo, task, GoldTeacher(task, agentdojo.catalog()))
        code = [e for a in result.turns[0].attempts for s, e in a.results.items() if e.tool == CODE_PRIMITIVE]
        assert result.record.success and code and code[-1].ok, (task_id, result.record.checker)
        assert f"{CODE_PRIMITIVE}: " in result.turns[0].response
