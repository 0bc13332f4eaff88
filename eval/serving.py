"""How a held-out role input is served again: its decoding schema and its parser.

The only place in ``eval/`` that knows the role modules' call signatures: the schema a
role is constrained to at serving time and the parser that reads its answer, both derived
from the role's input payload alone (the JSON block of the user message). When the role
modules gain ``schema_for_input(payload)``, :func:`schema_for` becomes a one-line call.

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

MAX_PLAN_STEPS = 6
"""As LoopConfig.max_plan_steps: the longest plan the Planner's serving schema allows."""


def _plan_steps(payload: dict[str, Any]) -> dict[int, str]:
    return {s["step"]: s.get("tool_hint", s.get("tool")) for s in payload.get("plan", [])}


def _tool_names(payload: dict[str, Any]) -> list[str]:
    return [t["name"] for t in payload.get("available_tools", [])]


def schema_for(role: str, payload: dict[str, Any]) -> dict[str, Any]:
    """The JSON Schema the loop constrains ``role``'s answer to, for this input."""
    if role == "planner":
        # The loop forbids asking once the clarification budget is spent; a held-out input
        # does not say whether it was, so asking stays allowed.
        return planner.output_schema(_tool_names(payload), True, MAX_PLAN_STEPS)
    if role == "router":
        return router.output_schema(_plan_steps(payload), payload.get("tool_parameters", {}))
    if role == "primitive":
        return primitive.output_schema(payload["tool"]["name"], payload["tool"].get("parameters", {}))
    if role == "verifier":
        return verifier.output_schema()
    raise ValueError(f"unknown role {role!r}")


def parse_output(role: str, payload: dict[str, Any], text: str) -> ParseResult:
    """``role``'s parser on ``text``, with the checks the loop applies for this input."""
    if role == "planner":
        return planner.parse(text, set(_tool_names(payload)))
    if role == "router":
        return router.parse(text, _plan_steps(payload))
    if role == "primitive":
        return primitive.parse(text, payload["tool"]["name"])
    if role == "verifier":
        return verifier.parse(text)
    raise ValueError(f"unknown role {role!r}")


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
