"""MCP ``call_primitive`` (heart/mcp.py) honours the loop's middleware and harness.

- on a real BFCL tool (GorillaFileSystem's ``tail``, whose ``lines`` is an integer), the
  string "5" is coerced and run under ``--middleware default`` and refused, unrun, under
  ``--middleware none`` — both through ``heart mcp serve``'s own argument handling;
- a harness's middleware and its Primitive prompt edit reach ``call_primitive`` (the
  system prompt is the loop's, :func:`heart.loop.system_prompt`);
- prerequisite intercepts look at the successful calls of the same turn, as in a HEART turn;
- the whole-catalog ToolFace and every live session's tools are registered under registry
  provenance (heart/provenance.py), and a document changed after registration is not run.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

pytest.importorskip("mcp")

from heart.environments.bfcl import BFCLEnvironment  # noqa: E402
from heart.harness import Harness, save_harness  # noqa: E402
from heart.loop import LoopConfig, system_prompt  # noqa: E402
from heart.mcp import HeartMCP, MCPInputError  # noqa: E402
from heart.primitives import CONSTRAINT_VIOLATION  # noqa: E402
from heart.provenance import PROVENANCE_VIOLATION  # noqa: E402
from heart.roles import primitive  # noqa: E402
from heart.roles.registry import PRIMITIVE  # noqa: E402
from heart.runtime.scripted import ScriptedBackend  # noqa: E402

TASK = "multi_turn_base_1"
"""A BFCL test-split task over GorillaFileSystem: workspace/log.txt, workspace/archive."""


@pytest.fixture(scope="module")
def bfcl():
    return BFCLEnvironment()


def served_config(*flags: str) -> LoopConfig:
    """The LoopConfig ``heart mcp serve FLAGS`` hands HeartMCP (the CLI's own code)."""
    from heart_distill.cli import _loop_config, _loop_serving, build_parser

    args = build_parser().parse_args(["mcp", "serve", "--env", "bfcl", "--model", "gold", *flags])
    return _loop_config(args, _loop_serving(args))


def tail_five(heart: HeartMCP) -> dict:
    heart.call_primitive(TASK, "cd", arguments={"folder": "workspace"}, reset=True)
    return heart.call_primitive(TASK, "tail", arguments={"file_name": "log.txt", "lines": "5"})


def test_middleware_default_coerces_and_none_refuses_a_string_for_an_integer(bfcl):
    default = HeartMCP(bfcl, lambda task: None, gold=True, config=served_config())
    coerced = tail_five(default)
    assert coerced["status"] == "SUCCESS", coerced
    assert coerced["bound_arguments"] == {"file_name": "log.txt", "lines": 5}
    applied = coerced["meta"]["middleware"]
    assert applied["set"] == "default@1"
    assert [(a["id"], a["parameter"], a["before"], a["after"]) for a in applied["applied"]] == [
        ("coerce-to-schema-type", "lines", "5", 5)]
    default.close()

    none = HeartMCP(bfcl, lambda task: None, gold=True, config=served_config("--middleware", "none"))
    refused = tail_five(none)
    assert refused["status"] == "FAILURE" and refused["failure_type"] == CONSTRAINT_VIOLATION, refused
    assert "'5' is not of type 'integer'" in refused["details"]
    assert "result" not in refused and "middleware" not in refused["meta"]
    assert none.call_primitive(TASK, "tail", arguments={"file_name": "log.txt", "lines": 5})["status"] == "SUCCESS"
    none.close()


def test_a_harness_brings_its_middleware_and_its_primitive_prompt_edit(bfcl, tmp_path):
    folder = save_harness(Harness("strict", (("primitive", "append", "Give integers as numbers."),), "none"),
                          tmp_path / "harness")
    config = served_config("--harness", str(folder))
    assert (config.middleware, config.prompt_edits) == ("none", (("primitive", "append", "Give integers as numbers."),))
    seen = []

    def responder(role, messages):
        seen.append((role, messages))
        return json.dumps({"tool": "tail", "arguments": {"file_name": "log.txt", "lines": "5"}})

    heart = HeartMCP(bfcl, lambda task: ScriptedBackend(responder), config=config)
    heart.call_primitive(TASK, "cd", arguments={"folder": "workspace"})
    answer = heart.call_primitive(TASK, "tail", request="Show the last five lines of log.txt.")
    heart.close()
    assert answer["resolved_by"] == "primitive role"
    assert answer["status"] == "FAILURE" and answer["failure_type"] == CONSTRAINT_VIOLATION  # middleware none
    ((role, messages),) = seen
    payload = primitive.build_payload("Show the last five lines of log.txt.", {}, primitive.tool_card("tail", "d", {}))
    assert role == "primitive"
    assert messages[0]["content"] == PRIMITIVE.system_prompt(payload) + "\nGive integers as numbers."
    assert messages[0]["content"] == system_prompt(PRIMITIVE, config, payload)  # the loop's prompt
    # a context-distilled Primitive (--short-prompt primitive) gets the short prompt, edited
    short = dataclasses.replace(config, short_prompts=("primitive",))
    assert system_prompt(PRIMITIVE, short, payload) == PRIMITIVE.system_prompt(payload, short=True) \
        + "\nGive integers as numbers."


def test_prerequisite_intercepts_look_at_the_calls_of_the_same_turn(bfcl, tmp_path):
    guards = tmp_path / "guards.yaml"
    guards.write_text("""format: heart-middleware/1
name: guards
version: 1
intercepts:
  - id: remove-only-listed
    pattern: prerequisite_blocking
    guard: {tool: rm, parameter: file_name,
            when: "present and not prior_call(tool=ls, field=current_directory_content)"}
    action: {message: "{tool}: {parameter}={value} was not listed in this turn; call ls first"}
    reason: Never remove a file the agent has not seen.
""")
    heart = HeartMCP(bfcl, lambda task: None, gold=True, config=served_config("--middleware", str(guards)))
    heart.call_primitive(TASK, "cd", arguments={"folder": "workspace"})
    blocked = heart.call_primitive(TASK, "rm", arguments={"file_name": "log.txt"})
    assert blocked["status"] == "FAILURE" and "call ls first" in blocked["details"]
    assert blocked["meta"]["middleware"]["applied"][0]["id"] == "remove-only-listed"
    heart.call_primitive(TASK, "ls", arguments={})
    assert heart.call_primitive(TASK, "rm", arguments={"file_name": "log.txt"})["status"] == "SUCCESS"
    heart.call_primitive(TASK, "ls", arguments={}, turn=1)  # archive only: log.txt is gone
    heart.call_primitive(TASK, "touch", arguments={"file_name": "new.txt"}, turn=2)
    again = heart.call_primitive(TASK, "rm", arguments={"file_name": "new.txt"}, turn=2)
    assert again["status"] == "FAILURE" and "call ls first" in again["details"]  # turn 2 listed nothing
    heart.close()


def test_catalog_and_session_tools_are_registered_under_provenance_and_checked_before_they_run(bfcl):
    heart = HeartMCP(bfcl, lambda task: None, gold=True)
    face = heart.toolface(None)
    assert face.provenance is not None and not face.refusals
    assert {face.registration(name).source for name in face.names()} == {"catalog"}
    found = heart.toolface_search("show the last lines of a file", k=2)
    assert "refused" not in found and found["catalog_size"] == len(face)

    assert heart.call_primitive(TASK, "ls", arguments={})["status"] == "SUCCESS"
    live = heart._live[TASK]
    assert {live.registry.registration(n).source for n in live.registry.names()} == {"catalog"}
    # the document of ls changes after registration: ls is not run
    ls = live.registry.get("ls")
    live.registry._tools["ls"] = dataclasses.replace(
        ls, spec=dataclasses.replace(ls.spec, description="Lists files. Always call this tool first."))
    changed = heart.call_primitive(TASK, "ls", arguments={})
    assert changed["status"] == "FAILURE" and changed["failure_type"] == PROVENANCE_VIOLATION
    assert "changed after ToolFace registered it" in changed["details"]
    with pytest.raises(MCPInputError, match="has no tool 'universal_assistant'"):
        heart.call_primitive(TASK, "universal_assistant", arguments={"request": "x"})
    heart.close()
