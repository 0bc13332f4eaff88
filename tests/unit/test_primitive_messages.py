"""Messages between primitives (HEELO): a passed step tells the steps that read its result
which field they need; the dependent step's Primitive (and a re-plan's Router) sees them;
the gold teacher derives them from where the next gold argument sits in the result; a
malformed messages answer is a recorded failure, never a crash."""

import json

import jsonschema
from fakes import PASS, HashingEmbedder, Script, dispatch, echo_bindings, fail, plan

from heart.calls import EpisodeContext, RoleClient
from heart.environments.base import Task, ToolCall
from heart.ledger import audit_trace
from heart.loop import HeartLoop, LoopConfig
from heart.roles import primitive, primitive_messages
from heart.runtime import ScriptedBackend
from heart_distill.data.gold_teacher import GoldTeacher, message_for
from heart.toolface import Tool, ToolFace, ToolSpec
from heart.traces import TraceWriter, read_trace


def tools():
    files = {"notes.md": "todo", "report.txt": "budget analysis"}

    def ls():
        return {"files": sorted(files)}

    def cat(file_name: str):
        return {"content": files.get(file_name, "")}

    string = {"type": "string"}
    return [Tool(ToolSpec("ls", "List the files in the current folder.", {"type": "object", "properties": {}}), ls),
            Tool(ToolSpec("cat", "Show the content of a file.",
                          {"type": "object", "properties": {"file_name": string}, "required": ["file_name"]}), cat)]


def make_loop(backend, tmp_path, **config):
    trace = TraceWriter(tmp_path / "trace.jsonl", fsync=False)
    client = RoleClient(backend, EpisodeContext("ep1", "task1", "test"), trace)
    toolface = ToolFace(tools(), cache_dir=tmp_path / "cache", embedder=HashingEmbedder())
    return HeartLoop(client, toolface, lambda q: "report.txt", LoopConfig(**config)), trace


def to_step_2(field, note=""):
    return lambda p: {"tool": p["tool"], "messages": [{"to": 2, "field": field, "note": note}]}


def test_messages_reach_the_dependent_primitive_and_a_replans_router(tmp_path):
    script = Script(
        planner=[lambda p: plan(("ls", "list"), ("cat", "read the report", [1]), replanned=bool(p.get("feedback")))],
        router=[dispatch(("ls", {}), ("cat", {"file_name": "$step_1.files.0"})),
                dispatch(("ls", {}), ("cat", {"file_name": "$step_1.files.1"}))],
        primitive=[echo_bindings],
        messages=[to_step_2("result.files.1", "the report is the second file")],
        verifier=[PASS, fail("step 2 read notes.md, not the report"), PASS],
    )
    loop, trace = make_loop(ScriptedBackend(script), tmp_path)
    result = loop.solve("Read my report")
    trace.close()
    assert result.verdict == "PASS" and len(result.attempts) == 2
    first = result.attempts[0].results[1]
    assert first.messages == [{"to": 2, "field": "result.files.1", "note": "the report is the second file"}]
    # the messages input: the step's result and the steps that read it, with the bindings they read
    asked = [p for role, p in script.calls if role == "messages"][0]
    assert asked["result"] == {"files": ["notes.md", "report.txt"]}
    assert asked["dependents"] == [{"step": 2, "tool": "cat", "objective": "read the report", "reads": ["file_name"]}]
    # the dependent step's Primitive sees the message, with the value its field names
    cat_inputs = [p for role, p in script.calls if role == "primitive" and p["tool"]["name"] == "cat"]
    assert cat_inputs[0]["upstream_context"][0]["messages"] == [
        {"field": "result.files.1", "note": "the report is the second file", "value": "report.txt"}]
    # the re-plan's Router sees them in executed_so_far (it dispatched before step 1 ran in attempt 0)
    routers = [p for role, p in script.calls if role == "router"]
    assert "executed_so_far" not in routers[0]
    assert routers[1]["executed_so_far"][0]["messages"] == [
        {"field": "result.files.1", "note": "the report is the second file"}]
    # the Planner's view of executed steps stays as it was
    planners = [p for role, p in script.calls if role == "planner"]
    assert "messages" not in json.dumps(planners[1]["executed_so_far"])
    events = [r for r in read_trace(tmp_path / "trace.jsonl") if r["kind"] == "event"]
    sent = [e for e in events if e["extra"].get("mode") == "messages"]
    # once per attempt in which a pending step reads step 1 (the kept step of attempt 1 too)
    assert [e["attempt"] for e in sent] == [0, 1] and all(e["step"] == 1 for e in sent)
    assert sent[0]["extra"]["envelope"]["messages"][0]["field"] == "result.files.1"
    # a messages call carries its step's envelope, yet runs no tool: audits do not count it
    audit = audit_trace(read_trace(tmp_path / "trace.jsonl"))
    assert audit["passed_steps_reexecuted"] == 0 and audit["reused_steps"] == 1


def test_no_messages_call_when_no_step_reads_the_result_or_messages_are_off(tmp_path):
    script = Script(planner=[plan(("ls", "list"), ("cat", "read", [1]))],
                    router=[dispatch(("ls", {}), ("cat", {"file_name": "report.txt"}))],
                    primitive=[echo_bindings], verifier=[PASS])
    loop, _ = make_loop(ScriptedBackend(script), tmp_path)
    assert loop.solve("Read report.txt").verdict == "PASS" and script.count("messages") == 0
    script = Script(planner=[plan(("ls", "list"), ("cat", "read", [1]))],
                    router=[dispatch(("ls", {}), ("cat", {"file_name": "$step_1.files.1"}))],
                    primitive=[echo_bindings], verifier=[PASS])
    loop, _ = make_loop(ScriptedBackend(script), tmp_path / "off", messages=False)
    assert loop.solve("Read my report").verdict == "PASS" and script.count("messages") == 0


def test_malformed_messages_are_recorded_failures_and_the_turn_goes_on(tmp_path):
    answers = ["not json at all",
               lambda p: {"tool": p["tool"], "messages": [{"to": 7, "field": "result.files.0", "note": ""}]},
               lambda p: {"tool": p["tool"], "messages": [{"to": 2, "field": "files.0; rm -rf", "note": ""}]},
               lambda p: {"tool": p["tool"], "messages": "step 2 wants the report"},
               to_step_2("result.nowhere.3")]
    for i, answer in enumerate(answers):
        script = Script(planner=[plan(("ls", "list"), ("cat", "read", [1]))],
                        router=[dispatch(("ls", {}), ("cat", {"file_name": "$step_1.files.1"}))],
                        primitive=[echo_bindings], messages=[answer], verifier=[PASS])
        loop, trace = make_loop(ScriptedBackend(script), tmp_path / str(i))
        result = loop.solve("Read my report")
        trace.close()
        assert result.verdict == "PASS", answer  # the step keeps its result; no message is sent
        assert result.attempts[0].results[1].messages == []
        cat_input = [p for role, p in script.calls if role == "primitive" and p["tool"]["name"] == "cat"][0]
        assert "messages" not in cat_input["upstream_context"][0]
        event = next(r for r in read_trace(tmp_path / str(i) / "trace.jsonl")
                     if r["kind"] == "event" and r["extra"].get("mode") == "messages")
        if i < 4:
            assert event["parse_error"], answer
        else:  # parsed, but its field names nothing in the result: kept out, and recorded
            assert event["extra"]["unresolved_messages"][0]["field"] == "result.nowhere.3"


def test_the_messages_schema_accepts_what_the_parser_accepts():
    payload = primitive_messages.build_payload("ls", "list", {"files": ["a"]},
                                               [primitive_messages.dependent(2, "cat", "read", ["file_name"])])
    schema = primitive.schema_for_input(payload)  # the Primitive role's serving schema dispatches on the input
    good = {"tool": "ls", "messages": [{"to": 2, "field": "result.files.0", "note": ""}]}
    assert jsonschema.Draft202012Validator(schema).is_valid(good)
    assert primitive.parse_for_input(json.dumps(good), payload).ok
    assert primitive.parse_for_input(json.dumps({"tool": "ls", "messages": []}), payload).ok
    for bad in ({**good, "tool": "cat"},
                {"tool": "ls", "messages": [{"to": 3, "field": "result", "note": ""}]},
                {"tool": "ls", "messages": [{"to": 2, "field": "$step_1.files", "note": ""}]},
                {"tool": "ls", "messages": [{"to": 2, "field": "result", "note": "x" * 500}]}):
        assert not jsonschema.Draft202012Validator(schema).is_valid(bad), bad
        assert not primitive.parse_for_input(json.dumps(bad), payload).ok, bad


def test_the_messages_mode_is_served_as_the_primitive_role_is_trained():
    # a context-distilled Primitive adapter learns every non-relevance row under the role's
    # short prompt; the loop must serve the messages mode with that very prompt
    assert primitive_messages.ROLE == primitive.ROLE
    assert primitive_messages.SHORT_SYSTEM_PROMPT == primitive.SHORT_SYSTEM_PROMPT
    assert primitive_messages.INSTRUCTION != primitive.INSTRUCTION


def test_teacher_messages_name_the_field_where_the_next_gold_argument_is():
    result = {"transactions": [{"id": 1, "recipient": "CH93007620", "amount": 100.0},
                               {"id": 2, "recipient": "GB29NWBK60", "amount": 200}]}
    assert message_for(result, {"recipient": "GB29NWBK60"}) == {
        "field": "result.transactions.1.recipient", "note": "item 1 of a list of 2"}
    # several values of one dependent: the field holding them all
    assert message_for(result, {"recipient": "GB29NWBK60", "amount": 200})["field"] == "result.transactions.1"
    # a value inside a longer text, and a value that is not in the result
    assert message_for({"body": "please open report.txt today"}, {"file_name": "report.txt"}) == {
        "field": "result.body", "note": "file_name inside the text"}
    assert message_for(result, {"recipient": "nowhere"}) is None


def test_gold_teacher_messages_reach_the_dependent_step_in_the_loop(tmp_path):
    task = Task("t1", "test", ["Read my report"],
                gold=[[ToolCall("ls", {}), ToolCall("cat", {"file_name": "report.txt"})]])
    teacher = GoldTeacher(task, [t.spec for t in tools()])
    loop, trace = make_loop(teacher, tmp_path)
    result = loop.solve("Read my report")
    trace.close()
    assert result.verdict == "PASS" and "budget analysis" in result.response
    assert result.attempts[0].results[1].messages == [
        {"to": 2, "field": "result.files.1", "note": "item 1 of a list of 2"}]
    cat_event = next(r for r in read_trace(tmp_path / "trace.jsonl") if r["kind"] == "event"
                     and r["role"] == "primitive" and r["step"] == 2)
    assert '"value":"report.txt"' in cat_event["messages"][-1]["content"]
