"""Planner (HEART Appendix D.1): intent analysis, information sufficiency, a plan or a question.

The Planner sees the user's query, the conversation so far, the answers to its earlier
clarification questions, the steps already executed, every Verifier feedback of this turn,
and the tools ToolFace retrieved for the query — name, one-line description and category,
never schemas. Its input also says what the serving schema needs (``may_ask``,
``max_steps``, shown only when not the defaults true and 10), so :func:`schema_for_input`
rebuilds that schema from the input alone.

Departures from D.1's format, for size (every input token is paid on every
training example and every call): the conversation is the last turn only, its query and
response clipped; a tool's description is its first words (≤ :data:`DESCRIPTION_CHARS`),
empty when it only restates the name; executed steps are step, tool and status (a SUCCESS
with a short summary; a failure's cause is in the feedback, kept whole). Inputs are compact
JSON; answers keep ``json.dumps``' spacing (``ANSWER_SEPARATORS`` says why), as the serving
grammar enforces.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from heart.families import CODE_PRIMITIVE
from heart.roles.common import FUNCTION_WORDS, ParseResult, build_role_messages, clip_words, lead_phrase, parse_model

ROLE = "planner"

SYSTEM_PROMPT = """You are the Planner of a tool-using assistant. Analyse the query's intent: task, objective, tool categories, user constraints. If a detail is missing that no tool can find, answer INSUFFICIENT with one question (not if "may_ask" is false). Else plan the fewest steps 1..n (at most "max_steps", default 10; none if no tool fits), each with one tool of "available_tools" (category → name → description): exact "tool_hint", its category, a one-sentence objective, the earlier steps it needs as "dependencies". When the answer needs a value no tool returns but earlier results give (a sum, a product, a time span, a time as HH:MM), add a code step: "family": "code", "tool_category": "code", "tool_hint": "compute", the objective says what to compute, "dependencies" the steps whose results it reads. Given "feedback": fix all of it, "replanned": true, and do not redo SUCCESS steps of "executed_so_far".
JSON only (INSUFFICIENT: "clarification":"" instead of "plan"):
{"status": "SUFFICIENT", "intent": {"task": "", "objective": "", "tool_categories": [], "constraints": []}, "plan": [{"step": 1, "tool_category": "", "tool_hint": "", "objective": "", "dependencies": []}], "replanned": false}"""

SUBGOALS_SYSTEM_PROMPT = SYSTEM_PROMPT.replace(
    "Else plan the fewest steps 1..n",
    'Else first list "subgoals": what the user asked for, one short paraphrase with its values per call '
    "needed, in order; then plan one step per sub-goal: steps 1..n",
).replace('"plan": [{"step": 1', '"subgoals": [""], "plan": [{"step": 1')
"""The prompt of the sub-goals form (``plan_form: subgoals`` in the input,
``LoopConfig.planner_form``): the plan's length is grounded in the request, one step per
sub-goal the answer lists first."""

SHORT_SYSTEM_PROMPT = "HEART Planner."

RESPONSE_PREFIX = '{"status": "'
"""Prefilled start of the answer (with ``LoopConfig.prefill``): it steers small base models
into the JSON form; teachers' answers start with it too, so adapters learn it either way."""

INSTRUCTION = "Plan this query."

# Length limits shared by the output models, the serving schema and the teachers.
TASK_CHARS = 80
OBJECTIVE_CHARS = 100
CONSTRAINT_CHARS = 60
MAX_CONSTRAINTS = 3
CLARIFICATION_CHARS = 120
SUBGOAL_CHARS = 60

FORMS = ("plan", "subgoals")
"""The Planner's answer forms: "plan" (HEART D.1), or "subgoals" first, then one plan step
per sub-goal (the input says ``plan_form: subgoals``)."""

# What the Planner's input keeps (see build_payload): it chooses tools, it does not bind
# values, so it needs the gist of the recent turns, not their payloads.
DESCRIPTION_CHARS = 40
"""A tool's line in the Planner's input: its own first sentence, at most this long; the
name carries the rest."""
CONVERSATION_TURNS = 1
"""Earlier turns shown: the last this many (the one a follow-up query most often refers to)."""
CONVERSATION_USER_CHARS = 64
CONVERSATION_RESPONSE_CHARS = 24
EXECUTED_SUMMARY_CHARS = 40
"""An executed SUCCESS step's summary; a failed step's cause is in the feedback."""
DEFAULT_MAX_STEPS = 10


class Intent(BaseModel):
    task: str = Field(max_length=TASK_CHARS)
    """The target task, in a few words."""
    objective: str = Field(max_length=OBJECTIVE_CHARS)
    """What the user wants achieved."""
    tool_categories: list[str] = Field(default_factory=list)
    """The ToolFace categories the plan draws on."""
    constraints: list[str] = Field(default_factory=list, max_length=MAX_CONSTRAINTS)
    """The user's explicit constraints and preferences."""


class PlanStep(BaseModel):
    step: int = Field(ge=1)
    family: Literal["tool", "code"] = "tool"
    """The primitive family (HEELO): "tool" calls ``tool_hint``; "code" computes a value from
    the results of its dependencies (``tool_hint`` is then the Code primitive,
    :data:`heart.primitives.CODE_PRIMITIVE`). Written only for code steps."""
    tool_category: str = ""
    tool_hint: str = Field(min_length=1)
    """The exact name of the tool the step uses."""
    objective: str = Field(default="", max_length=OBJECTIVE_CHARS)
    dependencies: list[int] = Field(default_factory=list)
    """Earlier steps that must have succeeded before this one runs."""

    @model_validator(mode="after")
    def _family(self) -> "PlanStep":
        if self.tool_hint == CODE_PRIMITIVE:
            self.family = "code"  # the Code primitive named without its family: the same step
        elif self.family == "code":
            raise ValueError(f"a code step uses the Code primitive {CODE_PRIMITIVE!r}, not {self.tool_hint!r}")
        return self


class PlannerOutput(BaseModel):
    status: Literal["SUFFICIENT", "INSUFFICIENT"]
    intent: Intent
    subgoals: list[str] | None = None
    """The sub-goals form only: what the user asked for, one per plan step, in order."""
    plan: list[PlanStep] = Field(default_factory=list)
    clarification: str | None = Field(default=None, max_length=CLARIFICATION_CHARS)
    replanned: bool = False

    @model_validator(mode="after")
    def _consistent(self) -> "PlannerOutput":
        if self.status == "INSUFFICIENT" and not (self.clarification or "").strip():
            raise ValueError("INSUFFICIENT needs a clarification question")
        if self.status == "SUFFICIENT" and self.subgoals is not None and len(self.subgoals) != len(self.plan):
            raise ValueError(f"{len(self.subgoals)} sub-goals but {len(self.plan)} plan steps: one step per sub-goal")
        if self.status == "SUFFICIENT":
            for index, step in enumerate(self.plan, start=1):
                if step.step != index:
                    raise ValueError(f"plan steps must be numbered 1..n in order; got {step.step} at position {index}")
                if any(d >= step.step or d < 1 for d in step.dependencies):
                    raise ValueError(f"step {step.step} depends on a step that does not come before it")
        return self


def tool_line(description: str, name: str = "") -> str:
    """A tool's own first sentence (BFCL: the text after "Tool description:"), its first
    words when longer than :data:`DESCRIPTION_CHARS` (:func:`lead_phrase`); empty when it
    only restates the tool's ``name`` ("post_tweet": "Post a tweet")."""
    text = " ".join(description.split("Tool description:")[-1].split())
    line = lead_phrase(text.split(". ")[0].rstrip(".…").strip(), DESCRIPTION_CHARS)
    return "" if name and _content_words(line) <= _content_words(name) else line


def _content_words(text: str) -> set[str]:
    """Lower-cased words of ``text`` (snake_case and camelCase split, a plural "s" dropped),
    without function words."""
    spaced = re.sub(r"([a-z])([A-Z])", r"\1 \2", text)
    return {w.lower().rstrip("s") for w in re.findall(r"[A-Za-z]+", spaced)} - FUNCTION_WORDS


def shown_tools(payload: dict[str, Any]) -> dict[str, str]:
    """Tool name → category of the tools the Planner's input shows."""
    return {name: category for category, tools in payload["available_tools"].items() for name in tools}


def build_payload(
    query: str,
    tools: list[dict[str, str]],
    *,
    conversation: list[dict[str, str]] | None = None,
    clarifications: list[dict[str, str]] | None = None,
    executed_so_far: list[dict[str, Any]] | None = None,
    feedback: list[str] | None = None,
    may_ask: bool = True,
    max_steps: int = DEFAULT_MAX_STEPS,
    form: str = "plan",
) -> dict[str, Any]:
    """The Planner's input. ``tools`` are ``{name, description, category}`` (shown grouped
    by category, each by :func:`tool_line`, with ``(here: …)`` after it when the tool carries
    its Primitive's relevance ``how``); ``feedback`` is every Verifier feedback of the
    turn so far (Algorithm 1's accumulated context C), kept whole.

    Compacted to what planning needs: the last :data:`CONVERSATION_TURNS` turn(s), user
    query and response clipped (the response's double quotes made single: escaped quotes
    cost tokens and say nothing); executed steps as step, tool and status (a SUCCESS with a
    short summary: a failure's cause is in the feedback); ``may_ask`` and ``max_steps`` only
    when they differ from their defaults (true, 10), which the prompt states; ``plan_form``
    only for the sub-goals form (:data:`FORMS`).
    """
    grouped: dict[str, dict[str, str]] = {}
    for tool in tools:
        line = tool_line(tool.get("description", ""), tool["name"])
        if tool.get("how"):  # relevance that prunes: what the tool's Primitive says it would fill
            line = f"{line} (here: {tool['how']})" if line else f"here: {tool['how']}"
        grouped.setdefault(tool.get("category", ""), {})[tool["name"]] = line
    payload: dict[str, Any] = {"user_query": query, "available_tools": grouped}
    if conversation:
        payload["conversation"] = [
            {"user": clip_words(turn["user"], CONVERSATION_USER_CHARS),
             "response": clip_words(turn["response"].replace('"', "'"), CONVERSATION_RESPONSE_CHARS)}
            for turn in conversation[-CONVERSATION_TURNS:]]
    if clarifications:
        payload["clarifications"] = clarifications
    if executed_so_far:
        payload["executed_so_far"] = [executed_entry(e) for e in executed_so_far]
    if feedback:
        payload["feedback"] = feedback
    if not may_ask:
        payload["may_ask"] = False
    if max_steps != DEFAULT_MAX_STEPS:
        payload["max_steps"] = max_steps
    if form != "plan":
        payload["plan_form"] = form
    return payload


def asks_for_subgoals(payload: dict[str, Any]) -> bool:
    """Whether the input asks for the sub-goals form (its own mode: prompt and schema)."""
    return payload.get("plan_form") == "subgoals"


def executed_entry(entry: dict[str, Any]) -> dict[str, Any]:
    """An executed step as the Planner sees it: which step ran which tool, and how it ended."""
    row = {"step": entry["step"], "tool": entry["tool"], "status": entry["status"]}
    summary = entry.get("summary") or ""
    if summary.startswith(f"{entry['tool']} "):  # "ls returned …": the tool is named already
        summary = summary[len(entry["tool"]) + 1:]
    if entry["status"] == "SUCCESS" and summary:
        row["summary"] = clip_words(summary, EXECUTED_SUMMARY_CHARS)
    return row


def build_messages(payload: dict[str, Any], system_prompt: str = SYSTEM_PROMPT) -> list[dict[str, str]]:
    return build_role_messages(system_prompt, INSTRUCTION, payload)


def parse_for_input(text: str, payload: dict[str, Any]) -> ParseResult[PlannerOutput]:
    """Parse an answer and check it against its own input: only shown tools, and
    ``replanned`` true exactly when the input carries feedback."""
    result = parse_model(text, PlannerOutput)
    if not result.ok:
        return result
    shown = shown_tools(payload)
    unknown = [s.tool_hint for s in result.value.plan if s.tool_hint not in shown]
    if result.value.status == "SUFFICIENT" and unknown:
        return ParseResult(None, f"plan uses tools that were not shown: {', '.join(map(repr, unknown))}")
    if result.value.status == "SUFFICIENT" and asks_for_subgoals(payload) != (result.value.subgoals is not None):
        return ParseResult(None, "the input asks for sub-goals before the plan" if asks_for_subgoals(payload)
                           else "sub-goals were not asked for")
    max_steps = payload.get("max_steps", DEFAULT_MAX_STEPS)
    if len(result.value.plan) > max_steps:
        return ParseResult(None, f"plan has {len(result.value.plan)} steps; at most {max_steps}")
    return result


def output_schema(tools: dict[str, str], may_ask: bool = True, max_steps: int = DEFAULT_MAX_STEPS,
                  replanning: bool = False, subgoals: bool = False) -> dict[str, Any]:
    """JSON Schema of a valid answer, for constrained decoding: steps numbered 1..n, tools
    limited to the shown ones (``tools``: name → category), each step depending only on
    earlier ones, ``replanned`` fixed by whether this is a re-plan, and no clarification
    once the budget is spent. When the Code primitive is shown, a step is either a tool step
    or a code step (``"family": "code"`` first, then the Code primitive). In the sub-goals
    form the plan has exactly as many steps as the sub-goals listed before it (one branch per
    count)."""
    code = CODE_PRIMITIVE in tools
    names = sorted(n for n in tools if n != CODE_PRIMITIVE) or [""]
    categories = sorted({c for n, c in tools.items() if n != CODE_PRIMITIVE}) or [""]
    every_category = sorted(set(tools.values())) or [""]
    text = lambda limit: {"type": "string", "maxLength": limit}  # noqa: E731

    def step(n: int) -> dict[str, Any]:
        earlier = {"type": "array", "items": {"enum": list(range(1, n))}, "maxItems": n - 1} if n > 1 \
            else {"type": "array", "maxItems": 0}
        tool_step = {"type": "object", "additionalProperties": False,
                     "required": ["step", "tool_category", "tool_hint", "objective", "dependencies"],
                     "properties": {"step": {"const": n}, "tool_category": {"enum": categories},
                                    "tool_hint": {"enum": names}, "objective": text(OBJECTIVE_CHARS),
                                    "dependencies": earlier}}
        if not code:
            return tool_step
        code_step = {"type": "object", "additionalProperties": False,
                     "required": ["step", "family", "tool_category", "tool_hint", "objective", "dependencies"],
                     "properties": {"step": {"const": n}, "family": {"const": "code"},
                                    "tool_category": {"const": tools[CODE_PRIMITIVE]},
                                    "tool_hint": {"const": CODE_PRIMITIVE}, "objective": text(OBJECTIVE_CHARS),
                                    "dependencies": earlier}}
        return {"anyOf": [tool_step, code_step]}

    intent = {"type": "object", "additionalProperties": False,
              "required": ["task", "objective", "tool_categories", "constraints"],
              "properties": {"task": text(TASK_CHARS), "objective": text(OBJECTIVE_CHARS),
                             "tool_categories": {"type": "array", "items": {"enum": every_category},
                                                 "maxItems": len(every_category)},
                             "constraints": {"type": "array", "items": text(CONSTRAINT_CHARS),
                                             "maxItems": MAX_CONSTRAINTS}}}
    replanned = {"const": replanning}
    plan = {"type": "array", "prefixItems": [step(n) for n in range(1, max_steps + 1)], "items": False,
            "maxItems": max_steps}
    sufficient = {"type": "object", "additionalProperties": False,
                  "required": ["status", "intent", "plan", "replanned"],
                  "properties": {"status": {"const": "SUFFICIENT"}, "intent": intent, "plan": plan,
                                 "replanned": replanned}}
    if subgoals:
        def counted(n: int) -> dict[str, Any]:
            listed = {"type": "array", "items": text(SUBGOAL_CHARS), "minItems": n, "maxItems": n}
            steps = {"type": "array", "prefixItems": [step(k) for k in range(1, n + 1)], "items": False,
                     "minItems": n, "maxItems": n} if n else {"type": "array", "maxItems": 0}
            return {**sufficient, "required": ["status", "intent", "subgoals", "plan", "replanned"],
                    "properties": {"status": {"const": "SUFFICIENT"}, "intent": intent, "subgoals": listed,
                                   "plan": steps, "replanned": replanned}}
        sufficient = {"anyOf": [counted(n) for n in range(max_steps + 1)]}
    if not may_ask:
        return sufficient
    insufficient = {"type": "object", "additionalProperties": False,
                    "required": ["status", "intent", "clarification", "replanned"],
                    "properties": {"status": {"const": "INSUFFICIENT"}, "intent": intent,
                                   "clarification": {"type": "string", "minLength": 1,
                                                     "maxLength": CLARIFICATION_CHARS},
                                   "replanned": replanned}}
    return {"anyOf": [sufficient, insufficient]}


def schema_for_input(payload: dict[str, Any]) -> dict[str, Any]:
    """The serving schema of the answer to this input (what :func:`output_schema` gets from
    the loop, read back from the payload alone)."""
    return output_schema(shown_tools(payload), payload.get("may_ask", True),
                         payload.get("max_steps", DEFAULT_MAX_STEPS), bool(payload.get("feedback")),
                         asks_for_subgoals(payload))
