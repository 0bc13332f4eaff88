"""Algorithm 1 with a scripted backend: per-step verification, dependencies, priority,
accumulated feedback, upstream context, budget, clarification, references, failures, traces."""

import json
import time

import jsonschema

import pytest
from fakes import PASS, HashingEmbedder, Script, args, ask, dispatch, echo_bindings, fail, plan, verdict

from heart.calls import EpisodeContext, RoleClient
from heart.environments.base import ToolExecutionError
from heart.loop import HeartLoop, LoopConfig
from heart.runtime import ScriptedBackend
from heart.toolface import Tool, ToolFace, ToolSpec
from heart.traces import TraceWriter, read_trace


class Files:
    """A tiny stateful tool set."""

    def __init__(self):
        self.files = {"report.txt": "budget analysis"}
        self.flaky_calls = 0

    def tools(self):
        def ls():
            return {"files": sorted(self.files)}

        def cat(file_name: str):
            if file_name not in self.files:
                raise ToolExecutionError(f"cat: {file_name}: no such file")
            return {"content": self.files[file_name]}

        def touch(file_name: str):
            self.files[file_name] = ""
            return {"created": file_name}

        def slow(seconds: float):
            time.sleep(seconds)
            return {}

        def flaky():
            self.flaky_calls += 1
            if self.flaky_calls < 2:
                raise ToolExecutionError("temporarily unavailable")
            return {"ok": True}

        string = {"type": "string"}
        specs = [
            (ls, "List the files in the current folder.", {}),
            (cat, "Show the content of a file.", {"file_name": string}),
            (touch, "Create an empty file.", {"file_name": string}),
            (slow, "Wait some seconds.", {"seconds": {"type": "number"}}),
            (flaky, "A service that fails once.", {}),
        ]
        return [Tool(ToolSpec(fn.__name__, doc, {"type": "object", "properties": props,
                                                  "required": list(props)}), fn) for fn, doc, props in specs]


@pytest.fixture
def world(tmp_path):
    files = Files()
    toolface = ToolFace(files.tools(), cache_dir=tmp_path / "cache", embedder=HashingEmbedder())
    return files, toolface, tmp_path / "trace.jsonl"


def make_loop(script, toolface, trace_path, questions=None, **config):
    trace = TraceWriter(trace_path, fsync=False)
    client = RoleClient(ScriptedBackend(script, name="scripted"), EpisodeContext("ep1", "task1", "test"), trace)

    def ask(question):
        questions.append(question) if questions is not None else None
        return "The file is report.txt"

    return HeartLoop(client, toolface, ask, LoopConfig(**config)), trace


def test_happy_path_verifies_each_step_with_its_schema_and_traces_every_call(world):
    files, toolface, trace_path = world
    script = Script(
        planner=[plan(("ls", "list files"), ("cat", "read the first file", [1]))],
        router=[dispatch(("ls", {}), ("cat", {"file_name": "$step_1.files.0"}))],
        primitive=[echo_bindings],
        verifier=[PASS],
    )
    loop, trace = make_loop(script, toolface, trace_path)
    result = loop.solve("What does my report say?")
    trace.close()
    assert result.verdict == "PASS" and result.replans_used == 0
    assert "budget analysis" in result.response  # the turn's answer quotes the results
    cat_result = result.attempts[0].results[2]
    assert cat_result.ok and cat_result.result == {"content": "budget analysis"}
    assert cat_result.summary == "cat returned content: budget analysis."
    assert cat_result.meta["attempts"] == 1 and cat_result.meta["latency_s"] >= 0
    primitive_inputs = [p for role, p in script.calls if role == "primitive"]
    assert primitive_inputs[1]["resolved_bindings"] == {"file_name": "report.txt"}
    # the Planner saw names + one-line descriptions grouped by category, never schemas
    planner_input = next(p for role, p in script.calls if role == "planner")
    assert all(isinstance(d, str) for tools in planner_input["available_tools"].values() for d in tools.values())
    # one Verifier call per executed step, each with that step's tool schema (D.4)
    verifier_inputs = [p for role, p in script.calls if role == "verifier"]
    assert [[s["step"] for s in p["steps"]] for p in verifier_inputs] == [[1], [2]]
    assert verifier_inputs[1]["steps"][0]["tool_schema"] == toolface.get("cat").spec.parameters
    assert verifier_inputs[1]["steps"][0]["envelope"]["status"] == "SUCCESS"
    rows = list(read_trace(trace_path))
    # step 2 reads step 1's result: once step 1 passed, its Primitive wrote messages to step 2
    assert [r["role"] for r in rows] == ["planner", "router", "primitive", "verifier", "primitive", "primitive",
                                         "verifier"]
    assert rows[4]["extra"]["mode"] == "messages" and rows[4]["step"] == 1
    assert rows[5]["extra"]["envelope"]["status"] == "SUCCESS" and rows[5]["step"] == 2 and rows[6]["step"] == 2
    assert all(r["messages"][0]["role"] == "system" and r["raw_output"] for r in rows)


def test_a_step_fail_stops_the_attempt_and_the_replan_sees_every_feedback(world):
    files, toolface, trace_path = world
    feedbacks = iter(["first problem", "second problem"])
    script = Script(
        planner=[lambda p: plan(("touch", "create"), ("ls", "list"), replanned=bool(p.get("feedback")))],
        router=[dispatch(("touch", {"file_name": "a.txt"}), ("ls", {}))],
        primitive=[echo_bindings],
        verifier=[lambda p: fail(next(feedbacks, "third problem"))(p)],
    )
    loop, _ = make_loop(script, toolface, trace_path, replan_budget=2)
    result = loop.solve("make a file and list")
    assert result.verdict == "FAIL" and len(result.attempts) == 3
    # Algorithm 1: FAIL at step 1 breaks the attempt: step 2 never runs
    assert all(list(a.results) == [1] for a in result.attempts)
    assert script.count("verifier") == 3 and script.count("primitive") == 3
    planner_inputs = [p for role, p in script.calls if role == "planner"]
    assert "feedback" not in planner_inputs[0]
    assert planner_inputs[1]["feedback"] == ["first problem"]
    assert planner_inputs[2]["feedback"] == ["first problem", "second problem"]  # C ∪ {ϕ_k}: all kept
    assert planner_inputs[2]["executed_so_far"][0]["tool"] == "touch"
    assert [a.plan.replanned for a in result.attempts] == [False, True, True]
    assert "3 attempt(s)" in result.response and "first problem" in result.response


def test_a_replan_adds_tools_for_what_is_left_and_keeps_those_shown(tmp_path):
    from fakes import verdict

    from heart.toolface import RetrievalConfig

    one = RetrievalConfig(k=1, min_shown=1, expand_companions=False)
    toolface = ToolFace(Files().tools(), cache_dir=tmp_path / "cache", embedder=HashingEmbedder(), config=one)
    not_done = lambda p: verdict(p, "FAIL", "ls ran; now create an empty file with touch", ("task_completion",))  # noqa: E731
    wrong_call = fail("ls ran; now create an empty file with touch")  # also execution_validity

    def shown_per_plan(verifier, **config):
        script = Script(planner=[lambda p: plan(("ls", "list"), replanned=bool(p.get("feedback")))],
                        router=[dispatch(("ls", {}))], primitive=[echo_bindings], verifier=[verifier, PASS])
        loop, _ = make_loop(script, toolface, tmp_path / f"{len(list(tmp_path.iterdir()))}.jsonl",
                            replan_budget=1, **config)
        loop.solve("list the files")
        return [[name for category, tools in p["available_tools"].items() if category != "code" for name in tools]
                for role, p in script.calls if role == "planner"]  # (the Code primitive is always shown)

    # task_completion alone: the re-plan searches the feedback and keeps what it showed
    assert shown_per_plan(not_done, replan_tools=1) == [["ls"], ["ls", "touch"]]
    # a step called wrongly: its tool is already shown, nothing is added
    assert shown_per_plan(wrong_call, replan_tools=1) == [["ls"], ["ls"]]
    # replan_tools=0: the paper's one retrieval per query
    assert shown_per_plan(not_done, replan_tools=0) == [["ls"], ["ls"]]


def test_a_first_empty_plan_is_replanned_once_with_tools_for_the_stated_task(tmp_path):
    from heart.toolface import RetrievalConfig

    one = RetrievalConfig(k=1, min_shown=1, expand_companions=False)
    toolface = ToolFace(Files().tools(), cache_dir=tmp_path / "cache", embedder=HashingEmbedder(), config=one)
    script = Script(planner=[lambda p: plan(replanned=bool(p.get("feedback")))],
                    router=[dispatch()], primitive=[echo_bindings], verifier=[PASS])
    loop, _ = make_loop(script, toolface, tmp_path / "t.jsonl", replan_budget=3)
    result = loop.solve("list the files")
    planner_inputs = [p for role, p in script.calls if role == "planner"]
    assert len(planner_inputs) == 2 and result.verdict == "PASS"  # once, not until the budget is spent
    assert planner_inputs[1]["feedback"][0].startswith("No shown tool serves this")
    assert sum(len(tools) for tools in planner_inputs[1]["available_tools"].values()) > 1


def test_the_planner_schema_demands_replanned_on_a_replan(world):
    from heart.roles import planner

    _, toolface, trace_path = world
    script = Script(planner=[plan(("ls", "list"))], router=[dispatch(("ls", {}))],
                    primitive=[echo_bindings], verifier=[fail("again"), PASS])
    loop, _ = make_loop(script, toolface, trace_path, replan_budget=1)
    loop.solve("list")
    first, second = [p for role, p in script.calls if role == "planner"]
    valid = lambda payload, answer: planner.parse_for_input(json.dumps(answer), payload).ok and \
        jsonschema.Draft202012Validator(planner.schema_for_input(payload)).is_valid(answer)  # noqa: E731
    assert valid(first, plan(("ls", "l"))) and not valid(first, plan(("ls", "l"), replanned=True))
    assert valid(second, plan(("ls", "l"), replanned=True)) and not valid(second, plan(("ls", "l")))


def test_dependencies_decide_what_runs_after_a_failure_not_plan_order(world):
    files, toolface, trace_path = world
    # step 1 fails; step 2 depends on it (skipped); step 3 is unrelated (runs)
    script = Script(
        planner=[plan(("cat", "read"), ("touch", "copy it", [1]), ("ls", "list"))],
        router=[dispatch(("cat", {"file_name": "missing.txt"}), ("touch", {"file_name": "copy.txt"}), ("ls", {}))],
        primitive=[echo_bindings], verifier=[lambda p: fail("bad")(p)])
    loop, _ = make_loop(script, toolface, trace_path, replan_budget=0, verify="attempt")
    result = loop.solve("read, copy, list")
    results = result.attempts[0].results
    assert results[1].failure_type == "RUNTIME_ERROR"
    assert results[2].status == "SKIPPED" and "[1]" in results[2].details and "copy.txt" not in files.files
    assert results[3].ok  # unrelated to the failure: it ran
    verifier_input = next(p for role, p in script.calls if role == "verifier")
    assert [s["envelope"]["status"] for s in verifier_input["steps"]] == ["FAILURE", "SKIPPED", "SUCCESS"]
    assert "tool_schema" not in verifier_input["steps"][0]  # the whole-attempt variant shows no schemas


def test_a_step_the_verifier_passes_despite_a_failure_lets_its_dependants_run(world):
    files, toolface, trace_path = world
    script = Script(
        planner=[plan(("cat", "read, if there"), ("touch", "then create", [1]))],
        router=[dispatch(("cat", {"file_name": "missing.txt"}), ("touch", {"file_name": "new.txt"}))],
        primitive=[echo_bindings], verifier=[PASS])
    loop, _ = make_loop(script, toolface, trace_path)
    result = loop.solve("read missing.txt if it exists, then create new.txt")
    assert result.verdict == "PASS" and "new.txt" in files.files


def test_priority_orders_ready_steps(world):
    files, toolface, trace_path = world
    order = []
    script = Script(
        planner=[plan(("touch", "a"), ("touch", "b"), ("touch", "c"), ("ls", "after a", [1]))],
        router=[dispatch(("touch", {"file_name": "a"}, {"priority": "low"}),
                         ("touch", {"file_name": "b"}, {"priority": "normal"}),
                         ("touch", {"file_name": "c"}, {"priority": "high"}),
                         ("ls", {}, {"priority": "high"}))],
        primitive=[lambda p: (order.append(p["tool"]["name"] + ":" + p["resolved_bindings"].get("file_name", "")),
                              echo_bindings(p))[1]],
        verifier=[PASS])
    loop, _ = make_loop(script, toolface, trace_path)
    result = loop.solve("create a, b, c then list")
    # high first (c), then normal (b), then low (a); ls became ready only after a
    assert order == ["touch:c", "touch:b", "touch:a", "ls:"]
    assert list(result.attempts[0].results) == [3, 2, 1, 4]


def test_the_primitive_receives_its_upstream_result(world):
    _, toolface, trace_path = world
    script = Script(
        planner=[plan(("ls", "list"), ("cat", "read the listed file", [1]))],
        router=[dispatch(("ls", {}), ("cat", {"file_name": "$step_1.result"}))],
        primitive=[echo_bindings, lambda p: args("cat", file_name=p["upstream_context"][0]["result"]["files"][0])],
        verifier=[PASS])
    loop, _ = make_loop(script, toolface, trace_path)
    result = loop.solve("read the only file")
    cat_input = [p for role, p in script.calls if role == "primitive"][1]
    assert cat_input["upstream_context"] == [{"step": 1, "tool": "ls", "result": {"files": ["report.txt"]}}]
    assert cat_input["resolved_bindings"] == {"file_name": {"files": ["report.txt"]}}  # a whole-result reference
    assert result.verdict == "PASS" and result.attempts[0].results[2].result == {"content": "budget analysis"}


def test_the_router_sees_clarifications_and_parameter_names(world):
    _, toolface, trace_path = world
    questions = []
    script = Script(
        planner=[ask("Which file?"), lambda p: plan(("cat", "read it")) if p.get("clarifications") else ask("Which?")],
        router=[dispatch(("cat", {"file_name": "report.txt"}))],
        primitive=[echo_bindings], verifier=[PASS])
    loop, _ = make_loop(script, toolface, trace_path, questions)
    result = loop.solve("read the file")
    assert questions == ["Which file?"]
    assert result.clarifications == [{"question": "Which file?", "answer": "The file is report.txt"}]
    router_input = next(p for role, p in script.calls if role == "router")
    assert router_input["clarifications"] == result.clarifications
    assert router_input["tools"] == {"cat": {"required": ["file_name"], "optional": []}}
    assert result.verdict == "PASS"


def test_clarification_budget_is_bounded(world):
    _, toolface, trace_path = world
    questions = []
    script = Script(planner=[ask("Which file?")])
    loop, _ = make_loop(script, toolface, trace_path, questions, max_clarifications=2, replan_budget=1)
    result = loop.solve("read the file")
    assert len(questions) == 2 and result.verdict == "FAIL"
    assert "clarification budget" in result.attempts[-1].feedback
    last_input = [p for role, p in script.calls if role == "planner"][-1]
    assert last_input["may_ask"] is False


def test_malformed_outputs_are_recorded_failures_not_crashes(world):
    _, toolface, trace_path = world
    script = Script(planner=["Sure, I will list the files!", plan(("ls", "list"))],
                    router=[dispatch(("ls", {}))], primitive=["ls please"], verifier=[fail("no result")])
    loop, trace = make_loop(script, toolface, trace_path, replan_budget=1)
    result = loop.solve("list files")
    trace.close()
    rows = list(read_trace(trace_path))
    assert rows[0]["role"] == "planner" and rows[0]["parsed"] is None and "no JSON" in rows[0]["parse_error"]
    assert "could not be used" in result.attempts[0].feedback
    envelope = next(r for r in rows if r["role"] == "primitive")["extra"]["envelope"]
    assert envelope["status"] == "FAILURE" and envelope["failure_type"] == "SCHEMA_RESOLUTION"
    assert result.verdict == "FAIL"


def test_verifier_output_follows_d4(world):
    from heart.roles import verifier

    good = {"status": "FAIL", "step": 2, "criteria": {"task_completion": "fail", "argument_consistency": "fail",
                                                      "execution_validity": "pass", "constraint_satisfaction": "pass"},
            "feedback": "Step 2 (cat): argument file_name was 'b' but the request asked for 'a'."}
    payload = {"steps": [{"step": 2}]}
    assert verifier.parse_for_input(json.dumps(good), payload).ok
    assert verifier.parse_for_input(json.dumps(good), payload).value.criteria.failed() == \
        ["task_completion", "argument_consistency"]
    for bad in ({**good, "step": 1},                                                    # not the judged step
                {**good, "criteria": dict.fromkeys(verifier.CRITERIA, "pass")},          # FAIL, nothing failed
                {**good, "status": "PASS"},                                             # PASS with a failed criterion
                {**good, "feedback": ""},                                               # FAIL without feedback
                {**good, "criteria": {**good["criteria"], "task_completion": True}}):   # marks are pass|fail
        assert not verifier.parse_for_input(json.dumps(bad), payload).ok


def test_primitive_binding_failures_and_timeouts_become_typed_envelopes(world):
    _, toolface, trace_path = world
    script = Script(
        planner=[plan(("slow", "wait"))],
        router=[dispatch(("slow", {"seconds": 3}, {"timeout_s": 1}))],
        primitive=[echo_bindings], verifier=[fail("too slow")])
    loop, _ = make_loop(script, toolface, trace_path, replan_budget=0)
    result = loop.solve("wait three seconds")
    envelope = result.attempts[0].results[1]
    assert envelope.failure_type == "RUNTIME_ERROR" and "timed out after 1s" in envelope.details


def test_retry_reruns_execution_and_keeps_every_failed_attempt(world):
    files, toolface, trace_path = world
    script = Script(
        planner=[plan(("flaky", "call it"))],
        router=[dispatch(("flaky", {}, {"retry": 2}))],
        primitive=[args("flaky")], verifier=[PASS])
    loop, trace = make_loop(script, toolface, trace_path)
    result = loop.solve("call the flaky service")
    trace.close()
    envelope = result.attempts[0].results[1]
    assert result.verdict == "PASS" and files.flaky_calls == 2 and script.count("primitive") == 1
    assert envelope.meta["attempts"] == 2
    assert envelope.meta["failed_attempts"][0]["details"].endswith("temporarily unavailable")
    traced = next(r for r in read_trace(trace_path) if r["role"] == "primitive")["extra"]["envelope"]
    assert traced["meta"]["failed_attempts"][0]["status"] == "FAILURE"  # not silently lost


def test_an_empty_plan_ends_the_turn_without_routing_or_verifying(world):
    _, toolface, trace_path = world
    script = Script(planner=[{"status": "SUFFICIENT", "intent": {"task": "weather", "objective": "weather",
                                                                 "tool_categories": [], "constraints": []},
                              "plan": [], "replanned": False}])
    loop, _ = make_loop(script, toolface, trace_path)
    result = loop.solve("what's the weather?")
    assert result.verdict == "PASS" and script.count("router") == 0 and script.count("verifier") == 0
    assert "None of the available tools" in result.response


def test_whole_attempt_verification_is_one_call_per_attempt(world):
    _, toolface, trace_path = world
    script = Script(planner=[plan(("ls", "list"), ("touch", "create", [1]))],
                    router=[dispatch(("ls", {}), ("touch", {"file_name": "x"}))],
                    primitive=[echo_bindings],
                    verifier=[lambda p: verdict(p) if len(p["steps"]) == 2 else None])
    loop, _ = make_loop(script, toolface, trace_path, verify="attempt")
    result = loop.solve("list then create x")
    assert result.verdict == "PASS" and script.count("verifier") == 1
    with pytest.raises(ValueError, match="verify"):
        LoopConfig(verify="sometimes")


def test_prefill_starts_each_answer_and_traces_a_plain_conversation(world):
    _, toolface, trace_path = world
    sent = []

    def continuing(script):
        """A backend that, like a real model, returns only what follows the prefill."""
        def respond(role, messages):
            sent.append(messages)
            full = script(role, messages)
            prefix = messages[-1]["content"] if messages[-1]["role"] == "assistant" else ""
            assert full.startswith(prefix)
            return full[len(prefix):]
        return respond

    script = Script(planner=[plan(("ls", "list"))], router=[dispatch(("ls", {}))],
                    primitive=[echo_bindings], verifier=[PASS])
    trace = TraceWriter(trace_path, fsync=False)
    client = RoleClient(ScriptedBackend(continuing(script)), EpisodeContext("ep", "t", "test"), trace)
    result = HeartLoop(client, toolface, lambda q: "", LoopConfig(prefill=True, constrained=False)).solve("list files")
    trace.close()
    assert result.verdict == "PASS"
    assert [m[-1]["content"] for m in sent] == ['{"status": "', '{"status": "READY", "dispatch": [',
                                                '{"tool": "', '{"step": ']
    rows = list(read_trace(trace_path))
    assert all(r["messages"][-1]["role"] == "user" for r in rows)  # no prefill in the dataset's view
    assert all(r["raw_output"].startswith(r["extra"]["prefill"]) and r["parse_error"] is None for r in rows)


def test_the_answer_states_a_long_result_whole_up_to_its_cap():
    """Values the user asked about can sit deep in a result (a file's rows): the answer
    quotes each step's result up to RESPONSE_RESULT_CHARS, not a 600-character glimpse."""
    from heart.loop import RESPONSE_RESULT_CHARS, Attempt, HeartLoop
    from heart.primitives import Envelope

    rows = "\n".join(f"user {i},{i % 5}" for i in range(200))  # ~2,000 characters
    attempt = Attempt(0, results={1: Envelope("SUCCESS", "read_file", result={"content": rows})})
    answer = HeartLoop.response([attempt])
    assert "user 199,4" in answer and len(answer) > 600
    huge = Attempt(0, results={1: Envelope("SUCCESS", "read_file", result="x" * (3 * RESPONSE_RESULT_CHARS))})
    assert len(HeartLoop.response([huge])) <= len("read_file: ") + RESPONSE_RESULT_CHARS
