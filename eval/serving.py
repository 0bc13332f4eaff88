"""How a held-out role input is served again: its decoding schema and its parser.

The only place in ``eval/`` that knows the role modules' call signatures: the schema a
role is constrained to at serving time and the parser that reads its answer, both derived
from the role's input payload alone (the JSON block of the user message).

    schema = schema_for("router", payload)          # JSON Schema dict, as the loop sends it
    result = parse_output("router", payload, text)  # heart.roles.common.ParseResult
"""

from __future__ import annotations

from typing import Any

import jsonschema

from heart.roles import planner, primitive, router, verifier
from heart.roles.common import ParseResult

OUTPUT_MODELS = {"planner": planner.PlannerOutput, "router": router.RouterOutput,
                 "primitive": primitive.PrimitiveOutput, "verifier": verifier.VerifierOutput}

MODULES = {"planner": planner, "router": router, "primitive": primitive, "verifier": verifier}


def _module(role: str):
    if role not in MODULES:
        raise ValueError(f"unknown role {role!r}")
    return MODULES[role]


def schema_for(role: str, payload: dict[str, Any]) -> dict[str, Any]:
    """The JSON Schema the loop constrains ``role``'s answer to, for this input (the role
    module derives it from the input alone: shown tools, clarification budget, plan, tool
    schema, steps judged)."""
    return _module(role).schema_for_input(payload)


def parse_output(role: str, payload: dict[str, Any], text: str) -> ParseResult:
    """``role``'s parser on ``text``, with the checks the loop applies for this input."""
    return _module(role).parse_for_input(text, payload)


def parse_target(role: str, text: str) -> ParseResult:
    """A teacher's answer, read with the role's output model only.

    The input-dependent checks of :func:`parse_output` are the student's constraints, not
    the target's: a teacher that planned with a tool ToolFace did not retrieve (a known
    gold-teacher flaw) still sets the answer the student is scored against.
    """
    from heart.roles.common import parse_model

    return parse_model(text, OUTPUT_MODELS[role])


def tool_schema(role: str, payload: dict[str, Any]) -> dict[str, Any] | None:
    """The Primitive's tool parameter schema (what its arguments are normalised against)."""
    return payload["tool"].get("parameters", {}) if role == "primitive" else None


def matches_schema(text: str, schema: dict[str, Any]) -> bool:
    """Does the answer's JSON object, as written, validate against its serving schema
    (length limits, enums, no extra fields)?"""
    from heart.roles.common import extract_json_object

    try:
        jsonschema.validate(extract_json_object(text), schema)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True
