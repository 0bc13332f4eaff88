"""Router (HEART Appendix D.2): one dispatch per plan step, with bindings and h-params.

Two modes (``LoopConfig.router_mode``):

- ``plan``: Appendix D.2 — one call per plan, before any step runs, dispatching every step;
  a value produced upstream can only be a reference, and the Router writes each step's
  ``invocation_request``.
- ``step``: Algorithm 1's βk ← ROUTER(πk, C) — one call per step, once its dependencies have
  run, with their results as listed fields (:func:`result_fields`): a value an upstream
  result holds is bound as the reference to the step and field that hold it
  (``$step_j.result.FIELD``), and the answer is that one step's bindings and h-params; the
  invocation request is written by code from the bindings (:func:`invocation_request`), so
  no token of the Router's answer is free wording.

Bindings are literal values grounded in the Router's input (the query, the clarifications,
the conversation, earlier results), or references ``$step_j.field`` to the result of an
earlier step of the plan, resolved when step j has run. Every required parameter is
resolved; a value shared by several steps is resolved once and reused. The Router sees
each tool's parameter names (required and optional), never the full schema. A code step
(the Code primitive, :mod:`heart.families`) has no parameters: its tool entry says
``"family": "code"`` and its bindings name the computation's inputs, usually
``$step_j.result`` references.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from heart.families import CODE_PRIMITIVE
from heart.references import FIELD_KEY, REFERENCE
from heart.roles.common import ParseResult, build_role_messages, parse_model, quoted_value, whole_parts

ROLE = "router"

DEFAULT_TIMEOUT_S = 30
"""A step's timeout when the Router does not set one (D.2)."""

READ_VERBS = ("get", "list", "search", "find", "read", "check", "display", "show", "view", "ls", "cat", "pwd",
              "grep", "du", "wc", "diff", "tail", "head", "estimate", "mean", "compute", "count", "verify",
              "query", "lookup", "retrieve", "fetch", "calculate", "convert")
"""First words of tool names that only read: their calls are idempotent, so they may be retried."""


def is_read_only(tool: str) -> bool:
    """A tool whose name starts with a reading verb (``get_balance``, ``ls``, ``search_emails``,
    camelCase too: ``displayCarStatus``), or names its object before a ``get``
    (``ticket_get_login_status``). Everything else is taken to change state: the loop never
    runs such a call twice in a turn (:mod:`heart.ledger`), and the Router retries only reads."""
    words = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", tool).lower().replace("-", "_").split("_")
    return words[0] in READ_VERBS or (len(words) > 2 and words[1] == "get")


SYSTEM_PROMPT = """You are the Router of a tool-using assistant.
Given the user's query, the clarifications, the conversation so far, earlier results and a plan, write one dispatch per plan step:
- "target_tool": the step's tool_hint;
- "invocation_request": one sentence telling the tool exactly what to do;
- "resolved_bindings": a value for every required parameter of the tool (and the optional ones the request needs). Take each value from the context; if it will come from an earlier step's result, write "$step_<j>.<field>" (for example "$step_1.result.file_content"). Never invent a value that is not grounded in the context. Resolve a value shared by several steps once and reuse it. A "code" step's tool (family "code") has no parameters: bind each input of its computation to a short name, usually "$step_<j>.result";
- "h_params": {"retry": attempts 1-5, "priority": "low", "normal" or "high" (among ready steps, higher runs first), "timeout_s": integer seconds, default 30}.
Answer with one JSON object and nothing else:
{"status": "READY", "dispatch": [{"step": 1, "target_tool": "...", "invocation_request": "...", "resolved_bindings": {}, "h_params": {"retry": 1, "priority": "normal", "timeout_s": 30}}]}"""

STEP_SYSTEM_PROMPT = """You are the Router of a tool-using assistant.
Given the user's query, the clarifications, the conversation so far, one plan step and the results of the steps it depends on ("upstream", each with its result's fields), bind the step's arguments:
- "resolved_bindings": a value for every required parameter of the tool (and the optional ones the step needs). A value the query, the clarifications or the conversation states: write it as stated. A value an upstream result holds: write "$step_<j>.<field>" with the field as that step lists it (for example "$step_1.result.files.0"); "$step_<j>.result" when the value must be taken out of a longer text. Never invent a value that is not grounded in the context. A "code" step's tool (family "code") has no parameters: bind each input of its computation to a short name, usually "$step_<j>.result";
- "h_params": {"retry": attempts 1-5, "priority": "low", "normal" or "high", "timeout_s": integer seconds, default 30}.
Answer with one JSON object and nothing else:
{"status": "READY", "dispatch": [{"step": 1, "target_tool": "...", "resolved_bindings": {}, "h_params": {"retry": 1, "priority": "normal", "timeout_s": 30}}]}"""

SHORT_SYSTEM_PROMPT = "HEART Router."
"""The context-distilled prompt, for both modes: the input says which one it is."""

MODES = ("plan", "step")
DEFAULT_MODE = "plan"
"""The loop's default mode (``LoopConfig.router_mode``): the role benchmark did not tell the
two apart (distilled per-step binding EM 48.4 [35.9, 60.9] in step mode, 42.4 [32.3, 54.4] in
plan mode at n = 64, docs/results/role-benchmark), so the paper's whole-plan dispatch stays."""

RESPONSE_PREFIX = '{"status": "READY", "dispatch": ['
"""Prefilled start of the answer (with ``LoopConfig.prefill``): it steers small base models
into the JSON form; teachers' answers start with it too, so adapters learn it either way."""

INSTRUCTION = "Write the dispatch for every step of this plan."
STEP_INSTRUCTION = "Bind the arguments of this step."

UPSTREAM_FIELDS = 16
"""Most fields of one upstream result the step-mode Router is shown (its first leaves)."""
FIELD_VALUE_CHARS = 80
"""How much of each field's value it is shown."""

REQUEST_CHARS = 200
VALUE_CHARS, VALUE_ITEMS, VALUE_KEYS = 256, 8, 4
"""Limits of a binding's value when decoding is constrained: characters of a string, items of a
list, keys of an object. The gold bindings of the BFCL and AgentDojo collections hold strings
of 205 characters at most (78 at the 99th percentile), lists of 5 items and objects of 2 keys;
the limits leave room above those and no more, because a string a small model never closes
runs to its limit: a run of digits and dots ("1.0.1.1.1…") costs a SmolLM2 token per
character, so 512 characters were more than the Router's whole token budget
(bench/router_termination.py)."""
_SCALAR = {"anyOf": [{"type": "string", "maxLength": VALUE_CHARS}, {"type": "number"},
                     {"type": "boolean"}, {"type": "null"}]}
KEY_CHARS = 64
"""Longest key of a binding's object, or name of a code step's input (gold keys: "type",
"file_id"): a key is a string too, and an unbounded one is a string a model may never close."""
_FLAT_OBJECT = {"type": "object", "additionalProperties": _SCALAR, "maxProperties": VALUE_KEYS,
                "propertyNames": {"maxLength": KEY_CHARS}}
BINDING_VALUE = {"anyOf": [*_SCALAR["anyOf"], _FLAT_OBJECT,
                           {"type": "array", "items": {"anyOf": [*_SCALAR["anyOf"], _FLAT_OBJECT]},
                            "maxItems": VALUE_ITEMS}]}
"""A binding's value when decoding is constrained: a scalar (a literal or a ``$step_j`` reference),
a flat object, or a list of those (AgentDojo's ``send_email`` attachments are
``[{"type": "file", "file_id": "19"}]``), as the tools' parameters are: every gold binding of
the collections is one. Free JSON let small models nest dispatches inside a binding, or
repeat keys and items, until their token budget ran out: a third of the held-out Router
answers, base and distilled.
Deeper values (an attachment holding a whole calendar event) are out of reach when
constrained; no gold call uses one."""
PRIORITIES = ("low", "normal", "high")
PRIORITY_RANK = {p: i for i, p in enumerate(PRIORITIES)}


class HParams(BaseModel):
    retry: int = Field(default=1, ge=1, le=5)
    """Attempts at execution (1 = no retry); re-runs on RUNTIME_ERROR only."""
    priority: Literal["low", "normal", "high"] = "normal"
    """Among steps whose dependencies are met, higher priority runs first."""
    timeout_s: int = Field(default=DEFAULT_TIMEOUT_S, ge=1, le=300)


class Dispatch(BaseModel):
    step: int = Field(ge=1)
    target_tool: str = Field(min_length=1)
    invocation_request: str = Field(default="", max_length=REQUEST_CHARS)
    resolved_bindings: dict[str, Any] = Field(default_factory=dict)
    h_params: HParams = Field(default_factory=HParams)


class RouterOutput(BaseModel):
    status: Literal["READY"]
    dispatch: list[Dispatch]

    @model_validator(mode="after")
    def _once(self) -> "RouterOutput":
        steps = [d.step for d in self.dispatch]
        if len(set(steps)) != len(steps):
            raise ValueError("each plan step must be dispatched once")
        return self


CODE_INPUTS = 8
"""Most inputs a code step binds."""


def code_parameters() -> dict[str, Any]:
    """What the Router is told about the Code primitive: its family; it binds named inputs."""
    return {"family": "code", "required": [], "optional": []}


def parameters_for(tool: str, schema: dict[str, Any]) -> dict[str, Any]:
    """:func:`code_parameters` for the Code primitive, else :func:`tool_parameters`."""
    return code_parameters() if tool == CODE_PRIMITIVE else tool_parameters(schema)


def tool_parameters(schema: dict[str, Any]) -> dict[str, Any]:
    """What the Router is told about a tool: its required and optional parameter names, and
    the allowed values of enumerated parameters (values it cannot otherwise ground)."""
    properties = schema.get("properties", {})
    required = [p for p in schema.get("required", []) if p in properties]
    info: dict[str, Any] = {"required": required, "optional": [p for p in properties if p not in required]}
    enums = {name: spec.get("enum") or spec.get("items", {}).get("enum")
             for name, spec in properties.items() if spec.get("enum") or spec.get("items", {}).get("enum")}
    if enums:
        info["enums"] = enums
    return info


def build_payload(
    query: str,
    plan: list[dict[str, Any]],
    tools: dict[str, dict[str, Any]],
    *,
    conversation: list[dict[str, str]] | None = None,
    clarifications: list[dict[str, str]] | None = None,
    executed_so_far: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The Router's input: ``plan`` steps ``{step, tool_hint, objective, dependencies}`` and,
    per tool, :func:`tool_parameters`."""
    payload: dict[str, Any] = {"user_query": query, "plan": plan, "tools": tools}
    if clarifications:
        payload["clarifications"] = clarifications
    if conversation:
        payload["conversation"] = conversation
    if executed_so_far:
        payload["executed_so_far"] = executed_so_far
    return payload


def is_step_input(payload: dict[str, Any]) -> bool:
    """Whether ``payload`` is a step-mode input (it lists the step's upstream results)."""
    return "upstream" in payload


def system_prompt_for(payload: dict[str, Any]) -> str:
    """The full system prompt of the mode ``payload`` is in."""
    return STEP_SYSTEM_PROMPT if is_step_input(payload) else SYSTEM_PROMPT


def build_messages(payload: dict[str, Any], system_prompt: str | None = None) -> list[dict[str, str]]:
    """``system_prompt`` None: the full prompt of the payload's mode."""
    return build_role_messages(system_prompt or system_prompt_for(payload),
                               STEP_INSTRUCTION if is_step_input(payload) else INSTRUCTION, payload)


def result_fields(result: Any, limit: int = UPSTREAM_FIELDS, chars: int = FIELD_VALUE_CHARS) -> dict[str, Any]:
    """An upstream result as the step-mode Router sees it: its leaves in order, each under
    the field path a ``$step_j.<field>`` reference spells (``result.files.0``), values of at
    most ``chars`` characters (longer texts end with "…"), at most ``limit`` of them; a
    scalar result is the one field ``result``. Paths a reference cannot spell (keys with
    spaces or dots) are left out."""
    fields: dict[str, Any] = {}

    def visit(value: Any, path: str) -> None:
        if len(fields) >= limit:
            return
        if isinstance(value, dict) and value:
            for key, item in value.items():
                if len(str(key)) <= FIELD_KEY_CHARS and _KEY.fullmatch(str(key)):
                    visit(item, f"{path}.{key}")
            return
        if isinstance(value, list) and value:
            for index, item in enumerate(value):
                visit(item, f"{path}.{index}")
            return
        if isinstance(value, str) and len(value) > chars:
            value = value[: chars - 1] + "…"
        fields[path] = value

    visit(result, "result")
    return fields


_KEY = re.compile(FIELD_KEY)
"""A key a reference can spell (:mod:`heart.references`)."""
FIELD_KEY_CHARS = 40
"""Longest key an upstream field's path is listed with: a longer one is a text, not a name."""


def upstream_entry(step: int, tool: str, summary: str, result: Any) -> dict[str, Any]:
    """One upstream result in the step-mode Router's input."""
    return {"step": step, "tool": tool, "summary": summary, "fields": result_fields(result)}


def build_step_payload(
    query: str,
    step: dict[str, Any],
    tools: dict[str, dict[str, Any]],
    upstream: list[dict[str, Any]],
    *,
    conversation: list[dict[str, str]] | None = None,
    clarifications: list[dict[str, str]] | None = None,
    executed_so_far: list[dict[str, Any]] | None = None,
    feedback: list[str] | None = None,
) -> dict[str, Any]:
    """The step-mode Router's input: the one ``step`` (as a one-step plan), its tool's
    parameters, the :func:`upstream_entry` of each step it depends on, and on a re-plan what
    earlier attempts executed and the turn's feedback."""
    context = build_payload(query, [step], tools, conversation=conversation, clarifications=clarifications,
                            executed_so_far=executed_so_far)
    # the keys in the order the adapters were trained on: the step, then its upstream results
    payload = {key: context.pop(key) for key in ("user_query", "plan", "tools")}
    payload.update(upstream=upstream, **context)
    if feedback:
        payload["feedback"] = feedback
    return payload


def invocation_request(tool: str, bindings: dict[str, Any], objective: str = "") -> str:
    """The request a step's Primitive reads, written from its bindings by one template:
    "Call TOOL with k='v', n from step 2." (whole parts, as many as fit); a code step's is
    "Compute: OBJECTIVE". The step-mode loop writes it; the plan-mode teacher writes the
    same, so a plan-mode Router copies its own bindings instead of guessing a wording."""
    if tool == CODE_PRIMITIVE:
        text = f"Compute: {objective}" if objective else "Compute the value the answer needs."
        return text if len(text) <= REQUEST_CHARS else "Compute the value the answer needs."
    parts = []
    for name, value in bindings.items():
        reference = REFERENCE.fullmatch(value.strip()) if isinstance(value, str) else None
        parts.append(f"{name} from step {reference.group(1)}" if reference else f"{name}={quoted_value(value)}")
    return whole_parts(parts, lambda kept: f"Call {tool}" + (f" with {', '.join(kept)}." if kept else "."),
                       REQUEST_CHARS)


def parse_for_input(text: str, payload: dict[str, Any]) -> ParseResult[RouterOutput]:
    """Parse the dispatch and check it against the plan it serves: every step once, with
    the step's tool, and every required parameter bound."""
    result = parse_model(text, RouterOutput)
    if not result.ok:
        return result
    plan_steps = {s["step"]: s["tool_hint"] for s in payload["plan"]}
    dispatched = {d.step: d.target_tool for d in result.value.dispatch}
    if set(dispatched) != set(plan_steps):
        return ParseResult(None, f"dispatch covers steps {sorted(dispatched)} but the plan has steps {sorted(plan_steps)}")
    wrong = [s for s, tool in dispatched.items() if tool != plan_steps[s]]
    if wrong:
        return ParseResult(None, f"dispatch changes the tool of step(s) {wrong} from the plan's")
    for d in result.value.dispatch:
        missing = [p for p in payload["tools"].get(d.target_tool, {}).get("required", [])
                   if p not in d.resolved_bindings]
        if missing:
            return ParseResult(None, f"step {d.step} leaves required parameter(s) {missing} of {d.target_tool} unresolved")
    return result


def output_schema(plan_steps: dict[int, str], tools: dict[str, dict[str, Any]], step_mode: bool = False) -> dict[str, Any]:
    """JSON Schema of a valid dispatch for this plan: one entry per step, in order, each
    binding every required parameter of its tool and only parameters it has (values:
    literals or $step_j references, as :data:`BINDING_VALUE`)."""
    def entry(step: int, tool: str) -> dict[str, Any]:
        params = tools.get(tool, {"required": [], "optional": []})
        if params.get("family") == "code":  # named inputs of the computation
            bindings = {"type": "object", "additionalProperties": BINDING_VALUE, "maxProperties": CODE_INPUTS,
                        "propertyNames": {"maxLength": KEY_CHARS}}
        else:
            bindings = {"type": "object", "additionalProperties": False, "required": list(params["required"]),
                        "properties": {p: BINDING_VALUE for p in params["required"] + params["optional"]}}
        request = {} if step_mode else {"invocation_request": {"type": "string", "maxLength": REQUEST_CHARS}}
        return {"type": "object", "additionalProperties": False,
                "required": ["step", "target_tool", *request, "resolved_bindings", "h_params"],
                "properties": {
                    "step": {"const": step}, "target_tool": {"const": tool}, **request,
                    "resolved_bindings": bindings,
                    "h_params": {"type": "object", "additionalProperties": False,
                                 "required": ["retry", "priority", "timeout_s"],
                                 "properties": {"retry": {"enum": [1, 2, 3, 4, 5]},
                                                "priority": {"enum": list(PRIORITIES)},
                                                "timeout_s": {"type": "integer", "minimum": 1, "maximum": 300}}}}}
    steps = sorted(plan_steps.items())
    return {"type": "object", "additionalProperties": False, "required": ["status", "dispatch"],
            "properties": {"status": {"const": "READY"},
                           "dispatch": {"type": "array", "prefixItems": [entry(s, t) for s, t in steps],
                                        "items": False, "minItems": len(steps), "maxItems": len(steps)}}}


def schema_for_input(payload: dict[str, Any]) -> dict[str, Any]:
    """The serving schema of the answer to this input, from the payload alone."""
    return output_schema({s["step"]: s["tool_hint"] for s in payload["plan"]}, payload["tools"], is_step_input(payload))
