"""Tool-boundary middleware as data (heart/middleware.py): PRISM's three intercept patterns
on real BFCL tools, the default set's equivalence to the old hard-coded coercion, and the
load-time refusals."""

from __future__ import annotations

import pytest

from heart.environments.bfcl import BFCLEnvironment
from heart.episode import run_episode
from heart.loop import LoopConfig
from heart_distill.data.gold_teacher import GoldTeacher
from heart.middleware import NO_MIDDLEWARE, MiddlewareError, TurnCalls, load_middleware, parse_guard
from heart.primitives import CONSTRAINT_VIOLATION, SCHEMA_RESOLUTION, bind_arguments, execute, execute_with_retry

GUARDS = """\
format: heart-middleware/1
name: guards
version: 2
intercepts:
  - id: cd-one-level
    pattern: error_blocking
    guard: {tool: cd, parameter: folder, when: "matches('/')"}
    action: {message: "cd changes one folder level at a time: call cd once per folder of {value}"}
    reason: BFCL's cd refuses paths; a path is a common first try.
  - id: remove-only-listed
    pattern: prerequisite_blocking
    guard: {tool: rm, parameter: file_name, when: "present and not prior_call(tool=ls, field=current_directory_content)"}
    action: {message: "{tool}: {parameter}={value} was not listed in this turn; call ls first and use a name it shows"}
    reason: Never remove a file the agent has not seen.
  - id: move-only-listed
    pattern: prerequisite_blocking
    guard: {tool: mv, parameter: source, when: "not prior_call(tool=ls|find, field=current_directory_content)"}
    action: {message: "{tool}: {parameter}={value} was not listed in this turn; call ls first and use a name it shows"}
    reason: Never move a file the agent has not seen.
"""


@pytest.fixture(scope="module")
def bfcl() -> BFCLEnvironment:
    return BFCLEnvironment()


def session_tools(env, task_id="multi_turn_base_0"):
    session = env.start(env.load_task(task_id))
    session.start_turn(0)
    return session, {t.name: t for t in session.tools}


def guards(tmp_path, text=GUARDS, catalog=None):
    path = tmp_path / "guards.yaml"
    path.write_text(text)
    return load_middleware(path, catalog=catalog)


# -- silent correction -------------------------------------------------------------------
def test_default_set_corrects_json_wrapped_and_numeric_strings_on_math_api_and_the_tool_runs(bfcl):
    session, tools = session_tools(bfcl, "multi_turn_base_15")  # involves MathAPI
    envelope = execute(tools["mean"], {"numbers": "[1, 2, 4.5]"})
    assert envelope.ok and envelope.bound_arguments == {"numbers": [1, 2, 4.5]}
    applied = envelope.meta["middleware"]
    assert applied["set"] == "default@1"
    assert applied["applied"] == [{"id": "unwrap-json-container", "pattern": "silent_correction", "tool": "mean",
                                   "parameter": "numbers", "before": "[1, 2, 4.5]", "after": [1, 2, 4.5]}]
    rounded = execute_with_retry(tools["round_number"], {"number": "3.14159", "decimal_places": "2"})
    assert rounded.ok and rounded.bound_arguments == {"number": 3.14159, "decimal_places": 2}
    assert [a["parameter"] for a in rounded.meta["middleware"]["applied"]] == ["number", "decimal_places"]
    assert "middleware" in rounded.to_dict()["meta"] and "middleware" not in rounded.for_input()["meta"]
    assert [c.name for c in session.executed_calls()[0]] == ["mean", "round_number"]
    # switched off: the same call is refused before the tool runs, and nothing is recorded
    off = execute(tools["mean"], {"numbers": "[1, 2, 4.5]"}, middleware=NO_MIDDLEWARE)
    assert not off.ok and off.failure_type == CONSTRAINT_VIOLATION and "middleware" not in off.meta
    assert len(session.executed_calls()[0]) == 2


def test_default_set_binds_exactly_as_the_hard_coded_coercion_did():
    schema = {"type": "object", "properties": {
        "count": {"type": "integer"}, "urgent": {"type": "boolean"}, "tags": {"type": "array", "items": {"type": "integer"}},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}, "name": {"type": "string"}}}
    given = {"count": 3.0, "urgent": "yes", "tags": '["1", 2.0]', "unit": "Celsius", "name": 7}
    records: list = []
    bound = bind_arguments(given, schema, middleware=load_middleware("default"), records=records)
    assert bound == bind_arguments(given, schema) == {"count": 3, "urgent": True, "tags": [1, 2],
                                                      "unit": "celsius", "name": "7"}
    assert type(bound["count"]) is int and [type(t) for t in bound["tags"]] == [int, int]
    assert [r["id"] for r in records] == ["coerce-to-schema-type", "coerce-to-schema-type", "unwrap-json-container",
                                          "coerce-to-schema-type", "enum-casefold", "coerce-to-schema-type"]
    with pytest.raises(Exception, match="cannot read 'many' as integer"):
        bind_arguments({"count": "many"}, schema)
    with pytest.raises(Exception, match="'3' is not of type 'integer'"):  # switched off: bound as given
        bind_arguments({"count": "3"}, schema, middleware=NO_MIDDLEWARE)


def test_rename_moves_a_misnamed_argument_to_its_parameter(bfcl, tmp_path):
    middleware = guards(tmp_path, """\
format: heart-middleware/1
name: names
version: 1
intercepts:
  - id: cd-directory-is-folder
    pattern: silent_correction
    guard: {tool: cd, parameter: folder, when: missing}
    action: {correct: rename, from: [directory, dir]}
    reason: Models call cd(directory=...).
""", catalog=bfcl.catalog())
    _, tools = session_tools(bfcl)
    envelope = execute(tools["cd"], {"directory": "document"}, middleware=middleware)
    assert envelope.ok and envelope.bound_arguments == {"folder": "document"}
    assert envelope.meta["middleware"]["applied"][0]["before"] == "directory"


# -- error blocking ----------------------------------------------------------------------
def test_error_blocking_answers_before_execution_and_the_corrected_retry_runs(bfcl, tmp_path):
    middleware = guards(tmp_path, catalog=bfcl.catalog())
    session, tools = session_tools(bfcl)
    blocked = execute_with_retry(tools["cd"], {"folder": "document/reports"}, middleware=middleware, attempts=3)
    assert blocked.status == "FAILURE" and blocked.failure_type == CONSTRAINT_VIOLATION
    assert blocked.details == "cd changes one folder level at a time: call cd once per folder of document/reports"
    assert blocked.meta["attempts"] == 1  # a block is not retried: the model must change the call
    assert blocked.meta["middleware"]["applied"][0]["id"] == "cd-one-level"
    assert session.executed_calls()[0] == []  # the tool never ran
    retry = execute_with_retry(tools["cd"], {"folder": "document"}, middleware=middleware)
    assert retry.ok and retry.result == {"current_working_directory": "document"}
    assert "middleware" not in retry.meta


# -- prerequisite blocking ---------------------------------------------------------------
def test_prerequisite_blocking_holds_a_mutation_until_the_turn_listed_its_target(bfcl, tmp_path):
    middleware = guards(tmp_path, catalog=bfcl.catalog())
    session, tools = session_tools(bfcl)
    calls = TurnCalls()
    blocked = execute(tools["rm"], {"file_name": "archive"}, middleware=middleware, calls=calls)
    assert not blocked.ok and blocked.failure_type == CONSTRAINT_VIOLATION
    assert "file_name=archive was not listed in this turn; call ls first" in blocked.details
    assert blocked.meta["middleware"]["applied"][0]["pattern"] == "prerequisite_blocking"
    assert session.executed_calls()[0] == []
    assert not execute(tools["mv"], {"source": "archive", "destination": "new"}, middleware=middleware,
                       calls=calls).ok
    listed = execute(tools["ls"], {}, middleware=middleware, calls=calls)
    assert listed.ok and calls.calls[0][0] == "ls"
    # the listed folder may now be removed; a name ls never showed still may not
    assert "was not listed" in execute(tools["rm"], {"file_name": "secret.txt"}, middleware=middleware,
                                       calls=calls).details
    removed = execute(tools["rm"], {"file_name": "archive"}, middleware=middleware, calls=calls)
    assert removed.ok, removed.details
    assert [c.name for c in session.executed_calls()[0]] == ["ls", "rm"]
    # the listing's own result is what prior_call read: intercepts never edit results
    assert listed.result == {"current_directory_content": ["document", "archive"]}


# -- load-time refusals ------------------------------------------------------------------
BASE = "format: heart-middleware/1\nname: bad\nversion: 1\nintercepts:\n"


@pytest.mark.parametrize("row, field, why", [
    ("- {id: a, pattern: silent_fix, guard: {tool: cd, when: missing}, action: {correct: rename}, reason: r}",
     "intercepts[0] (a).pattern", "unknown pattern 'silent_fix'"),
    ("- {id: a, pattern: error_blocking, guard: {tool: cd, when: 'missing and (present'}, action: {message: m}, reason: r}",
     "intercepts[0] (a).guard.when", "does not parse"),
    ("- {id: a, pattern: error_blocking, guard: {tool: cd, when: 'is_large'}, action: {message: m}, reason: r}",
     "intercepts[0] (a).guard.when", "unknown predicate 'is_large'"),
    ("- {id: a, pattern: error_blocking, guard: {tool: remove, when: missing}, action: {message: m}, reason: r}",
     "intercepts[0] (a).guard.tool", "unknown tool 'remove'"),
    ("- {id: a, pattern: error_blocking, guard: {tool: cd, parameter: path, when: missing}, action: {message: m}, reason: r}",
     "intercepts[0] (a).guard.parameter", "tool 'cd' has no parameter 'path'"),
    ("- {id: a, pattern: prerequisite_blocking, guard: {tool: rm, when: 'not prior_call(tool=list)'}, action: {message: m}, reason: r}",
     "intercepts[0] (a).guard.when", "prior_call names unknown tool 'list'"),
    ("- {id: a, pattern: prerequisite_blocking, guard: {tool: rm, when: missing}, action: {message: m}, reason: r}",
     "intercepts[0] (a).guard.when", "needs a prior_call"),
    ("- {id: a, pattern: error_blocking, guard: {tool: cd, when: missing}, action: {message: m}}",
     "intercepts[0] (a).reason", "required"),
])
def test_a_bad_intercept_file_is_refused_at_load_naming_file_and_field(bfcl, tmp_path, row, field, why):
    path = tmp_path / "bad.yaml"
    path.write_text(BASE + "  " + row + "\n")
    with pytest.raises(MiddlewareError) as err:
        load_middleware(path, catalog=bfcl.catalog())
    assert str(err.value).startswith(f"{path}: {field}: ") and why in str(err.value)


def test_unknown_names_pass_without_a_catalog_and_bad_files_are_refused_whole(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(BASE + "  - {id: a, pattern: error_blocking, guard: {tool: remove, when: missing}, "
                           "action: {message: m}, reason: r}\n")
    assert load_middleware(path).intercepts[0].tool == "remove"
    path.write_text("format: heart-middleware/9\nname: x\nversion: 1\nintercepts: []\n")
    with pytest.raises(MiddlewareError, match=r"m.yaml: format: must be 'heart-middleware/1'"):
        load_middleware(path)
    with pytest.raises(MiddlewareError, match="no such middleware file"):
        load_middleware(tmp_path / "absent.yaml")
    assert load_middleware("none") is NO_MIDDLEWARE
    assert parse_guard("not (missing or matches('a,b'))").atoms == (("missing", (), {}), ("matches", ("a,b",), {}))


def test_the_loop_applies_its_configured_set_per_turn_and_traces_every_block(bfcl, tmp_path):
    """Through HEART's loop (the gold teacher, BFCL task 0): the gold ``mv`` of turn 0 names a
    file no ``ls`` of the turn showed, so every attempt's ``mv`` is blocked, never run, and the
    Primitive event's envelope says which intercept blocked it."""
    path = tmp_path / "guards.yaml"
    path.write_text(GUARDS)
    task = bfcl.load_task("multi_turn_base_0")
    result = run_episode(bfcl, task, GoldTeacher(task, bfcl.catalog()),
                         config=LoopConfig(replan_budget=1, middleware=str(path)))
    first = result.turns[0].attempts
    blocked = [r for a in first for r in a.results.values() if r.tool == "mv"]
    assert len(blocked) == 2 and all(r.meta["middleware"]["applied"][0]["id"] == "move-only-listed" for r in blocked)
    assert all(r.status == "FAILURE" and r.failure_type == CONSTRAINT_VIOLATION for r in blocked)


def test_an_error_block_reaches_the_model_and_its_retry_succeeds(bfcl, tmp_path):
    """Through the loop on BFCL's real ``cd``: the Primitive's first call (a path) is blocked
    before execution with cd-one-level's message; the Verifier fails the step, the re-plan's
    Primitive reads the message in its feedback and calls ``cd`` with one folder, which runs."""
    from fakes import HashingEmbedder, Script, dispatch, fail, plan, verdict

    from heart.calls import EpisodeContext, RoleClient
    from heart.loop import HeartLoop
    from heart.runtime import ScriptedBackend
    from heart.toolface import ToolFace

    session, tools = session_tools(bfcl)
    toolface = ToolFace([tools["cd"], tools["ls"]], cache_dir=tmp_path / "cache", embedder=HashingEmbedder())
    seen_feedback = []

    def primitive(payload):
        blocked_before = any("one folder level" in f for f in seen_feedback)
        return {"tool": "cd", "arguments": {"folder": "document" if blocked_before else "document/reports"}}

    def planner(payload):
        seen_feedback.extend(payload.get("feedback") or [])
        return plan(("cd", "go to the reports folder"), replanned=bool(payload.get("feedback")))

    def verifier(payload):
        envelope = payload["steps"][0]["envelope"]
        if envelope["status"] == "FAILURE":
            return fail(envelope["details"])(payload)
        return verdict(payload)

    script = Script(planner=[planner], router=[dispatch(("cd", {"folder": "document"}))],
                    primitive=[primitive], verifier=[verifier])
    client = RoleClient(ScriptedBackend(script), EpisodeContext("ep", "multi_turn_base_0", "bfcl"))
    (tmp_path / "g.yaml").write_text(GUARDS)
    loop = HeartLoop(client, toolface, lambda q: "", LoopConfig(replan_budget=1, middleware=str(tmp_path / "g.yaml"),
                                                                   code=False))
    result = loop.solve("go to the reports folder")
    first, second = (a.results[1] for a in result.attempts)
    assert first.status == "FAILURE" and first.meta["middleware"]["applied"][0]["id"] == "cd-one-level"
    assert "one folder level" in first.details and any("one folder level" in f for f in seen_feedback)
    assert second.ok and second.result == {"current_working_directory": "document"} and result.verdict == "PASS"
