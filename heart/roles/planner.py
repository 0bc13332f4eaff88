"""Planner: intent, information sufficiency, and a JSON plan or a clarification question.

The Planner sees the user's query, the conversation so far, and the tools ToolFace
retrieved for the query — names and one-line descriptions only, never schemas.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from heart.roles.common import ParseResult, parse_model, render_input

ROLE = "planner"

SYSTEM_PROMPT = """You are the Planner of a tool-using assistant.
Given the user's query, the conversation so far and the available tools (name and short description), you:
1. identify the user's intent;
2. decide whether the information given is SUFFICIENT to act, or INSUFFICIENT because a required detail is missing and cannot be obtained with a tool;
3. if SUFFICIENT, write a plan: an ordered list of steps, each using exactly one available tool, with a one-sentence objective and the earlier steps it depends on;
4. if INSUFFICIENT, ask one precise clarification question.
Rules:
- Use only tools from "available_tools". Prefer the fewest steps that fully satisfy the query. If no available tool can serve the request, return an empty plan.
- A detail that a tool can look up is not missing: plan the lookup instead of asking.
- If "verifier_feedback" is present, an earlier attempt failed: fix exactly what it says. Steps listed in "executed_so_far" with status SUCCESS already changed the world: do not repeat them.
- Answer with one JSON object and nothing else, in one of these forms:
{"status": "SUFFICIENT", "intent": "...", "plan": [{"step": 1, "tool": "<tool name>", "objective": "...", "depends_on": []}]}
{"status": "INSUFFICIENT", "intent": "...", "clarification": "<question for the user>"}"""

SHORT_SYSTEM_PROMPT = "You are the HEART Planner. Answer with the plan JSON."

RESPONSE_PREFIX = '{"status": "'
"""Prefilled start of the answer (with ``LoopConfig.prefill``): it steers small base models
into the JSON form; teachers' answers start with it too, so adapters learn it either way."""

INSTRUCTION = "Plan the next actions for this query."


class PlanStep(BaseModel):
    step: int = Field(ge=1)
    tool: str = Field(min_length=1)
    objective: str = ""
    depends_on: list[int] = Field(default_factory=list)


class PlannerOutput(BaseModel):
    status: Literal["SUFFICIENT", "INSUFFICIENT"]
    intent: str = ""
    plan: list[PlanStep] = Field(default_factory=list)
    clarification: str | None = None

    @model_validator(mode="after")
    def _consistent(self) -> "PlannerOutput":
        if self.status == "INSUFFICIENT" and not (self.clarification or "").strip():
            raise ValueError("INSUFFICIENT needs a clarification question")
        if self.status == "SUFFICIENT":
            for index, step in enumerate(self.plan, start=1):
                if step.step != index:
                    raise ValueError(f"plan steps must be numbered 1..n in order; got {step.step} at position {index}")
                if any(d >= step.step or d < 1 for d in step.depends_on):
                    raise ValueError(f"step {step.step} depends on a step that does not come before it")
        return self


def build_messages(
    query: str,
    tools: list[dict[str, str]],
    conversation: list[dict[str, str]] | None = None,
    clarifications: list[dict[str, str]] | None = None,
    executed_so_far: list[dict[str, Any]] | None = None,
    verifier_feedback: str | None = None,
    system_prompt: str = SYSTEM_PROMPT,
) -> list[dict[str, str]]:
    payload: dict[str, Any] = {"user_query": query, "available_tools": tools}
    if conversation:
        payload["conversation"] = conversation
    if clarifications:
        payload["clarifications"] = clarifications
    if executed_so_far:
        payload["executed_so_far"] = executed_so_far
    if verifier_feedback:
        payload["verifier_feedback"] = verifier_feedback
    return [
        {"role": "system", "content": system_prompt},
        {"role": "user", "content": render_input(INSTRUCTION, payload)},
    ]


def parse(text: str, known_tools: set[str]) -> ParseResult[PlannerOutput]:
    result = parse_model(text, PlannerOutput)
    if result.ok and result.value.status == "SUFFICIENT":
        # An empty plan is legitimate: nothing the tools can do (or nothing left to do);
        # the Verifier then judges the answer without any execution.
        unknown = [s.tool for s in result.value.plan if s.tool not in known_tools]
        if unknown:
            return ParseResult(None, f"plan uses tools that do not exist: {', '.join(map(repr, unknown))}")
    return result


def output_schema(tools: list[str], may_ask: bool = True, max_steps: int = 6) -> dict[str, Any]:
    """JSON Schema of a valid answer, for constrained decoding: steps numbered 1..n, tools
    limited to ``tools``, each step depending only on earlier ones, and no clarification
    once the loop's clarification budget is spent."""
    def step(n: int) -> dict[str, Any]:
        earlier = {"type": "array", "items": {"enum": list(range(1, n))}, "maxItems": n - 1} if n > 1 \
            else {"type": "array", "maxItems": 0}
        return {"type": "object", "additionalProperties": False,
                "required": ["step", "tool", "objective", "depends_on"],
                "properties": {"step": {"const": n}, "tool": {"enum": sorted(tools)},
                               "objective": {"type": "string", "maxLength": 120}, "depends_on": earlier}}

    intent = {"type": "string", "maxLength": 120}
    plan = {"type": "array", "prefixItems": [step(n) for n in range(1, max_steps + 1)], "items": False,
            "maxItems": max_steps}
    sufficient = {"type": "object", "additionalProperties": False, "required": ["status", "intent", "plan"],
                  "properties": {"status": {"const": "SUFFICIENT"}, "intent": intent, "plan": plan}}
    if not may_ask:
        return sufficient
    insufficient = {"type": "object", "additionalProperties": False, "required": ["status", "intent", "clarification"],
                    "properties": {"status": {"const": "INSUFFICIENT"}, "intent": intent,
                                   "clarification": {"type": "string", "minLength": 1, "maxLength": 150}}}
    return {"anyOf": [sufficient, insufficient]}
