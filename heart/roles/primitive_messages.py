"""The Primitive role's messages mode (HEELO): what a later step needs from my result.

HEELO's agent-native primitive returns a result *and messages to other primitives*:
``(r_i, m_i) = P_i(x_i; c_i)``. Here the Primitive's arguments are written before its tool
runs, so the messages are a second, short answer of the same role written after: when a
step succeeded and later steps of the plan read its result (their Router bindings refer to
``$step_i``), its Primitive sees the result and those dependent steps and addresses each a
message: which field of the result it needs (a ``$step_i.<field>`` path, e.g.
``result.transactions.1.recipient``) and, where it helps, a caveat (several items match; the
value needs a computation). The loop shows each dependent step's Primitive the messages
addressed to it, beside the upstream result (:mod:`heart.loop`); the Router of a re-plan sees
them in ``executed_so_far``. Trace events mark the mode with ``extra["mode"] = "messages"``.

An answer that does not parse, or that addresses a step that is not a dependent, is a
recorded failed role call: the step keeps its result, sends no message, and the loop goes on.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from heart.roles.common import ParseResult, build_role_messages, parse_model

ROLE = "primitive"
MODE = "messages"

SYSTEM_PROMPT = """You are a Tool Primitive in messages mode: your tool ran and returned "result"; later steps ("dependents") read it.
For each dependent, write one message: "to" its step number, "field" the path of the value it needs in your result ("result" for the whole result, "result.<key>.<index>" inside it), and a short "note" only when the value needs care (several items match, a computation is needed).
No message for a dependent whose value is not in your result.
Answer with one JSON object and nothing else:
{"tool": "<tool name>", "messages": [{"to": <step>, "field": "result.<key>", "note": ""}]}"""

SHORT_SYSTEM_PROMPT = "HEART Tool Primitive."
"""The Primitive's own short prompt (:data:`heart.roles.primitive.SHORT_SYSTEM_PROMPT`): a
context-distilled Primitive adapter is trained on it for every row that is not a relevance
row, messages rows included, and the instruction line tells this mode apart."""

RESPONSE_PREFIX = '{"tool": "'
"""Prefilled start of the answer (with ``LoopConfig.prefill``), as in the Primitive's other answers."""

INSTRUCTION = "Write messages for the steps that read your result."

FIELD_CHARS = 120
NOTE_CHARS = 120
MAX_MESSAGES = 6
"""Longest field path, note, and most messages one answer may carry."""
FIELD = re.compile(r"result(\.[A-Za-z0-9_\-]{1,40}){0,8}")
"""A field path: ``result`` and up to 8 keys / list indices, the ``$step_j.<field>`` syntax of
bindings. Bounded in the pattern itself: constrained decoding (xgrammar) ignores a
``maxLength`` beside a ``pattern``."""
DEPENDENTS = 4
"""Most dependent steps one messages input shows."""
MAX_NEW_TOKENS = 120
"""Token budget of one messages answer."""


class Message(BaseModel):
    """One message to a dependent step."""

    model_config = ConfigDict(extra="forbid")

    to: int = Field(ge=1)
    field: str = Field(min_length=1, max_length=FIELD_CHARS, pattern=f"^{FIELD.pattern}$")
    note: str = Field(default="", max_length=NOTE_CHARS)


class MessagesOutput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tool: str
    messages: list[Message] = Field(default_factory=list, max_length=MAX_MESSAGES)


def dependent(step: int, tool: str, objective: str, reads: list[str]) -> dict[str, Any]:
    """A dependent step as the messages input shows it: its number, tool, objective, and the
    names of its bindings that refer to this step's result."""
    return {"step": step, "tool": tool, "objective": objective, "reads": reads}


def build_payload(tool: str, invocation_request: str, result: Any, dependents: list[dict[str, Any]]) -> dict[str, Any]:
    return {"tool": tool, "invocation_request": invocation_request, "result": result,
            "dependents": dependents[:DEPENDENTS]}


def is_messages_input(payload: dict[str, Any]) -> bool:
    """Whether a Primitive call's input asks for messages (not for arguments or relevance)."""
    return isinstance(payload, dict) and "dependents" in payload and "result" in payload


def build_messages(payload: dict[str, Any], system_prompt: str = SYSTEM_PROMPT) -> list[dict[str, str]]:
    return build_role_messages(system_prompt, INSTRUCTION, payload)


def parse_for_input(text: str, payload: dict[str, Any]) -> ParseResult[MessagesOutput]:
    """Parse an answer for this input: it names the input's tool and addresses only its
    dependents, each at most once."""
    result = parse_model(text, MessagesOutput)
    if not result.ok:
        return result
    if result.value.tool != payload["tool"]:
        return ParseResult(None, f"output names tool {result.value.tool!r}, but this primitive wraps {payload['tool']!r}")
    steps = {d["step"] for d in payload["dependents"]}
    to = [m.to for m in result.value.messages]
    strangers = sorted(set(to) - steps)
    if strangers:
        return ParseResult(None, f"messages address step(s) {strangers}, which do not read this result "
                                 f"(dependents: {sorted(steps)})")
    if len(set(to)) != len(to):
        return ParseResult(None, "one message per dependent step")
    return result


def output_schema(steps: list[int]) -> dict[str, Any]:
    """JSON Schema of a valid answer: messages to the dependent ``steps``, each at most once
    (constrained decoding cannot express "once"; the parser checks it)."""
    message = {"type": "object", "additionalProperties": False, "required": ["to", "field", "note"],
               "properties": {"to": {"enum": sorted(steps)},
                              "field": {"type": "string", "pattern": f"^{FIELD.pattern}$"},
                              "note": {"type": "string", "maxLength": NOTE_CHARS}}}
    return {"type": "object", "additionalProperties": False, "required": ["tool", "messages"],
            "properties": {"tool": {"type": "string"},
                           "messages": {"type": "array", "items": message, "maxItems": min(MAX_MESSAGES, len(steps))}}}


def schema_for_input(payload: dict[str, Any]) -> dict[str, Any]:
    schema = output_schema([d["step"] for d in payload["dependents"]])
    schema["properties"]["tool"] = {"const": payload["tool"]}
    return schema
