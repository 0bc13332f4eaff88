"""Verifier: judges an attempt on four criteria and returns PASS or FAIL with feedback.

On PASS it also writes the response to the user, grounded in the execution results. On
FAIL its feedback goes back to the Planner, which re-plans (at most B times).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, model_validator

from heart.roles.common import ParseResult, parse_model, render_input

ROLE = "verifier"

CRITERIA = ("task_completion", "argument_consistency", "execution_validity", "constraint_satisfaction")

SYSTEM_PROMPT = """You are the Verifier of a tool-using assistant.
Given the user's query, the plan and the result of every executed step, judge four criteria:
- task_completion: the executed steps fully accomplish what the user asked;
- argument_consistency: every argument matches the query, the conversation and earlier results;
- execution_validity: every step returned SUCCESS (a FAILURE or a skipped step fails this);
- constraint_satisfaction: the user's explicit constraints (names, amounts, dates, limits) are respected.
PASS only if all four hold. On FAIL, give actionable feedback for the Planner: which step, what was wrong, what to do instead.
On PASS, write "response": the answer to the user, stating the concrete results (values, names, numbers) the steps returned.
Answer with one JSON object and nothing else:
{"verdict": "PASS" or "FAIL", "criteria": {"task_completion": true, "argument_consistency": true, "execution_validity": true, "constraint_satisfaction": true}, "feedback": "...", "response": "..."}"""

SHORT_SYSTEM_PROMPT = "You are the HEART Verifier. Answer with the verdict JSON."

RESPONSE_PREFIX = '{"verdict": "'
"""Prefilled start of the answer (with ``LoopConfig.prefill``): it steers small base models
into the JSON form; teachers' answers start with it too, so adapters learn it either way."""

INSTRUCTION = "Verify this attempt."


class Criteria(BaseModel):
    task_completion: bool
    argument_consistency: bool
    execution_validity: bool
    constraint_satisfaction: bool


class VerifierOutput(BaseModel):
    verdict: Literal["PASS", "FAIL"]
    criteria: Criteria
    feedback: str = ""
    response: str = ""

    @model_validator(mode="after")
    def _consistent(self) -> "VerifierOutput":
        all_hold = all(getattr(self.criteria, c) for c in CRITERIA)
        if self.verdict == "PASS" and not all_hold:
            raise ValueError("PASS requires all four criteria to hold")
        if self.verdict == "FAIL" and not self.feedback.strip():
            raise ValueError("FAIL requires feedback for the Planner")
        return self


def build_messages(
    query: str,
    plan: list[dict[str, Any]],
    results: list[dict[str, Any]],
    conversation: list[dict[str, str]] | None = None,
    system_prompt: str = SYSTEM_PROMPT,
) -> list[dict[str, str]]:
    payload: dict[str, Any] = {"user_query": query, "plan": plan, "results": results}
    if conversation:
        payload["conversation"] = conversation
    return [
        {"role": "system", "content": system_prompt},
        {"role": "user", "content": render_input(INSTRUCTION, payload)},
    ]


def parse(text: str) -> ParseResult[VerifierOutput]:
    return parse_model(text, VerifierOutput)


def output_schema() -> dict[str, Any]:
    """JSON Schema of a valid verdict, for constrained decoding: PASS only with all four
    criteria holding, FAIL only with feedback (as the parser requires)."""
    def variant(verdict: str, criterion: dict[str, Any], feedback: dict[str, Any]) -> dict[str, Any]:
        return {"type": "object", "additionalProperties": False,
                "required": ["verdict", "criteria", "feedback", "response"],
                "properties": {"verdict": {"const": verdict},
                               "criteria": {"type": "object", "additionalProperties": False,
                                            "required": list(CRITERIA), "properties": {c: criterion for c in CRITERIA}},
                               "feedback": feedback, "response": {"type": "string", "maxLength": 400}}}

    return {"anyOf": [variant("PASS", {"const": True}, {"type": "string", "maxLength": 300}),
                      variant("FAIL", {"type": "boolean"}, {"type": "string", "minLength": 1, "maxLength": 300})]}
