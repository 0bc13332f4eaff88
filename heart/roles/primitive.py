"""Tool Primitive (the model part): resolve a natural-language request against one schema.

The Primitive is the only role that sees a tool's full JSON schema. It answers with the
arguments to call the tool with, given the Router's request and bindings and the upstream
context — the results of the steps it depends on (Eq. 1 of the paper, ``P_i(x; c)``).
Binding (coercion, enums, required fields, defaults), execution and the SUCCESS / FAILURE
envelope with its summary and metadata are done by :mod:`heart.primitives`.

A primitive of the Code family (HEELO; :mod:`heart.families`) has a tool card with
``"family": "code"``: its bindings are the named inputs of a computation (earlier results),
and it answers with one Python expression over those names instead of arguments:
``{"tool": "compute", "family": "code", "expression": "..."}``, which :mod:`heart.sandbox`
evaluates.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from heart.families import CODE_DESCRIPTION, CODE_FUNCTIONS, CODE_PARAMETERS, CODE_PRIMITIVE, EXPRESSION_CHARS
from heart.roles.common import ParseResult, build_role_messages, parse_model
from heart.roles import primitive_messages

ROLE = "primitive"

SYSTEM_PROMPT = """You are a Tool Primitive: you wrap exactly one tool.
Given a natural-language invocation request, bindings already resolved by the Router, the upstream context (results of the steps this one depends on) and your tool's JSON schema, you produce the arguments to call the tool with.
Rules:
- Use the parameter names and types of the schema exactly; include every required parameter.
- Keep the resolved bindings' values unless the request clearly says otherwise; when a binding holds a whole earlier result, take from it (or from the upstream context) the value the request needs.
- Leave out optional parameters the request does not mention.
- If the request cannot be satisfied with this tool's schema, say so.
- A tool card with "family": "code" computes instead: write one Python expression over the names of the resolved bindings, using only the card's functions (no imports, no names starting with "_").
Answer with one JSON object and nothing else, in one of these forms:
{"tool": "<tool name>", "arguments": {"<parameter>": <value>}}
{"tool": "compute", "family": "code", "expression": "<Python expression>"}
{"status": "UNRESOLVABLE", "tool": "<tool name>", "reason": "..."}"""

SHORT_SYSTEM_PROMPT = "HEART Tool Primitive."

RESPONSE_PREFIX = '{"tool": "'
"""Prefilled start of the answer (with ``LoopConfig.prefill``): it steers small base models
into the JSON form; teachers' answers start with it too, so adapters learn it either way."""

INSTRUCTION = "Resolve this request into arguments for your tool."


class PrimitiveOutput(BaseModel):
    tool: str
    family: Literal["tool", "code"] = "tool"
    arguments: dict[str, Any] = Field(default_factory=dict)
    expression: str | None = Field(default=None, max_length=EXPRESSION_CHARS)
    """A code primitive's answer: one Python expression over its inputs' names."""
    status: Literal["RESOLVED", "UNRESOLVABLE"] = "RESOLVED"
    reason: str = ""

    @model_validator(mode="after")
    def _reasoned(self) -> "PrimitiveOutput":
        if self.status == "UNRESOLVABLE" and not self.reason.strip():
            raise ValueError("UNRESOLVABLE needs a reason")
        if self.status == "RESOLVED" and self.family == "code" and not (self.expression or "").strip():
            raise ValueError("a code primitive answers with an expression")
        return self


def code_card() -> dict[str, Any]:
    """The Code primitive's tool card: its family, what it does, the functions an expression
    may call, and the schema of its answer's expression."""
    return {"name": CODE_PRIMITIVE, "family": "code", "description": CODE_DESCRIPTION,
            "functions": CODE_FUNCTIONS, "parameters": CODE_PARAMETERS}


def is_code(payload: dict[str, Any]) -> bool:
    return payload["tool"].get("family") == "code"


def tool_card(name: str, description: str, parameters: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "description": description, "parameters": parameters}


def build_payload(
    invocation_request: str,
    resolved_bindings: dict[str, Any],
    tool: dict[str, Any],
    upstream_context: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The Primitive's input; ``upstream_context`` is ``[{step, tool, result}]`` of the
    steps this one depends on."""
    payload: dict[str, Any] = {"invocation_request": invocation_request, "resolved_bindings": resolved_bindings}
    if upstream_context:
        payload["upstream_context"] = upstream_context
    payload["tool"] = tool
    return payload


def build_messages(payload: dict[str, Any], system_prompt: str = SYSTEM_PROMPT) -> list[dict[str, str]]:
    return build_role_messages(system_prompt, INSTRUCTION, payload)


def parse(text: str, tool_name: str) -> ParseResult[PrimitiveOutput]:
    result = parse_model(text, PrimitiveOutput)
    if result.ok and result.value.tool != tool_name:
        return ParseResult(None, f"output names tool {result.value.tool!r}, but this primitive wraps {tool_name!r}")
    return result


def parse_for_input(text: str, payload: dict[str, Any]) -> ParseResult[PrimitiveOutput]:
    """Parse an answer for this input: it names the card's tool, and a code card's answer is
    an expression, a tool card's one arguments (or UNRESOLVABLE, either way). A
    messages-mode input is parsed by :mod:`heart.roles.primitive_messages`."""
    if primitive_messages.is_messages_input(payload):
        return primitive_messages.parse_for_input(text, payload)
    result = parse(text, payload["tool"]["name"])
    if result.ok and result.value.status == "RESOLVED" and (result.value.family == "code") != is_code(payload):
        want = "an expression (family code)" if is_code(payload) else "arguments (family tool)"
        return ParseResult(None, f"this primitive answers with {want}")
    return result


def output_schema(tool_name: str, parameters: dict[str, Any]) -> dict[str, Any]:
    """JSON Schema of a valid answer: the tool's own parameter schema for the arguments."""
    arguments = {**parameters, "type": "object", "additionalProperties": False}
    return {"anyOf": [
        {"type": "object", "additionalProperties": False, "required": ["tool", "arguments"],
         "properties": {"tool": {"const": tool_name}, "arguments": arguments}},
        {"type": "object", "additionalProperties": False, "required": ["status", "tool", "reason"],
         "properties": {"status": {"const": "UNRESOLVABLE"}, "tool": {"const": tool_name},
                        "reason": {"type": "string", "minLength": 1, "maxLength": 200}}},
    ]}


def code_output_schema(tool_name: str = CODE_PRIMITIVE) -> dict[str, Any]:
    """JSON Schema of a code primitive's answer: an expression, or UNRESOLVABLE."""
    return {"anyOf": [
        {"type": "object", "additionalProperties": False, "required": ["tool", "family", "expression"],
         "properties": {"tool": {"const": tool_name}, "family": {"const": "code"},
                        "expression": {"type": "string", "minLength": 1, "maxLength": EXPRESSION_CHARS}}},
        {"type": "object", "additionalProperties": False, "required": ["status", "tool", "reason"],
         "properties": {"status": {"const": "UNRESOLVABLE"}, "tool": {"const": tool_name},
                        "reason": {"type": "string", "minLength": 1, "maxLength": 200}}},
    ]}


def schema_for_input(payload: dict[str, Any]) -> dict[str, Any]:
    """The serving schema of the answer to this input: its tool's own parameter schema (a
    code card: :func:`code_output_schema`; a messages-mode input:
    :func:`heart.roles.primitive_messages.schema_for_input`)."""
    if primitive_messages.is_messages_input(payload):
        return primitive_messages.schema_for_input(payload)
    if is_code(payload):
        return code_output_schema(payload["tool"]["name"])
    return output_schema(payload["tool"]["name"], payload["tool"]["parameters"])
