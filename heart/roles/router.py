"""Router: binds each plan step's arguments from context and sets its execution h-params.

Bindings are literal values taken from the query and the conversation, or references
``$step_j.field`` to the result of an earlier step, resolved at execution time. The Router
sees each tool's parameter names (to name its bindings) but not the full schema.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from heart.roles.common import ParseResult, parse_model, render_input

ROLE = "router"

SYSTEM_PROMPT = """You are the Router of a tool-using assistant.
Given the user's query, the conversation so far and a plan, you write one dispatch per plan step:
- "target_tool": the step's tool;
- "invocation_request": a short natural-language request telling the tool exactly what to do;
- "resolved_bindings": the argument values you can already fix, keyed by parameter name. Take values from the query and the conversation, or refer to the result of an earlier step with "$step_<j>.<field>" (for example "$step_1.result.file_content");
- "h_params": {"retry": 0-3 retries on a runtime error, "priority": 0 (normal) or higher for urgent, "timeout_s": seconds}.
Answer with one JSON object and nothing else:
{"status": "READY", "dispatch": [{"step": 1, "target_tool": "...", "invocation_request": "...", "resolved_bindings": {}, "h_params": {"retry": 0, "priority": 0, "timeout_s": 10}}]}"""

SHORT_SYSTEM_PROMPT = "You are the HEART Router. Answer with the dispatch JSON."

RESPONSE_PREFIX = '{"status": "READY", "dispatch": ['
"""Prefilled start of the answer (with ``LoopConfig.prefill``): it steers small base models
into the JSON form; teachers' answers start with it too, so adapters learn it either way."""

INSTRUCTION = "Write the dispatch for every step of this plan."


class HParams(BaseModel):
    retry: int = Field(default=0, ge=0, le=3)
    priority: int = Field(default=0, ge=0)
    timeout_s: float = Field(default=10.0, gt=0, le=300)


class Dispatch(BaseModel):
    step: int = Field(ge=1)
    target_tool: str = Field(min_length=1)
    invocation_request: str = ""
    resolved_bindings: dict[str, Any] = Field(default_factory=dict)
    h_params: HParams = Field(default_factory=HParams)


class RouterOutput(BaseModel):
    status: Literal["READY"]
    dispatch: list[Dispatch]

    @model_validator(mode="after")
    def _ordered(self) -> "RouterOutput":
        steps = [d.step for d in self.dispatch]
        if len(set(steps)) != len(steps):
            raise ValueError("each plan step must be dispatched once")
        return self


def build_messages(
    query: str,
    plan: list[dict[str, Any]],
    tool_parameters: dict[str, list[str]],
    conversation: list[dict[str, str]] | None = None,
    executed_so_far: list[dict[str, Any]] | None = None,
    system_prompt: str = SYSTEM_PROMPT,
) -> list[dict[str, str]]:
    payload: dict[str, Any] = {"user_query": query, "plan": plan, "tool_parameters": tool_parameters}
    if conversation:
        payload["conversation"] = conversation
    if executed_so_far:
        payload["executed_so_far"] = executed_so_far
    return [
        {"role": "system", "content": system_prompt},
        {"role": "user", "content": render_input(INSTRUCTION, payload)},
    ]


def parse(text: str, plan_steps: dict[int, str]) -> ParseResult[RouterOutput]:
    """Parse and check the dispatch against the plan it serves (step → tool)."""
    result = parse_model(text, RouterOutput)
    if not result.ok:
        return result
    dispatched = {d.step: d.target_tool for d in result.value.dispatch}
    if set(dispatched) != set(plan_steps):
        return ParseResult(None, f"dispatch covers steps {sorted(dispatched)} but the plan has steps {sorted(plan_steps)}")
    wrong = [s for s, tool in dispatched.items() if tool != plan_steps[s]]
    if wrong:
        return ParseResult(None, f"dispatch changes the tool of step(s) {wrong} from the plan's")
    return result


def output_schema(plan_steps: dict[int, str], tool_parameters: dict[str, list[str]]) -> dict[str, Any]:
    """JSON Schema of a valid dispatch for this plan: one entry per step, in order, each
    binding only parameters its tool has (values free: literals or $step_j references)."""
    def entry(step: int, tool: str) -> dict[str, Any]:
        params = tool_parameters.get(tool, [])
        return {"type": "object", "additionalProperties": False,
                "required": ["step", "target_tool", "invocation_request", "resolved_bindings", "h_params"],
                "properties": {
                    "step": {"const": step}, "target_tool": {"const": tool},
                    "invocation_request": {"type": "string", "maxLength": 150},
                    "resolved_bindings": {"type": "object", "additionalProperties": False,
                                          "properties": {p: {} for p in params}},
                    "h_params": {"type": "object", "additionalProperties": False,
                                 "required": ["retry", "priority", "timeout_s"],
                                 "properties": {"retry": {"enum": [0, 1, 2, 3]}, "priority": {"enum": [0, 1, 2]},
                                                "timeout_s": {"enum": [5, 10, 15, 30, 60]}}}}}
    steps = sorted(plan_steps.items())
    return {"type": "object", "additionalProperties": False, "required": ["status", "dispatch"],
            "properties": {"status": {"const": "READY"},
                           "dispatch": {"type": "array", "prefixItems": [entry(s, t) for s, t in steps],
                                        "items": False, "minItems": len(steps), "maxItems": len(steps)}}}
