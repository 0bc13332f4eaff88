"""Carried validation after execution (HEELO): a result checked against the shape mined for its
tool, a state-changing call checked against the environment's state before and after; both
recorded in the envelope as evidence the Verifier sees, never a crash and never a FAILURE."""

import json

import pytest
from fakes import PASS, HashingEmbedder, Script, dispatch, echo_bindings, plan

from heart.calls import EpisodeContext, RoleClient
from heart.loop import HeartLoop, LoopConfig
from heart.runtime import ScriptedBackend
from heart.toolface import Tool, ToolFace, ToolSpec
from heart.validation import (
    CarriedValidation,
    ResultShapes,
    ShapesFormatError,
    load_result_shapes,
    shapes_document,
    state_change,
    state_view,
)

LS_SHAPE = {"type": "object", "required": ["files"], "properties": {"files": {"type": "array"}}}


class Drive:
    """A stateful tool set whose state the loop may look at (as sessions expose ``state()``)."""

    def __init__(self):
        self.files = {"report.txt": "budget analysis"}
        self.log = []

    def state(self):
        return {"files": dict(self.files), "log": list(self.log)}

    def tools(self):
        def ls():
            return {"items": len(self.files)}  # not the shape the table knows for ls

        def touch(file_name: str):
            self.files[file_name] = ""
            return {"created": file_name}

        def rename_nothing(file_name: str):  # state-changing by name, changes nothing
            return {"ok": True}

        def archive(file_name: str):  # changes the state, but not with what it was asked
            self.log.append("archived something")
            return {"ok": True}

        string = {"type": "object", "properties": {"file_name": {"type": "string"}}, "required": ["file_name"]}
        return [Tool(ToolSpec("ls", "List files.", {"type": "object", "properties": {}}), ls),
                Tool(ToolSpec("touch", "Create a file.", string), touch),
                Tool(ToolSpec("rename_nothing", "Rename a file.", string), rename_nothing),
                Tool(ToolSpec("archive", "Archive a file.", string), archive)]


def shapes_file(tmp_path, schemas):
    path = tmp_path / "shapes.json"
    path.write_text(json.dumps(shapes_document(schemas, {"split": "train"})))
    return str(path)


def run(tmp_path, steps, state=True, shapes=None):
    drive = Drive()
    script = Script(planner=[plan(*[(tool, "do it") for tool, _ in steps])],
                    router=[dispatch(*steps)], primitive=[echo_bindings], verifier=[PASS])
    client = RoleClient(ScriptedBackend(script), EpisodeContext("ep", "t", "test"))
    toolface = ToolFace(drive.tools(), cache_dir=tmp_path / "cache", embedder=HashingEmbedder())
    config = LoopConfig(validation=shapes or shapes_file(tmp_path, {"ls": LS_SHAPE}))
    loop = HeartLoop(client, toolface, lambda q: "", config, state=drive.state if state else None)
    result = loop.solve("tidy my files")
    return result, [p for role, p in script.calls if role == "verifier"]


def test_a_shape_mismatch_is_recorded_and_shown_to_the_verifier_not_a_failure(tmp_path):
    result, verifier_inputs = run(tmp_path, [("ls", {})])
    envelope = result.attempts[0].results[1]
    assert envelope.ok and result.verdict == "PASS"  # evidence, not a FAILURE
    assert envelope.validation["shape"] == "mismatch" and "files" in envelope.validation["details"]
    assert envelope.validation["state_change"] == "n/a"  # a read: no state check
    assert verifier_inputs[0]["steps"][0]["envelope"]["validation"] == envelope.validation


def test_state_changes_are_checked_against_the_asked_values(tmp_path):
    result, verifier_inputs = run(tmp_path, [("touch", {"file_name": "plan.md"}),
                                             ("rename_nothing", {"file_name": "plan.md"}),
                                             ("archive", {"file_name": "plan.md"})])
    checks = {r.tool: r.validation for r in result.attempts[0].results.values()}
    assert checks["touch"] == {"shape": "unknown", "state_change": "ok", "details": "no mined result shape for touch"}
    assert checks["rename_nothing"]["state_change"] == "none"
    assert checks["archive"]["state_change"] == "unmatched"
    assert [v["steps"][0]["envelope"]["validation"]["state_change"] for v in verifier_inputs] == [
        "ok", "none", "unmatched"]


def test_no_state_or_a_broken_state_is_na_never_a_crash(tmp_path):
    result, _ = run(tmp_path, [("touch", {"file_name": "a.md"})], state=False)
    assert result.attempts[0].results[1].validation["state_change"] == "n/a"

    def broken():
        raise RuntimeError("the backend went away")

    carried = CarriedValidation(ResultShapes({"ls": {"type": "object"}}, {}), broken)
    record = carried.check("touch", {"file_name": "a"}, {"x": 1}, carried.snapshot("touch"))
    assert record["state_change"] == "n/a" and "the backend went away" in record["details"]
    # a result cut for size is not judged by its shape
    assert ResultShapes({"ls": LS_SHAPE}, {}).check("ls", "{\"files\": [… [result cut: 90,000 characters of JSON]")[0] \
        == "unknown"


def test_validation_none_records_nothing(tmp_path):
    result, verifier_inputs = run(tmp_path, [("touch", {"file_name": "a.md"})], shapes="none")
    assert result.attempts[0].results[1].validation == {}
    assert "validation" not in verifier_inputs[0]["steps"][0]["envelope"]


@pytest.mark.parametrize("content, problem", [
    ("not json", "cannot read"),
    (json.dumps({"format": "something else"}), "not a result-shapes file"),
    (json.dumps({"format": "heart.result_shapes", "version": 99, "tools": {}}), "version 99"),
    (json.dumps({"format": "heart.result_shapes", "version": 1, "tools": ["ls"]}), "'tools' must map"),
])
def test_a_bad_shapes_file_is_refused_with_a_clear_error(tmp_path, content, problem):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ShapesFormatError, match=problem):
        load_result_shapes(str(path))


def test_the_shipped_table_covers_both_benchmarks_tools():
    shapes = load_result_shapes()
    assert {"ls", "cd", "send_money", "send_email", "get_most_recent_transactions"} <= set(shapes.schemas)
    assert shapes.check("send_money", {"message": "Transaction to X for 10 sent."})[0] == "ok"
    assert shapes.check("send_money", {"error": "no such account"})[0] == "mismatch"
    assert shapes.check("get_most_recent_transactions", [{"id": 1}])[0] == "mismatch"  # keys every result had


def test_state_view_follows_objects_and_cuts_cycles():
    class Directory:
        def __init__(self, name, parent=None):
            self.name, self.parent, self.contents = name, parent, {}

    root = Directory("root")
    root.contents["docs"] = Directory("docs", root)
    view = state_view({"root": root, "_current_dir": root.contents["docs"]})
    assert view["root"]["contents"]["docs"]["parent"] == "<cycle Directory>"
    json.dumps(view)  # plain JSON
    before = state_view({"root": root})
    root.contents["new_dir"] = Directory("new_dir", root)
    assert state_change(before, state_view({"root": root}), {"dir_name": "new_dir"})[0] == "ok"
