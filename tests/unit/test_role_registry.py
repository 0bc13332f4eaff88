"""The role registry (heart.roles.registry): every role in it with its prompts, parser and
schema; the one choice of system prompt (full / short, and the mode of the input); and no
module elsewhere finding a role module by a computed name."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

import heart
from heart.loop import HeartLoop, LoopConfig
from heart.roles import (PLANNER, PRIMITIVE, REGISTRY, ROLE_MODULES, ROUTER, VERIFIER, get_role, planner, primitive,
                         primitive_messages, relevance, router, verifier)
from heart.roles.registry import ROLE_NAMES

REPO = Path(__file__).resolve().parents[2]

TOOLS = [{"name": "ls", "description": "List files.", "category": "fs"}]
PARAMETERS = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
STEP = {"step": 1, "tool_hint": "ls", "objective": "list", "dependencies": []}
ROUTER_TOOLS = {"ls": router.parameters_for("ls", PARAMETERS)}
ENTRY = verifier.step_entry(STEP, "List /tmp.", {"path": "/tmp"}, {"status": "SUCCESS", "result": ["a"]})
INTENT = {"task": "t", "objective": "o", "tool_categories": [], "constraints": []}

PAYLOADS = {  # one input of every mode, built by the role modules themselves
    ("planner", "plan"): planner.build_payload("list files", TOOLS),
    ("planner", "subgoals"): planner.build_payload("list files", TOOLS, form="subgoals"),
    ("router", "plan"): router.build_payload("list files", [STEP], ROUTER_TOOLS),
    ("router", "step"): router.build_step_payload("list files", STEP, ROUTER_TOOLS, []),
    ("primitive", "tool"): primitive.build_payload("List /tmp.", {"path": "/tmp"},
                                                   primitive.tool_card("ls", "List files.", PARAMETERS)),
    ("primitive", "relevance"): relevance.build_payload("list files", relevance.relevance_card("ls", "List files.",
                                                                                                PARAMETERS)),
    ("primitive", "messages"): primitive_messages.build_payload(
        "ls", "List /tmp.", ["a"], [primitive_messages.dependent(2, "cat", "read it", ["path"])]),
    ("verifier", "step"): verifier.build_payload("list files", INTENT, [ENTRY]),
    ("verifier", "attempt"): verifier.build_payload("list files", INTENT, [ENTRY, {**ENTRY, "step": 2}]),
}
MODE_MODULES = {("primitive", "relevance"): relevance, ("primitive", "messages"): primitive_messages}
"""The modes served by a module other than the role's own."""
FULL_PROMPTS = {("router", "step"): router.STEP_SYSTEM_PROMPT, ("planner", "subgoals"): planner.SUBGOALS_SYSTEM_PROMPT}
"""The modes whose full prompt is not their module's SYSTEM_PROMPT."""


def test_every_role_is_registered_in_the_loops_order_with_its_modules_own_objects():
    assert ROLE_NAMES == tuple(REGISTRY) == heart.ROLES
    assert ROLE_MODULES == {name: role.module for name, role in REGISTRY.items()}
    for name, role in REGISTRY.items():
        module = role.module
        assert role.name == module.ROLE == name and module.__name__ == f"heart.roles.{name}"
        # the very strings of the role module: datasets and adapters depend on them byte for byte
        assert role.full_system_prompt is module.SYSTEM_PROMPT
        assert role.short_system_prompt is module.SHORT_SYSTEM_PROMPT
        assert role.instruction is module.INSTRUCTION
        assert role.response_prefix is module.RESPONSE_PREFIX
        for mode in role.modes:
            assert callable(mode.module.parse_for_input) and callable(mode.module.schema_for_input)
            assert len(mode.short_system_prompt) < len(mode.full_system_prompt) / 4


def test_every_payload_finds_its_mode_and_is_served_as_its_module_serves_it():
    assert {(role.name, mode.name) for role in REGISTRY.values() for mode in role.modes} == set(PAYLOADS)
    for (name, mode_name), payload in PAYLOADS.items():
        role = get_role(name)
        mode = role.mode_for(payload)
        assert mode.name == mode_name
        module = MODE_MODULES.get((name, mode_name), role.module)
        assert mode.module is module
        assert mode.full_system_prompt is FULL_PROMPTS.get((name, mode_name), module.SYSTEM_PROMPT)
        # the messages, schema and parser are the module's own for this input
        assert role.build_messages(payload) == module.build_messages(payload, system_prompt=mode.full_system_prompt)
        assert role.build_messages(payload)[1]["content"].startswith(mode.instruction + "\n")
        assert role.schema_for_input(payload) == module.schema_for_input(payload)
        assert role.parse_for_input("not json", payload).error == module.parse_for_input("not json", payload).error


def test_the_prompt_is_chosen_full_or_short_by_the_inputs_mode():
    for name, role in REGISTRY.items():
        assert role.system_prompt() is role.full_system_prompt  # no input: the main mode's
        assert role.system_prompt(short=True) is role.short_system_prompt
    # the Router: two full prompts, by the input; one short prompt for both
    assert ROUTER.system_prompt(PAYLOADS["router", "plan"]) is router.SYSTEM_PROMPT
    assert ROUTER.system_prompt(PAYLOADS["router", "step"]) is router.STEP_SYSTEM_PROMPT
    for payload in (PAYLOADS["router", "plan"], PAYLOADS["router", "step"]):
        assert router.system_prompt_for(payload) == ROUTER.system_prompt(payload)
        assert ROUTER.system_prompt(payload, short=True) is router.SHORT_SYSTEM_PROMPT
    # the Primitive: the relevance mode has its own prompts; the messages mode its own full one
    assert PRIMITIVE.system_prompt(PAYLOADS["primitive", "relevance"]) is relevance.SYSTEM_PROMPT
    assert PRIMITIVE.system_prompt(PAYLOADS["primitive", "relevance"], short=True) is relevance.SHORT_SYSTEM_PROMPT
    assert PRIMITIVE.mode("relevance").system_prompt(short=True) is relevance.SHORT_SYSTEM_PROMPT
    assert PRIMITIVE.system_prompt(PAYLOADS["primitive", "messages"]) is primitive_messages.SYSTEM_PROMPT
    assert PRIMITIVE.system_prompt(PAYLOADS["primitive", "messages"], short=True) == primitive.SHORT_SYSTEM_PROMPT
    assert PRIMITIVE.system_prompt(PAYLOADS["primitive", "tool"], short=True) is primitive.SHORT_SYSTEM_PROMPT
    # the Verifier: one prompt, the instruction says what is judged
    assert {VERIFIER.mode_for(PAYLOADS["verifier", m]).instruction for m in ("step", "attempt")} == \
        {verifier.INSTRUCTION, verifier.ATTEMPT_INSTRUCTION}
    assert PLANNER.system_prompt(PAYLOADS["planner", "plan"], short=True) is planner.SHORT_SYSTEM_PROMPT


def test_a_rows_full_prompt_names_the_short_one_that_replaces_it():
    assert PRIMITIVE.short_system_prompt_for(relevance.SYSTEM_PROMPT) is relevance.SHORT_SYSTEM_PROMPT
    assert PRIMITIVE.short_system_prompt_for(primitive.SYSTEM_PROMPT) is primitive.SHORT_SYSTEM_PROMPT
    assert ROUTER.short_system_prompt_for(router.STEP_SYSTEM_PROMPT) is router.SHORT_SYSTEM_PROMPT
    assert VERIFIER.short_system_prompt_for("an edited prompt") is verifier.SHORT_SYSTEM_PROMPT


def test_a_role_is_found_by_its_name_its_module_or_itself_and_nothing_else():
    assert get_role("router") is get_role(router) is get_role(ROUTER) is ROUTER
    with pytest.raises(ValueError, match="unknown role 'judge'"):
        get_role("judge")
    with pytest.raises(ValueError, match="not a role's own module"):
        get_role(relevance)  # a mode's module: its role is the Primitive, found by name
    with pytest.raises(ValueError, match="has no mode 'dream'"):
        PRIMITIVE.mode("dream")


def test_a_harness_edit_reaches_the_roles_main_prompts_only():
    loop = HeartLoop.__new__(HeartLoop)
    loop.config = LoopConfig(prompt_edits=(("primitive", "append", "Be brief."), ("router", "replace", "Route.")),
                             short_prompts=("primitive",))
    assert loop._system(PRIMITIVE, PAYLOADS["primitive", "tool"]) == primitive.SHORT_SYSTEM_PROMPT + "\nBe brief."
    assert loop._system(PRIMITIVE, PAYLOADS["primitive", "messages"]) is primitive_messages.SHORT_SYSTEM_PROMPT
    assert loop._system(PRIMITIVE, mode="relevance") is relevance.SHORT_SYSTEM_PROMPT
    assert loop._system(ROUTER, PAYLOADS["router", "step"]) == "Route."
    assert loop._system(VERIFIER, PAYLOADS["verifier", "step"]) is verifier.SYSTEM_PROMPT


# -- no role module found by a computed name ------------------------------------------------

def _source_files() -> list[Path]:
    skip = {".venv", ".git", "tests", "node_modules"}
    return [p for p in REPO.rglob("*.py")
            if not skip & set(p.relative_to(REPO).parts) and p.relative_to(REPO).parts[:2] != ("heart", "roles")]


def _computed_role_imports(tree: ast.AST) -> list[int]:
    """Lines that import a module by a name computed from "heart.roles…" text
    (``import_module(f"heart.roles.{role}")``, ``__import__("heart.roles." + role)``)."""
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        argument = node.args[0]
        if name in ("import_module", "__import__") and not isinstance(argument, ast.Constant) and any(
                isinstance(part, ast.Constant) and "heart.roles" in str(part.value) for part in ast.walk(argument)):
            lines.append(node.lineno)
    return lines


def test_the_finder_sees_every_computed_form():
    source = ('import importlib\nimportlib.import_module(f"heart.roles.{r}")\nimport_module("heart.roles." + r)\n'
              '__import__("heart.roles.%s" % r)\nimportlib.import_module("heart.roles.router")\n')
    assert _computed_role_imports(ast.parse(source)) == [2, 3, 4]


def test_no_module_outside_heart_roles_imports_a_role_module_by_a_computed_name():
    found = {}
    for path in _source_files():
        lines = _computed_role_imports(ast.parse(path.read_text(encoding="utf-8"), str(path)))
        if lines:
            found[str(path.relative_to(REPO))] = lines
    offenders = found
    assert not offenders, f"ask heart.roles.get_role(name) instead: {json.dumps(offenders)}"
