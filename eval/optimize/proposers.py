"""Proposers: from a parent harness and a routed failure cluster to a candidate harness.

- :class:`DeterministicProposer` needs no model. Middleware slot: a tool-boundary failure
  cluster becomes intercepts (:func:`schema_intercepts`, from the messages the boundary really
  produces) — an unknown argument name close to one of the tool's parameters becomes a
  silent-correction ``rename``; a value jsonschema refuses as the wrong type that coercion
  reads unambiguously, or an enum value in the wrong case, becomes the ``coerce_type`` /
  ``enum_casefold`` correction for every tool (the fix follows the schema); a tool that raised
  for want of an argument its schema calls optional becomes an ``error_blocking`` intercept
  that asks for it before the call (a required one is refused by the binding already); a
  tool that raised because what it acts on does not exist yet or its session is not logged in
  becomes a ``prerequisite_blocking`` intercept. Prompt slot: a fixed, small library of
  one-sentence hints per failure kind (:data:`PROMPT_HINTS`), appended to the role's
  prompt. Joint slot: both.
- :class:`OpenAIProposer` asks any OpenAI-compatible chat model for the edit as JSON, with
  the cluster's evidence, the parent's edits and the intercept format in its prompt.

Either returns a :class:`Proposal`; a proposal that does not parse or names unknown tools is
a ``Proposal`` with ``error`` set — the optimizer logs it and charges it one rollout, and
the run goes on.
"""

from __future__ import annotations

import difflib
import json
import random
import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from heart.harness import ROLES, Harness, HarnessError, _parse_prompts
from heart.middleware import FORMAT as MIDDLEWARE_FORMAT, MiddlewareError, parse_middleware
from heart_distill.eval.optimize.clusters import PREREQUISITE, Cluster

PROMPT_HINTS: dict[tuple[str, str], tuple[str, str]] = {
    ("unparseable", "router"): ("router", "Write each invocation_request as one short sentence and each binding "
                                          "once; close the JSON as soon as every step is dispatched."),
    ("unparseable", "planner"): ("planner", "Answer with the JSON object only: a few words per intent field, one "
                                            "step per action the query asks for."),
    ("unparseable", "primitive"): ("primitive", "Answer with the JSON object only: the tool's arguments, each once."),
    ("unparseable", "verifier"): ("verifier", "Answer with the JSON object only: the four criteria, then the status."),
    ("empty_plan", "*"): ("planner", "When a listed tool can serve the query, plan at least one step with its "
                                     "exact name."),
    ("tool_failure", "*"): ("primitive", "Use only the parameter names of the tool's schema and give every required "
                                         "parameter, with values taken verbatim from the request."),
    ("verifier_fail", "*"): ("verifier", "A step whose tool returned SUCCESS with the arguments the request states "
                                         "passes."),
    ("checker", "*"): ("primitive", "Copy values from the request exactly (numbers as numbers, names as written) "
                                    "and leave out optional parameters the request does not give."),
}
"""(failure kind, role or "*") → (role whose prompt gets the hint, the hint)."""

PROPOSED_SET = "optimized"
"""The name of every proposed intercept set (recorded per application as ``optimized@1``)."""

_UNKNOWN = re.compile(r"unknown parameter\(s\) (.+?); the tool takes \[(.*)\]")
_QUOTED = re.compile(r"'([^']+)'")
_MISSING_ARG = re.compile(r"missing \d+ required (?:positional |keyword-only )?arguments?: '(\w+)'")


@dataclass
class Proposal:
    harness: Harness | None
    rationale: str = ""
    error: str | None = None
    tokens: int = 0
    raw: str = ""
    intercepts_added: list[str] = field(default_factory=list)


def intercepts_of(harness: Harness) -> list[dict[str, Any]]:
    """The parent's intercept rows (the shipped default's, when it uses the default set)."""
    from heart.middleware import DEFAULT_PATH

    if harness.middleware_text is not None:
        return list(yaml.safe_load(harness.middleware_text).get("intercepts") or [])
    if harness.middleware == "none":
        return []
    path = DEFAULT_PATH if harness.middleware == "default" else harness.middleware
    return list(yaml.safe_load(open(path).read()).get("intercepts") or [])


def with_edits(parent: Harness, name: str, intercepts: list[dict[str, Any]] | None = None,
               prompts: list[tuple[str, str]] | None = None, catalog: list[Any] | None = None) -> Harness:
    """``parent`` plus new intercepts (appended, checked against ``catalog``) and prompt hints
    (appended to the role's edit); raises MiddlewareError / HarnessError on a bad edit."""
    edits = {role: (kind, text) for role, kind, text in parent.prompts}
    for role, hint in prompts or []:
        kind, text = edits.get(role, ("append", ""))
        if hint not in text:
            edits[role] = (kind, f"{text}\n{hint}".strip())
    middleware, text = parent.middleware, parent.middleware_text
    if intercepts:
        rows = intercepts_of(parent)
        seen = {r["id"] for r in rows}
        rows += [r for r in intercepts if r["id"] not in seen]
        # one set name for every candidate: two candidates with the same intercepts are the
        # same harness (Harness.fingerprint hashes this text), whatever their ids
        doc = {"format": MIDDLEWARE_FORMAT, "name": PROPOSED_SET, "version": 1,
               "description": "Proposed by heart optimize.", "intercepts": rows}
        parse_middleware(doc, f"{name}/middleware.yaml", catalog)
        text = yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=100)
        middleware = "<in harness>"
    prompts_tuple = tuple((r, k, t) for r, (k, t) in sorted(edits.items(), key=lambda kv: ROLES.index(kv[0])))
    return Harness(name, prompts_tuple, middleware, text)


def catalog_index(catalog: list[Any]) -> dict[str, dict[str, Any]]:
    return {(getattr(s, "name", None) or s["name"]): (getattr(s, "parameters", None) or s.get("parameters") or {})
            for s in catalog}


def schema_intercepts(c: Cluster, catalog: list[Any], parent: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Middleware for one tool-boundary failure cluster, with no model (module docstring).

    The rules read the messages the tool boundary really produces (:func:`heart.primitives.bind_arguments`,
    jsonschema, the tool's own exception), and propose only what would change the failing call:

    - ``unknown parameter(s) 'loc'`` → ``rename`` to the closest parameter of the tool;
    - jsonschema's ``n: '5' is not of type 'integer'`` (no coercion ran: seed middleware ``none``
      or a set without it) → ``coerce_type``, when :func:`heart.coercion.coerce` reads the
      failing value as its type (``'five'`` it cannot: no proposal). A value the shipped coercion
      already tried fails as ``cannot read '…' as integer``, which no correction repairs;
    - ``unit: 'Celsius' is not one of ['celsius', …]`` → ``enum_casefold``, when the value
      matches an option but for case (the shipped casefold already refused the others);
    - a tool that raised for want of an argument its schema calls optional → an
      ``error_blocking`` intercept asking for it;
    - a tool that raised because what the call acts on does not exist yet, or its session is
      not logged in (:data:`heart_distill.eval.optimize.clusters.PREREQUISITE`) → a
      ``prerequisite_blocking`` intercept: the call waits for a successful call this turn of
      a tool of the same class that lists (``ls``, ``find``, ``get_…``) or logs in.

    Type and case corrections follow the schema, not the tool: they are proposed for every
    tool, parameter and type (:data:`COERCE`, :data:`CASEFOLD`), so a repair learned on the
    repair tasks' tools reaches the other tasks' tools; neither changes a value it cannot read
    as the schema's own. Reasons name no case, so the same rule found twice is the same harness. An intercept the parent's set (``parent``: its intercept rows) already
    has (the same id) is not proposed again: the failure happened under it."""
    tools = catalog_index(catalog)
    schema = tools.get(c.where)
    if c.kind != "tool_failure" or schema is None:
        return []
    params = list(schema.get("properties", {}))
    rows = list(parent or [])
    out = []
    for n, detail in enumerate(c.details):
        arguments = c.arguments[n] if n < len(c.arguments) else {}
        m = _UNKNOWN.search(detail)
        typed = _NOT_OF_TYPE.match(detail)
        enum = _NOT_IN_ENUM.match(detail)
        if m:
            for wrong in _QUOTED.findall(m.group(1)):
                target = _closest(wrong, params)
                if target is not None:
                    out.append({"id": f"rename-{c.where}-{wrong}-{target}", "pattern": "silent_correction",
                                "guard": {"tool": c.where, "parameter": target, "when": "missing"},
                                "action": {"correct": "rename", "from": [wrong]},
                                "reason": f"The model calls {c.where} with {wrong!r} for {target!r}."})
        elif typed and c.type == "CONSTRAINT_VIOLATION":
            path, value_text, kind = typed.group(1), typed.group(2), typed.group(3)
            name = path.split(".")[0]
            spec = schema["properties"].get(name) if name in params else None
            if spec is not None and _coercible(value_text, _spec_at(spec, path.split(".")[1:]), kind):
                out.append(COERCE)
        elif enum and c.parameter in params and _casefold_matches(enum.group(2), enum.group(3)):
            out.append(CASEFOLD)
        for missing in _MISSING_ARG.findall(detail):  # the tool raised: its schema calls it optional
            if missing in params:
                description = schema["properties"][missing].get("description", "")
                out.append({"id": f"require-{c.where}-{missing}", "pattern": "error_blocking",
                            "guard": {"tool": c.where, "parameter": missing, "when": "missing"},
                            "action": {"message": f"{{tool}} needs {{parameter}} ({description[:120]}): "
                                                  "call it again with that argument",
                                       "failure_type": "SCHEMA_RESOLUTION"},
                            "reason": f"{c.where} fails without {missing!r} although its schema does not "
                                      "require it."})
        if c.type == "RUNTIME_ERROR" and PREREQUISITE.search(detail):
            row = prerequisite_intercept(c, detail, arguments, catalog)
            if row is not None and not any(r.get("id") == row["id"] for r in rows):
                out.append(row)
    unique = {row["id"]: row for row in out if not any(r.get("id") == row["id"] for r in rows)}
    return list(unique.values())


COERCE = {"id": "coerce-to-schema-type", "pattern": "silent_correction",
          "guard": {"tool": "*", "parameter": "*", "when": "type_mismatch"}, "action": {"correct": "coerce_type"},
          "reason": "Values arrive as another JSON type than the schema's ('5' for an integer) and read "
                    "unambiguously as it; the type comes from the schema, so the correction applies to every tool "
                    "(a value it cannot read fails as before)."}
"""The coercion a type failure proposes: every tool and type, as the evidence is about how values
are written, not about one parameter; safe where it does not apply (it changes only values that
do not conform, and only when they read as the schema's type)."""
CASEFOLD = {"id": "enum-casefold", "pattern": "silent_correction",
            "guard": {"tool": "*", "parameter": "*", "when": "not_in_enum"}, "action": {"correct": "enum_casefold"},
            "reason": "Enum values arrive in another case than their option ('CELSIUS' for 'celsius'); the options "
                      "come from the schema, so the correction applies to every tool (a value matching no option "
                      "fails as before)."}

_NOT_OF_TYPE = re.compile(r"^([A-Za-z_][\w]*(?:\.\w+)*): (.+) is not of type '(\w+)'")
"""jsonschema's type message as :func:`heart.primitives.bind_arguments` reports it: path, the
value's repr, the schema type (the first one, when several are allowed)."""
_NOT_IN_ENUM = re.compile(r"^([A-Za-z_][\w]*(?:\.\w+|\[\d+\])*): (.+) is not one of (\[.*\])$", re.DOTALL)
"""jsonschema's and the binding's enum message: path, the value's repr, the options' repr."""
_LOGIN = re.compile(r"logged in|authenticat|log ?in|token", re.IGNORECASE)
_LOGIN_TOOL = re.compile(r"log_?in|authenticate", re.IGNORECASE)
_LISTING_TOOL = re.compile(r"^(?:ls|find|list|get|search|view|display|show)(?:_|$)|^(?:list|get|search)[A-Z]",
                           re.IGNORECASE)


def _literal(text: str) -> Any:
    import ast

    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return _UNREAD


_UNREAD = object()
"""A repr that does not read back (cut, or not a literal): the rule cannot check it."""


def _spec_at(spec: dict[str, Any], path: list[str]) -> dict[str, Any]:
    for key in path:
        if key.isdigit() and isinstance(spec.get("items"), dict):
            spec = spec["items"]
        elif isinstance(spec.get("properties"), dict) and key in spec["properties"]:
            spec = spec["properties"][key]
        else:
            return {}
    return spec


def _coercible(value_text: str, spec: dict[str, Any], kind: str) -> bool:
    """Whether :func:`heart.coercion.coerce` reads the failing value as ``kind`` (a value whose
    repr was cut cannot be checked: proposed, the repair evaluation decides)."""
    from heart.coercion import BindingError, coerce

    value = _literal(value_text)
    if value is _UNREAD:
        return True
    try:
        coerce(value, spec if spec.get("type") == kind else {**spec, "type": kind}, "value")
    except BindingError:
        return False
    return True


def _casefold_matches(value_text: str, options_text: str) -> bool:
    value, options = _literal(value_text), _literal(options_text)
    if value is _UNREAD or options is _UNREAD or not isinstance(options, list):
        return value is _UNREAD or options is _UNREAD
    values = value if isinstance(value, list) else [value]
    folded = {str(o).casefold() for o in options}
    return any(isinstance(v, str) and v not in options and v.strip().casefold() in folded for v in values)


def prerequisite_intercept(c: Cluster, detail: str, arguments: dict[str, Any],
                           catalog: list[Any]) -> dict[str, Any] | None:
    """A ``prerequisite_blocking`` intercept for a tool that raised for want of an earlier
    call (module docstring of :func:`schema_intercepts`), or None when the tool's class has no
    tool that could provide it. The guarded parameter is the one whose value the message
    quotes (a file name, an id); without one, every parameter (``*``)."""
    specs = {(getattr(s, "name", None) or s["name"]): s for s in catalog}
    spec = specs.get(c.where)
    if spec is None:
        return None
    category = getattr(spec, "category", None) if not isinstance(spec, dict) else spec.get("category")
    login = bool(_LOGIN.search(detail))
    pattern = _LOGIN_TOOL if login else _LISTING_TOOL
    providers = sorted(name for name, s in specs.items()
                       if name != c.where and pattern.search(name)
                       and ((getattr(s, "category", None) if not isinstance(s, dict) else s.get("category")) == category))
    if not providers:
        return None
    named = next((k for k, v in arguments.items() if isinstance(v, (str, int)) and not isinstance(v, bool)
                  and str(v) and str(v) in detail), None) if not login else None
    parameter = named or "*"
    what = "a logged-in session" if login else f"{parameter} listed by an earlier call"
    return {"id": f"prerequisite-{c.where}-{'login' if login else parameter.replace('*', 'any')}",
            "pattern": "prerequisite_blocking",
            "guard": {"tool": c.where, "parameter": parameter,
                      "when": f"present and not prior_call(tool={'|'.join(providers)})"},
            "action": {"message": f"{{tool}} needs {what}: call {' or '.join(providers[:4])} first in this turn, "
                                  "then call {tool} again"},
            "reason": f"{c.where} raises when what it acts on was not provided yet (a missing file or id, or no "
                      f"logged-in session): the call needs what an earlier call of {', '.join(providers[:4])} "
                      "provides."}


def _closest(wrong: str, params: list[str]) -> str | None:
    squash = {re.sub(r"[^a-z0-9]", "", p.lower()): p for p in params}
    key = re.sub(r"[^a-z0-9]", "", wrong.lower())
    if key in squash:
        return squash[key]
    # an abbreviation or an extension of one parameter's name (loc → location, city_name → city)
    related = [p for k, p in squash.items() if key and k and (k.startswith(key) or key.startswith(k))]
    if len(related) == 1:
        return related[0]
    match = difflib.get_close_matches(wrong, params, n=1, cutoff=0.6)
    return match[0] if match else None


def prompt_hint(c: Cluster) -> tuple[str, str] | None:
    return PROMPT_HINTS.get((c.kind, c.where)) or PROMPT_HINTS.get((c.kind, "*"))


class DeterministicProposer:
    """Edits from rules, no model (module docstring)."""

    name = "deterministic"
    exhaustive = True
    """Asking costs nothing: the search asks about the slot's next cluster when one has no
    rule or repeats a tried harness (:func:`heart_distill.eval.optimize.search._propose`)."""

    def propose(self, parent: Harness, slot: str, cluster: Cluster, catalog: list[Any], name: str,
                rng: random.Random, others: list[Cluster] | None = None) -> Proposal:
        """``others``: the slot's other clusters — in the middleware slot their silent corrections
        join the target's (each fires only where its own evidence holds, so together they repair
        what each repairs); the search asks with them first, then cluster by cluster."""
        rows = intercepts_of(parent)
        intercepts = schema_intercepts(cluster, catalog, rows) if slot in ("middleware", "joint") else []
        if slot == "middleware" and others:
            for other in others:
                intercepts += [r for r in schema_intercepts(other, catalog, rows)
                               if r["pattern"] == "silent_correction" and r["id"] not in {i["id"] for i in intercepts}]
        hint = prompt_hint(cluster) if slot in ("prompt", "joint") else None
        if not intercepts and hint is None:
            return Proposal(None, f"no {slot} rule for cluster {cluster.id}")
        try:
            harness = with_edits(parent, name, intercepts, [hint] if hint else None, catalog)
        except (MiddlewareError, HarnessError) as err:
            return Proposal(None, error=str(err))
        evidence = "; ".join(f"{c.where}: {c.details[0][:80]}" for c in [cluster, *(others or [])] if c.details)[:400]
        return Proposal(harness, f"{slot} for {cluster.id}" + (f" and {len(others)} more cluster(s)" if others else "")
                        + ": " + ", ".join([r["id"] for r in intercepts] + ([f"{hint[0]} hint"] if hint else []))
                        + (f" (evidence: {evidence})" if intercepts else ""),
                        intercepts_added=[r["id"] for r in intercepts])


PROPOSER_SYSTEM = """You improve the harness around a fixed tool-using model (PRISM): you never retrain it. A harness is (1) text appended to a role's system prompt (roles: planner, router, primitive, verifier) and (2) tool-boundary intercepts in exactly three patterns: silent_correction (action.correct: rename with from: [wrong names], coerce_type, json_unwrap, enum_casefold), error_blocking (action.message: an actionable message returned before the call), prerequisite_blocking (guard.when must use prior_call(tool=NAME[, field=PATH]); action.message). Each intercept: {"id", "pattern", "guard": {"tool", "parameter", "when"}, "action", "reason"}; "when" uses missing, present, is_string_json, type_mismatch, not_in_enum, schema_type(...), matches('REGEX'), prior_call(...), combined with and/or/not. Answer with one JSON object only: {"rationale": "...", "prompts": {"ROLE": "text to append"}, "intercepts": [...]}. Edit only what the slot allows: slot "prompt": prompts only; "middleware": intercepts only; "joint": both."""


class OpenAIProposer:
    """Asks an OpenAI-compatible chat model for the edit (``openai:<url>#<model>``)."""

    def __init__(self, url: str, model: str, max_new_tokens: int = 768, backend: Any = None):
        from heart.runtime.openai_compat import OpenAIBackend

        self.backend = backend or OpenAIBackend(url, model)
        self.name = f"openai:{url}#{model}"
        self.max_new_tokens = max_new_tokens

    def propose(self, parent: Harness, slot: str, cluster: Cluster, catalog: list[Any], name: str,
                rng: random.Random) -> Proposal:
        from heart.roles.common import extract_json_object
        from heart.runtime.base import SamplingConfig

        tools = catalog_index(catalog)
        named = {t: tools[t] for t in {cluster.where, *(c.split(":")[0] for calls in cluster.calls for c in calls)}
                 if t in tools}
        payload = {"slot": slot, "cluster": cluster.to_dict(),
                   "current_prompt_edits": {r: t for r, _, t in parent.prompts},
                   "current_intercepts": intercepts_of(parent), "tools": named}
        messages = [{"role": "system", "content": PROPOSER_SYSTEM},
                    {"role": "user", "content": json.dumps(payload, ensure_ascii=False, default=str)[:12000]}]
        try:
            generation = self.backend.generate("proposer", messages, SamplingConfig(max_new_tokens=self.max_new_tokens))
        except Exception as err:  # the proposer's server failing is the proposer's failure, not the run's
            return Proposal(None, error=f"proposer call failed: {type(err).__name__}: {err}"[:500])
        tokens = generation.prompt_tokens + generation.completion_tokens
        raw = generation.text
        try:
            answer = extract_json_object(raw)
            if not isinstance(answer, dict):
                raise ValueError("not a JSON object")
            prompts = answer.get("prompts") or {}
            intercepts = answer.get("intercepts") or []
            if not isinstance(prompts, dict) or not isinstance(intercepts, list):
                raise ValueError("prompts must be an object and intercepts a list")
            if slot == "middleware":
                prompts = {}
            if slot == "prompt":
                intercepts = []
            _parse_prompts({r: {"append": t} for r, t in prompts.items()}, "proposal")
            if not prompts and not intercepts:
                raise ValueError(f"the {slot} slot's proposal edits nothing")
            harness = with_edits(parent, name, intercepts, list(prompts.items()), catalog)
        except (ValueError, TypeError, KeyError, MiddlewareError, HarnessError) as err:
            return Proposal(None, error=f"unusable proposal: {err}"[:500], tokens=tokens, raw=raw[:2000])
        return Proposal(harness, str(answer.get("rationale", ""))[:500], tokens=tokens, raw=raw[:2000],
                        intercepts_added=[str(r.get("id")) for r in intercepts if isinstance(r, dict)])


def make_proposer(spec: str):
    """``deterministic`` or ``openai:<url>#<model>``."""
    if spec == "deterministic":
        return DeterministicProposer()
    if spec.startswith("openai:"):
        url, sep, model = spec[len("openai:"):].partition("#")
        if not sep or not url or not model:
            raise ValueError(f"proposer {spec!r}: expected openai:<url>#<model>")
        return OpenAIProposer(url, model)
    raise ValueError(f"proposer must be 'deterministic' or 'openai:<url>#<model>', got {spec!r}")
