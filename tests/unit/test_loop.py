"""Algorithm 1 with a scripted backend: budget, clarification, references, failures, traces."""

import time

import pytest
from fakes import PASS, HashingEmbedder, Script, args, dispatch, echo_bindings, fail, plan

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


def test_happy_path_resolves_step_references_and_traces_every_call(world):
    files, toolface, trace_path = world
    script = Script(
        planner=[plan(("ls", "list files"), ("cat", "read the first file"))],
        router=[dispatch(("ls", {}), ("cat", {"file_name": "$step_1.files.0"}))],
        primitive=[echo_bindings],
        verifier=[PASS],
    )
    loop, trace = make_loop(script, toolface, trace_path)
    result = loop.solve("What does my report say?")
    trace.close()
    assert result.verdict == "PASS" and result.response == "done" and result.replans_used == 0
    cat_result = result.attempts[0].results[2]
    assert cat_result.ok and cat_result.result == {"content": "budget analysis"}
    # the Primitive saw the resolved value, not the reference
    primitive_inputs = [p for role, p in script.calls if role == "primitive"]
    assert primitive_inputs[1]["resolved_bindings"] == {"file_name": "report.txt"}
    # the Planner saw names + short descriptions only, never schemas
    planner_input = next(p for role, p in script.calls if role == "planner")
    assert all(set(t) == {"name", "description"} for t in planner_input["available_tools"])
    rows = list(read_trace(trace_path))
    assert [r["role"] for r in rows] == ["planner", "router", "primitive", "primitive", "verifier"]
    assert rows[3]["extra"]["envelope"]["status"] == "SUCCESS" and rows[3]["step"] == 2
    assert all(r["messages"][0]["role"] == "system" and r["raw_output"] for r in rows)


def test_replan_budget_is_respected_and_feedback_reaches_the_planner(world):
    _, toolface, trace_path = world
    script = Script(planner=[plan(("ls", "list"))], router=[dispatch(("ls", {}))],
                    primitive=[echo_bindings], verifier=[fail("list hidden files too")])
    loop, trace = make_loop(script, toolface, trace_path, replan_budget=2)
    result = loop.solve("list everything")
    assert result.verdict == "FAIL" and len(result.attempts) == 3 and result.replans_used == 2
    assert script.count("planner") == 3 and script.count("verifier") == 3
    planner_inputs = [p for role, p in script.calls if role == "planner"]
    assert "verifier_feedback" not in planner_inputs[0]
    assert planner_inputs[1]["verifier_feedback"] == "list hidden files too"
    assert planner_inputs[2]["executed_so_far"][0]["tool"] == "ls"
    assert "3 attempt(s)" in result.response and "list hidden files too" in result.response


def test_replan_recovers_after_a_failed_step(world):
    files, toolface, trace_path = world
    script = Script(
        planner=[plan(("cat", "read"), ("touch", "create")), plan(("cat", "read the right file"))],
        router=[dispatch(("cat", {"file_name": "missing.txt"}), ("touch", {"file_name": "new.txt"})),
                dispatch(("cat", {"file_name": "report.txt"}))],
        primitive=[echo_bindings],
        verifier=[lambda p: fail("step 1 read a file that does not exist; read report.txt")
                  if p["results"][0]["status"] == "FAILURE" else PASS],
    )
    loop, trace = make_loop(script, toolface, trace_path)
    result = loop.solve("read my report then create new.txt")
    first = result.attempts[0].results
    assert first[1].failure_type == "RUNTIME_ERROR" and "no such file" in first[1].details
    assert first[2].status == "SKIPPED" and "new.txt" not in files.files  # nothing ran after the failure
    assert result.verdict == "PASS" and result.replans_used == 1
    verifier_input = [p for role, p in script.calls if role == "verifier"][0]
    assert [r["status"] for r in verifier_input["results"]] == ["FAILURE", "SKIPPED"]


def test_clarification_is_asked_and_answered_then_the_plan_proceeds(world):
    _, toolface, trace_path = world
    questions = []
    script = Script(
        planner=[{"status": "INSUFFICIENT", "intent": "read", "clarification": "Which file?"},
                 lambda p: plan(("cat", "read it")) if p.get("clarifications") else {"status": "INSUFFICIENT"}],
        router=[dispatch(("cat", {"file_name": "report.txt"}))],
        primitive=[echo_bindings], verifier=[PASS])
    loop, _ = make_loop(script, toolface, trace_path, questions)
    result = loop.solve("read the file")
    assert questions == ["Which file?"]
    assert result.clarifications == [{"question": "Which file?", "answer": "The file is report.txt"}]
    assert result.verdict == "PASS"


def test_clarification_budget_is_bounded(world):
    _, toolface, trace_path = world
    questions = []
    script = Script(planner=[{"status": "INSUFFICIENT", "clarification": "Which file?"}])
    loop, _ = make_loop(script, toolface, trace_path, questions, max_clarifications=2, replan_budget=1)
    result = loop.solve("read the file")
    assert len(questions) == 2 and result.verdict == "FAIL"
    assert "clarification budget" in result.attempts[-1].feedback


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


def test_primitive_binding_failures_and_timeouts_become_typed_envelopes(world):
    _, toolface, trace_path = world
    script = Script(
        planner=[plan(("slow", "wait"))],
        router=[{"status": "READY", "dispatch": [{"step": 1, "target_tool": "slow", "invocation_request": "wait",
                                                  "resolved_bindings": {"seconds": 2},
                                                  "h_params": {"retry": 0, "timeout_s": 0.2}}]}],
        primitive=[echo_bindings], verifier=[fail("too slow")])
    loop, _ = make_loop(script, toolface, trace_path, replan_budget=0)
    result = loop.solve("wait two seconds")
    envelope = result.attempts[0].results[1]
    assert envelope.failure_type == "RUNTIME_ERROR" and "timed out after 0.2s" in envelope.details


def test_retry_reruns_execution_on_runtime_errors(world):
    files, toolface, trace_path = world
    script = Script(
        planner=[plan(("flaky", "call it"))],
        router=[{"status": "READY", "dispatch": [{"step": 1, "target_tool": "flaky", "invocation_request": "go",
                                                  "h_params": {"retry": 1}}]}],
        primitive=[args("flaky")], verifier=[PASS])
    loop, _ = make_loop(script, toolface, trace_path)
    result = loop.solve("call the flaky service")
    assert result.verdict == "PASS" and files.flaky_calls == 2 and script.count("primitive") == 1


def test_an_empty_plan_skips_routing_and_goes_to_the_verifier(world):
    _, toolface, trace_path = world
    script = Script(planner=[{"status": "SUFFICIENT", "intent": "weather", "plan": []}],
                    verifier=[dict(PASS, response="No tool can tell the weather.")])
    loop, _ = make_loop(script, toolface, trace_path)
    result = loop.solve("what's the weather?")
    assert result.verdict == "PASS" and script.count("router") == 0 and script.count("primitive") == 0
    assert [p for role, p in script.calls if role == "verifier"][0]["results"] == []


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
    result = HeartLoop(client, toolface, lambda q: "", LoopConfig(prefill=True)).solve("list files")
    trace.close()
    assert result.verdict == "PASS"
    assert [m[-1]["content"] for m in sent] == ['{"status": "', '{"status": "READY", "dispatch": [',
                                                '{"tool": "', '{"verdict": "']
    rows = list(read_trace(trace_path))
    assert all(r["messages"][-1]["role"] == "user" for r in rows)  # no prefill in the dataset's view
    assert all(r["raw_output"].startswith(r["extra"]["prefill"]) and r["parse_error"] is None for r in rows)
