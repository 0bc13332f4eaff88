"""Verifier (HEART Appendix D.4): judges an executed step on four criteria, PASS or FAIL.

Per-step verification (Algorithm 1's ``VERIFIER(r_k, π_k, s_k)``): the input holds one
step — its objective, the Router's request and bindings, the tool's schema ``s_k`` and the
Primitive's envelope ``r_k`` — plus the user's query, the Planner's intent (constraints
included), the clarifications and the conversation. The whole-attempt variant
(``LoopConfig.verify = "attempt"``) sends every step of the attempt in one input, without
schemas. On FAIL the feedback lists every failed criterion, root cause first; it goes to the
Planner, which re-plans.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from heart.roles.common import ParseResult, build_role_messages, clip_words, parse_model

ROLE = "verifier"

CRITERIA = ("task_completion", "argument_consistency", "execution_validity", "constraint_satisfaction")

SYSTEM_PROMPT = """You are the Verifier of a tool-using assistant. Judge the executed step(s) in "steps" on four criteria, each "pass" or "fail":
- task_completion: the step's result accomplishes the step's objective (and, with it, its part of the user's request);
- argument_consistency: the arguments match the query, the clarifications, the conversation and earlier results, and the tool's schema (types, enums, constraints); no required field swapped or omitted;
- execution_validity: the tool ran and returned SUCCESS with a well-formed result (a FAILURE or an error result fails this); an envelope's "validation" is evidence: "shape" compares the result with the tool's earlier results, "state_change" says whether a state-changing call changed the state with the asked values;
- constraint_satisfaction: the user's constraints and preferences (names, amounts, dates, recipients, limits), rate limits, access permissions and business rules are respected.
Judge the criteria first; the status follows from them: "PASS" only if all four pass, and then "feedback" is "". On FAIL, "feedback" lists every failed criterion, root cause first: the step, the argument, what the user asked for and what was used, and what to do instead. Never speculate beyond the evidence in the input.
Answer with one JSON object and nothing else:
{"step": <step number>, "criteria": {"task_completion": "pass", "argument_consistency": "pass", "execution_validity": "pass", "constraint_satisfaction": "pass"}, "status": "PASS" or "FAIL", "feedback": ""}"""

SHORT_SYSTEM_PROMPT = "HEART Verifier."

RESPONSE_PREFIX = '{"step": '
"""Prefilled start of the answer (with ``LoopConfig.prefill``): it steers small base models
into the JSON form; teachers' answers start with it too, so adapters learn it either way."""

ANSWER_ORDER = ("step", "criteria", "status", "feedback")
"""Key order of an answer. The paper's D.4 prints the status first; here the criteria come
before it, so a model commits to its four judgments and the verdict follows from them: with
constrained decoding (:func:`output_schema`) a FAIL whose criteria all pass, or a PASS with a
failed criterion, cannot be written at all."""

INSTRUCTION = "Verify this step."
ATTEMPT_INSTRUCTION = "Verify this attempt."

FEEDBACK_CHARS = 400

Mark = Literal["pass", "fail"]


class Criteria(BaseModel):
    task_completion: Mark
    argument_consistency: Mark
    execution_validity: Mark
    constraint_satisfaction: Mark

    def failed(self) -> list[str]:
        return [c for c in CRITERIA if getattr(self, c) == "fail"]


class VerifierOutput(BaseModel):
    status: Literal["PASS", "FAIL"]
    step: int = Field(ge=0)
    """The step judged (whole-attempt variant: the first failing step, or the last step on
    PASS; 0 for an attempt without steps)."""
    criteria: Criteria
    feedback: str = Field(default="", max_length=FEEDBACK_CHARS)

    @model_validator(mode="after")
    def _consistent(self) -> "VerifierOutput":
        failed = self.criteria.failed()
        if self.status == "PASS" and failed:
            raise ValueError(f"PASS requires all four criteria to pass; failed: {failed}")
        if self.status == "PASS" and self.feedback.strip():
            raise ValueError("PASS carries no feedback")
        if self.status == "FAIL" and not failed:
            raise ValueError("FAIL requires at least one failed criterion")
        if self.status == "FAIL" and not self.feedback.strip():
            raise ValueError("FAIL requires feedback for the Planner")
        return self


def step_entry(step: dict[str, Any], request: str, bindings: dict[str, Any], envelope: dict[str, Any],
               tool_schema: dict[str, Any] | None = None) -> dict[str, Any]:
    """One executed step as the Verifier sees it: plan step, dispatch, schema, envelope.

    The envelope is shown without what repeats or carries no evidence: its tool (the
    step's), its summary when the result or the failure details are there (the summary
    restates them), and its metadata when the tool ran once (a reused envelope, which did
    not run again, shows it: ``meta.reused``)."""
    entry = {"step": step["step"], "tool": step["tool_hint"], "objective": step.get("objective", ""),
             "invocation_request": request, "resolved_bindings": bindings}
    if tool_schema is not None:
        entry["tool_schema"] = tool_schema
    shown = {k: v for k, v in envelope.items() if k not in ("tool", "summary", "meta")}
    if not ("result" in envelope or envelope.get("details")) and envelope.get("summary"):
        shown["summary"] = envelope["summary"]
    if envelope.get("meta", {}).get("attempts", 1) > 1 or "reused" in envelope.get("meta", {}):
        shown["meta"] = envelope["meta"]
    entry["envelope"] = shown
    return entry


CONVERSATION_TURNS = 2
"""Earlier turns in the Verifier's input: the last this many, each clipped."""
CONVERSATION_CHARS = 200


def build_payload(
    query: str,
    intent: dict[str, Any],
    steps: list[dict[str, Any]],
    *,
    conversation: list[dict[str, str]] | None = None,
    clarifications: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    """The Verifier's input: one :func:`step_entry` per step judged (one, per-step); of the
    conversation, the last :data:`CONVERSATION_TURNS` turns, clipped."""
    payload: dict[str, Any] = {"user_query": query, "intent": intent}
    if clarifications:
        payload["clarifications"] = clarifications
    if conversation:
        payload["conversation"] = [{"user": clip_words(t["user"], CONVERSATION_CHARS),
                                    "response": clip_words(t["response"], CONVERSATION_CHARS)}
                                   for t in conversation[-CONVERSATION_TURNS:]]
    payload["steps"] = steps
    return payload


def build_messages(payload: dict[str, Any], system_prompt: str = SYSTEM_PROMPT) -> list[dict[str, str]]:
    instruction = INSTRUCTION if len(payload["steps"]) == 1 else ATTEMPT_INSTRUCTION
    return build_role_messages(system_prompt, instruction, payload)


def parse(text: str) -> ParseResult[VerifierOutput]:
    return parse_model(text, VerifierOutput)


def parse_for_input(text: str, payload: dict[str, Any]) -> ParseResult[VerifierOutput]:
    result = parse(text)
    steps = [s["step"] for s in payload["steps"]] or [0]
    if result.ok and result.value.step not in steps:
        return ParseResult(None, f"verdict names step {result.value.step}; the input holds steps {steps}")
    return result


def answer(step: int, criteria: dict[str, str], feedback: str = "") -> dict[str, Any]:
    """A verdict in :data:`ANSWER_ORDER`, its status derived from the criteria (teachers write
    their answers through this, so every training answer has the serving key order)."""
    marks = {c: criteria[c] for c in CRITERIA}
    status = "FAIL" if "fail" in marks.values() else "PASS"
    return {"step": step, "criteria": marks, "status": status, "feedback": feedback if status == "FAIL" else ""}


def output_schema(steps: list[int]) -> dict[str, Any]:
    """JSON Schema of a valid verdict, criteria before status: PASS exactly when all four
    criteria pass (then empty feedback), FAIL exactly when one fails (then feedback); ``step``
    one of the steps judged. FAIL's criteria are the four ways to name the first failed one
    (those before it pass, it fails, those after are free), so the alternatives never overlap."""
    def variant(status: str, criteria: dict[str, Any], feedback: dict[str, Any]) -> dict[str, Any]:
        return {"type": "object", "additionalProperties": False, "required": list(ANSWER_ORDER),
                "properties": {"step": {"enum": list(steps) or [0]},
                               "criteria": {"type": "object", "additionalProperties": False,
                                            "required": list(CRITERIA), "properties": criteria},
                               "status": {"const": status}, "feedback": feedback}}

    passing = {c: {"const": "pass"} for c in CRITERIA}
    failing = [{c: ({"const": "pass"} if i < first else {"const": "fail"} if i == first else {"enum": ["pass", "fail"]})
                for i, c in enumerate(CRITERIA)} for first in range(len(CRITERIA))]
    feedback = {"type": "string", "minLength": 1, "maxLength": FEEDBACK_CHARS}
    return {"anyOf": [variant("PASS", passing, {"const": ""}),
                      *(variant("FAIL", criteria, feedback) for criteria in failing)]}


def schema_for_input(payload: dict[str, Any]) -> dict[str, Any]:
    """The serving schema of the answer to this input, from the payload alone."""
    return output_schema([s["step"] for s in payload["steps"]])
