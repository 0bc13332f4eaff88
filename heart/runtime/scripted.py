"""Scripted backends: answers from a Python function, or from a task's gold calls.

- :class:`ScriptedBackend` answers each role call with ``responder(role, messages)``: for
  unit tests and hand-written scenarios;
- :class:`GoldTeacher` answers from the task's gold calls (BFCL ground truth, AgentDojo
  ``ground_truth()``), with optional fault injection so the traces hold real failures,
  real Verifier FAILs and real recoveries. It is what ``heart run --model gold`` and the
  end-to-end evaluation's ``teacher:gold`` run, and what ``heart collect --teacher gold``
  records (``heart_distill.data.teachers`` builds one per episode).

The gold teacher writes only what a role could derive from its own input plus the gold
calls (a student can learn only what its input determines), in the formats of HEART Appendix D:

- **Planner**: plans only with tools in ``available_tools``. When a gold tool of the turn
  was not retrieved, it plans the gold calls before it (none, if the first gold tool is
  missing: the prompt's rule for "no available tool serves the request") and records the
  miss as ``retrieval_miss`` in the event's ``extra``. The Verifier then fails the plan's
  last step on ``task_completion`` and names what is still to do; the loop's re-plan adds
  tools retrieved for that feedback (``LoopConfig.replan_tools``), so the missing tool can
  come into view the way it would for any agent, never from the answer key.
- **Planner, clarifications**: in a turn whose request withholds a parameter
  (``Task.meta["withheld_turns"]``, BFCL miss_param) it answers INSUFFICIENT with one
  question (:func:`clarification_question`, from the gold calls of the turn that gives the
  value and what the user said before) until its input's clarifications hold the user's
  answer, then plans that turn's gold calls; it never asks anywhere else.
- **Router**: binds a gold value literally only when it occurs in the Router's input;
  otherwise it refers to the result of the previous plan step (``$step_j.result``), from
  which the Primitive (which sees that result) takes the value. A value that is in neither
  is bound as is and counted by the build's ``router_ungrounded`` filter.
- **Verifier**: judges each step against the gold call — FAIL when it deviates — with
  criteria per fault kind and feedback written from the Verifier's own input (step,
  argument, what the request asked, what was used). It never writes benchmark answer text.
- **Faults** (``fault_rate``): schema faults that fail binding (no side effects) and
  semantic faults that execute cleanly with a plausible wrong value taken from the same
  task's context, so the Verifier learns FAILs that execution alone does not show.
- **Natural faults** (``student``, ``student_rate``): at a Primitive step with no fault yet in
  the turn, another model (the base, or distilled roles) answers the very input instead, with
  ``student_rate``'s chance. An answer equal to the gold call is replaced by the gold answer
  (nothing to learn apart); any other answer, unparseable ones included, is executed as it is
  — a real model's real mistake, recorded as the fault ``natural`` — and the Verifier judges
  it against the gold call with the arguments the tool was really called with. These are the
  FAILs a deployed Verifier meets, beside the injected ones (the datasets' ``fault_kind``).
- **Code steps** (HEELO's Code family): where the task says a turn's answer needs a value
  computed from the gold calls' results (``Task.computations``: a total, a product, a time
  span, written from the task's request, never from its answer), the plan ends with a code
  step over the steps whose results it reads: the Router binds them as ``$step_j.result``,
  the Primitive writes the computation's expression. Only when the Code primitive is shown
  and the rest of the turn, inputs included, fits in one plan (a code step cannot read an
  earlier attempt's results); no fault is injected into it.
- **Messages** (HEELO, the Primitive's messages mode): to each step that reads this
  step's result, the field of the result where that step's gold values appear (found with
  ``deepdiff``'s search, :func:`message_for`), with a caveat when the value is one item of a
  list, occurs more than once or sits inside a longer text; to a code step, the whole result
  and what it computes. Written from the result in the input and the gold calls, never from
  the benchmark's answer.

- **Library composites** (``composites``, :mod:`heart.library`): a run of a turn's gold
  calls that a composite shown to the turn's first plan makes (same tools, argument names
  and literals) is planned, routed and called as one call of the composite (not in a turn
  with a code step, whose inputs index the gold calls).

Every answer is clipped to its role's length limits, so it validates against the schema
the role is served with (``schema_for_input`` of its own input).
"""

from __future__ import annotations

import json
import random
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from heart.environments.base import Task, ToolCall
from heart.families import CODE_CATEGORY, CODE_DESCRIPTION, CODE_PRIMITIVE
from heart.grounding import grounded, literals
from heart.library import Composite, compose_calls
from heart.primitives import BindingError, bind_arguments
from heart.roles import planner, primitive_messages, relevance, router, verifier
from heart.roles.registry import get_role
from heart.roles.common import (first_clause, is_clipped, lead_phrase, quoted_value, render_answer, role_input,
                                whole_parts)
from heart.runtime.base import Generation, GenerationRequest, Message, SamplingConfig
from heart.toolface import ToolSpec

Responder = Callable[[str, list[Message]], str]


class ScriptedBackend:
    """Answers each role call with ``responder(role, messages)``.

    Token counts are whitespace word counts: good enough for logic tests, and honest about
    being an approximation (no tokenizer is involved).
    """

    def __init__(self, responder: Responder, name: str = "scripted"):
        self.responder = responder
        self.name = name

    def generate(
        self, role: str, messages: list[Message], sampling: SamplingConfig | None = None
    ) -> Generation:
        start = time.perf_counter()
        text = self.responder(role, messages)
        return Generation(
            text=text,
            backend=self.name,
            prompt_tokens=sum(len(m["content"].split()) for m in messages),
            completion_tokens=len(text.split()),
            latency_s=time.perf_counter() - start,
        )

    def generate_batch(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        return [self.generate(r.role, r.messages, r.sampling) for r in requests]


def gold_teacher_name(fault_rate: float, student: str | None = None, student_rate: float = 0.0) -> str:
    """The gold teacher's backend name (it enters episode ids, so resume depends on it);
    ``student`` names the model that makes its natural faults (:class:`GoldTeacher`)."""
    name = "gold" if fault_rate == 0 else f"gold+faults{fault_rate:g}"
    return name + (f"+natural{student_rate:g}-{student}" if student and student_rate else "")


SCHEMA_FAULTS = ("wrong_argument", "wrong_tool", "missing_argument", "stale_reference")
"""Faults that fail binding or resolution: visible failures without side effects."""
SEMANTIC_FAULTS = ("semantic_value",)
"""Faults that bind and may execute cleanly, but with a plausible wrong value."""
FAULT_KINDS = SCHEMA_FAULTS + SEMANTIC_FAULTS
SEMANTIC_SHARE = 0.85
"""Share of injected faults that are semantic."""
NATURAL = "natural"
"""The fault of a step whose Primitive answer came from the student and differs from gold."""

_QUOTED = re.compile(r"""['"‘“]([^'"’”]{1,60})['"’”]""")
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}")


def _purpose(description: str, limit: int | None = None) -> str:
    """A short verb phrase from a tool description (its first sentence, lowercased); with
    ``limit``, its leading phrase within that many characters (:func:`lead_phrase`)."""
    text = " ".join(description.split("Tool description:")[-1].split())
    sentence = text.split(". ")[0].rstrip(".…").strip()
    if limit is not None:
        sentence = lead_phrase(sentence, limit)
    return sentence[:1].lower() + sentence[1:] if sentence else ""


def _code_objective(objective: str) -> str:
    """A code step's objective: the task's own sentence for its computation, as a whole clause."""
    return _sentence(first_clause(objective, STEP_OBJECTIVE_CHARS) or "Compute the value the answer needs")


def _sentence(text: str) -> str:
    """``text`` as a sentence: a capital first letter and a final period."""
    text = text.strip()
    return (text[:1].upper() + text[1:]).rstrip(".") + "." if text else ""


_REQUEST = re.compile(r"\?|\b(please|could you|can you|would you|i need|i want|i'd like|help me|let's)\b", re.I)


def _request_sentence(query: str) -> str:
    """The sentence of ``query`` that asks for something (a question, "please", "could
    you", …), else its first: an objective, not a greeting."""
    sentences = re.split(r"(?<=[.?!])\s", query)
    return next((s for s in sentences if _REQUEST.search(s)), sentences[0])


_value_text = quoted_value


def _in_order(arguments: dict[str, Any], order: Sequence[str]) -> dict[str, Any]:
    """``arguments`` in the parameter order of the tool's schema: constrained decoding
    writes properties in schema order, so the teacher does too."""
    rank = {name: i for i, name in enumerate(order)}
    return dict(sorted(arguments.items(), key=lambda kv: rank.get(kv[0], len(rank))))


TASK_CHARS = 60
OBJECTIVE_CHARS = 80
STEP_OBJECTIVE_CHARS = 64
PURPOSE_CHARS = 40
SUBGOAL_PURPOSE_CHARS = 24
"""A sub-goal's purpose phrase (the rest of :data:`heart.roles.planner.SUBGOAL_CHARS` holds its values)."""
"""A tool's purpose inside feedback: its description's first phrase (:func:`_purpose`)."""
MAX_CONSTRAINTS = 2
DETAILS_CHARS = 80
"""A failure's details quoted in Verifier feedback: its first clause, if that fits."""
"""The teacher writes every natural-language field as a complete, short sentence, shorter
than the schema allows (every token of an answer is one the student must learn to produce),
and from one template per field: a field whose wording is drawn at random is loss that can
never fall. Parts that do not fit are dropped whole (:func:`whole_parts`), never cut, so no
field holds a clause cut off with "…" (``heart datasets build`` refuses one)."""


def gold_how(calls: Sequence[ToolCall], request: str) -> str:
    """A compact "how" for a tool the turn's gold ``calls`` use: the parameters they fill
    from the request's own words, then those filled from context (earlier results, the
    conversation, or inferred)."""
    names = list(dict.fromkeys(n for c in calls for n in c.arguments))
    from_request = [n for n in names if any(grounded(c.arguments.get(n), request) for c in calls
                                            if c.arguments.get(n) is not None)]
    rest = [n for n in names if n not in from_request]
    parts = ([f"fills {', '.join(from_request)} from the request"] if from_request else []) \
        + ([f"{', '.join(rest)} from context"] if rest else [])
    return whole_parts(parts, lambda kept: "; ".join(kept) or "runs without arguments", relevance.HOW_CHARS)


CLARIFICATION_TEMPLATE = "Which {parameters} should I use for {tool}?"
CLARIFICATION_FALLBACK = "Your request leaves out a detail that {tool} needs: what is it?"


def clarification_question(said: str, answer: str, calls: Sequence[ToolCall]) -> str:
    """The gold Planner's question in a turn that withholds a parameter: the parameters of
    the answering turn's gold ``calls`` whose values the user's ``answer`` states and nothing
    ``said`` before does, for the first tool that has any ("Which lines should I use for
    tail?"); else the first tool with a value not said before, without naming the parameter
    (the value is derived, as "Zeta Corp" gives symbol ZETA). Within the Planner's
    clarification length, parameters kept or dropped whole."""
    named: dict[str, list[str]] = {}
    for call in calls:
        for name, value in call.arguments.items():
            if any(True for _ in literals(value)) and grounded(value, answer) and not grounded(value, said):
                named.setdefault(call.name, [])
                if name not in named[call.name]:
                    named[call.name].append(name)
    if named:
        tool, parameters = next(iter(named.items()))
        question = whole_parts(parameters, lambda kept: CLARIFICATION_TEMPLATE.format(
            parameters=" and ".join(kept), tool=tool) if kept else "", planner.CLARIFICATION_CHARS)
        if question:
            return question
    open_calls = [c for c in calls if not grounded(c.arguments, said)]
    tool = (open_calls or list(calls))[0].name
    return CLARIFICATION_FALLBACK.format(tool=tool)


def _found(result: Any, value: Any) -> tuple[list[list[Any]], bool]:
    """Where ``value`` appears in ``result``: the paths of the fields that equal it (deepdiff's
    search, a number matching its text too), else of the texts that contain it; and whether
    the match is exact."""
    from deepdiff import DeepSearch
    from deepdiff.path import parse_path

    if isinstance(value, list):  # a list argument (recipients): where its first value is
        value = next((v for v in value if isinstance(v, (str, int, float)) and not isinstance(v, bool)), None)
    if value is None or isinstance(value, (bool, dict)) or (isinstance(value, str) and not value.strip()):
        return [], False
    if result == value or (isinstance(result, str) and str(value) == result):
        return [[]], True
    for exact in (True, False):
        if not exact and (not isinstance(value, str) or len(value) < 3):
            break
        found = DeepSearch(result, value, verbose_level=1, strict_checking=False, match_string=exact)
        paths = sorted(found.get("matched_values", []), key=lambda p: (len(p), p))
        if not exact and not paths and isinstance(result, str) and value.lower() in result.lower():
            return [[]], False
        if paths:
            return [parse_path(p) for p in paths], exact
    return [], False


def _field(path: list[Any]) -> list[Any]:
    """``path`` up to its first key a message's field cannot spell (or hold: too deep, too long)."""
    spelled = []
    for key in path:
        field = ".".join(["result", *map(str, spelled), str(key)])
        if not primitive_messages.FIELD.fullmatch(field) or len(field) > primitive_messages.FIELD_CHARS:
            break
        spelled.append(key)
    return spelled


def message_for(result: Any, reads: dict[str, Any]) -> dict[str, str] | None:
    """A message to one dependent step: the field of ``result`` holding the values its gold
    call binds from this step (``reads``: parameter → gold value), with a caveat when the
    value sits in a list of several items, occurs more than once, or is part of a longer
    text. None when no value is in the result."""
    located = {}
    caveats, inside = [], []
    for name, value in reads.items():
        paths, exact = _found(result, value)
        if not paths:
            continue
        located[name] = _field(paths[0])
        if len(paths) > 1:
            caveats.append(f"{name} occurs {len(paths)} times, the first is meant")
        if not exact:
            inside.append(name)
    if inside:
        caveats.append(f"{', '.join(inside)} inside the text")
    if not located:
        return None
    paths = list(located.values())
    common = paths[0]
    for path in paths[1:]:  # several values: the field that holds them all
        shared = 0
        while shared < min(len(common), len(path)) and common[shared] == path[shared]:
            shared += 1
        common = common[:shared]
    if len(located) > 1:
        caveats.insert(0, "holds " + ", ".join(located))
    node, listed = result, None
    for key in common:  # the innermost list the field passes through, if it has several items
        if isinstance(node, list) and len(node) > 1:
            listed = (key, len(node))
        node = node[key] if isinstance(node, (dict, list)) else None
    if listed is not None:
        caveats.insert(0, f"item {listed[0]} of a list of {listed[1]}")
    return {"field": ".".join(["result", *map(str, common)]),
            "note": whole_parts(caveats, "; ".join, primitive_messages.NOTE_CHARS)}


def _same_value(shown: Any, value: Any) -> bool:
    """Whether a listed upstream field holds exactly the gold ``value`` (a number matching its
    text too); a list or object value is never one field."""
    if value is None or isinstance(value, (dict, list)) or isinstance(shown, (dict, list)):
        return False
    if isinstance(shown, bool) or isinstance(value, bool):
        return shown is value
    return shown == value or str(shown) == str(value)


def h_params(tool: str) -> dict[str, Any]:
    """The gold Router's h-params, derived from the tool: retries (3) for idempotent reads
    only — a write retried after a timeout could run twice —, priority "normal" (raised to
    "high" for a step whose result a later step reads), the default timeout."""
    return {"retry": 3 if router.is_read_only(tool) else 1, "priority": "normal", "timeout_s": router.DEFAULT_TIMEOUT_S}


@dataclass
class _TurnState:
    turn: int
    consumed: int = 0
    """Gold calls of the turn that ran and passed verification."""
    faults: int = 0
    plan_calls: list[ToolCall] = field(default_factory=list)
    """The gold calls the current plan covers, in order (step i ↔ plan_calls[i-1])."""
    pending: list[tuple[int, ToolCall]] = field(default_factory=list)
    """Dispatched (step, call) pairs whose Primitive has not answered yet."""
    primitive_faults: dict[int, str] = field(default_factory=dict)
    """Plan step → fault its Primitive will carry out."""
    injected: dict[int, str] = field(default_factory=dict)
    """Plan step → fault injected into it in the current attempt (Router or Primitive)."""
    plan_indices: list[int] = field(default_factory=list)
    """Index (in the turn's calls) of each call of the current plan (step i ↔ plan_indices[i-1])."""
    code_dropped: bool = False
    """The turn's computations are not planned (the Code primitive is not shown)."""
    composites: list | None = None
    """Library composites shown to the turn's first plan: the turn's calls use them."""


class GoldTeacher:
    """Answers each role from the gold calls of one task (build one per episode).

    The loop calls roles in a fixed order — Planner, Router, then per step a Primitive and
    (per-step verification) a Verifier — so the teacher follows along with a little state
    per turn: which gold calls already passed, which the current plan covers.
    """

    def __init__(self, task: Task, tools: Sequence[ToolSpec], fault_rate: float = 0.0,
                 max_faults_per_turn: int = 1, seed: int = 0, redo_passed: bool = False,
                 composites: Sequence[Composite] = (), student=None, student_rate: float = 0.0,
                 student_short: bool = False, student_name: str = "student"):
        if task.gold is None:
            raise ValueError(f"task {task.task_id} has no gold calls: the gold teacher cannot answer it")
        if not 0.0 <= fault_rate <= 1.0:
            raise ValueError(f"fault_rate must be within [0, 1], got {fault_rate}")
        if not 0.0 <= student_rate <= 1.0:
            raise ValueError(f"student_rate must be within [0, 1], got {student_rate}")
        self.student = student
        """A backend whose Primitive answers are the natural faults (None: injected faults only)."""
        self.student_rate = student_rate if student is not None else 0.0
        self.student_short = student_short
        """The student's Primitive was trained on the short system prompt (served with it)."""
        self.task = task
        self.specs = {s.name: s for s in tools}
        self.fault_rate = fault_rate
        self.max_faults_per_turn = max_faults_per_turn
        self.redo_passed = redo_passed
        """Re-plan the turn from its first call, as a Planner that ignores "do not redo SUCCESS
        steps" would (as many of the latest calls as the plan holds): what
        ``bench/replan_reuse.py`` measures the loop's ledger against. Off for collections."""
        self.composites = list(composites)
        """Library composite primitives (:mod:`heart.library`): a run of gold calls that a
        composite shown to the turn's first plan makes is planned as one call of it."""
        self.specs.update({c.name: c.spec for c in self.composites})
        self.rng = random.Random(f"{task.env}/{task.task_id}/{seed}")
        self.student_rng = random.Random(f"{task.env}/{task.task_id}/{seed}/student")
        """Its own stream: the injected faults stay those of a run without a student."""
        self.name = gold_teacher_name(fault_rate, student_name if student is not None else None, self.student_rate)
        self._turns: dict[int, _TurnState] = {}
        self._current: _TurnState | None = None
        self._context_strings = self._task_strings(task)
        self._withheld = set(task.meta.get("withheld_turns", []))
        """Turns whose request withholds a parameter that the next turn gives (BFCL miss_param)."""

    # -- backend protocol ------------------------------------------------------------------
    def generate(self, role: str, messages: list[Message], sampling: SamplingConfig | None = None) -> Generation:
        start = time.perf_counter()
        payload = role_input(messages)
        if role == relevance.ROLE and relevance.is_relevance_input(payload):
            answer, meta = self._relevance(payload)
        elif role == primitive_messages.ROLE and primitive_messages.is_messages_input(payload):
            answer, meta = self._messages(payload)
        else:
            answer, meta = {"planner": self._planner, "router": self._router,
                            "primitive": self._primitive, "verifier": self._verifier}[role](payload)
        # the very form the serving grammar (heart.runtime.hf) and the prefills use, so a
        # student learns exactly what it may produce (a natural fault's text is the student's own)
        text = answer if isinstance(answer, str) else render_answer(answer)
        return Generation(text=text, backend=self.name, meta=meta,
                          prompt_tokens=sum(len(m["content"].split()) for m in messages),
                          completion_tokens=len(text.split()), latency_s=time.perf_counter() - start)

    def generate_batch(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        return [self.generate(r.role, r.messages, r.sampling) for r in requests]

    # -- helpers ---------------------------------------------------------------------------
    @staticmethod
    def _task_strings(task: Task) -> dict[str, list[str]]:
        """String values of the task's context, for plausible semantic faults: every gold
        argument (by parameter name, and all together) and every quoted phrase of a query."""
        by_name: dict[str, list[str]] = {"*": []}
        for turn in task.gold or []:
            for call in turn:
                for name, value in call.arguments.items():
                    if isinstance(value, str) and value.strip():
                        by_name.setdefault(name, []).append(value)
                        by_name["*"].append(value)
        for query in task.turns:
            by_name["*"] += _QUOTED.findall(query)
        return {k: sorted(set(v)) for k, v in by_name.items()}

    def _args_parts(self, arguments: dict[str, Any], text: str, references: dict[str, str] | None = None) -> list[str]:
        """"k=v" for the grounded values only; references named by their step."""
        parts = []
        for name, value in arguments.items():
            if references and name in references:
                parts.append(f"{name} from {references[name].split('.')[0][1:].replace('_', ' ')}")
            elif not isinstance(value, (dict, list)) and grounded(value, text) and value is not None:
                parts.append(f"{name}={_value_text(value)}")
        return parts

    @staticmethod
    def _step_objective(tool: str, shown: str, parts: list[str]) -> str:
        """A plan step's objective: the tool's purpose as the Planner's input shows it (its
        listed description, else its name in words), with as many whole "k=v" parts of the
        request as fit in the objective's length."""
        purpose = shown or tool.replace("_", " ")
        return whole_parts(parts, lambda kept: _sentence(purpose + (f" ({', '.join(kept)})" if kept else "")),
                           STEP_OBJECTIVE_CHARS)

    def _description(self, tool: str) -> str:
        """The tool's own description (its documentation, not an answer): objectives and
        requests take their purpose phrase from it, also when the Planner's input omits it
        as a restatement of the name."""
        if tool == CODE_PRIMITIVE:
            return CODE_DESCRIPTION
        spec = self.specs.get(tool)
        return spec.description if spec else ""

    def _calls(self, state: _TurnState) -> list[ToolCall]:
        """The turn's calls in order: its gold calls, then (unless dropped) one Code-primitive
        call per computation, its arguments the computation's expression, objective and inputs
        (variable → index of the gold call it reads)."""
        calls = list(self.task.gold[state.turn])
        computations = (self.task.computations or [[]] * len(self.task.turns))[state.turn]
        if state.composites and not computations:  # (a computation indexes the gold calls)
            calls = compose_calls(calls, state.composites)
        if not state.code_dropped:
            calls += [ToolCall(CODE_PRIMITIVE, {"expression": c.expression, "objective": c.objective,
                                                "inputs": dict(c.inputs)})
                      for c in (self.task.computations or [[]] * len(self.task.turns))[state.turn]]
        return calls

    def _maybe_fault(self, state: _TurnState) -> str | None:
        if state.faults >= self.max_faults_per_turn or self.rng.random() >= self.fault_rate:
            return None
        state.faults += 1
        if self.rng.random() < SEMANTIC_SHARE:
            return "semantic_value"
        return self.rng.choice(SCHEMA_FAULTS)

    # -- Planner ---------------------------------------------------------------------------
    def _planner(self, p: dict[str, Any]) -> tuple[dict, dict]:
        """The plan for the turn of ``p``'s query. In a turn whose request withholds a
        parameter (``Task.meta["withheld_turns"]``, BFCL miss_param): INSUFFICIENT with a
        question (:func:`clarification_question`) until the clarifications hold the user's
        answer, which is the next turn of the task; then the plan of that turn's gold calls.
        The intent of the question is the one the plan will have."""
        turn = self.task.turns.index(p["user_query"])
        if turn not in self._withheld:
            return self._plan(p, turn)
        answer_turn = turn + 1
        answered = any(c.get("answer") == self.task.turns[answer_turn] for c in p.get("clarifications") or [])
        if not answered and not p.get("may_ask", True):
            return self._plan(p, turn)  # asking is spent: plan what the request says (nothing)
        plan, meta = self._plan(p, answer_turn)
        if answered:
            return plan, meta
        question = clarification_question(" ".join(self.task.turns[:answer_turn]), self.task.turns[answer_turn],
                                          self.task.gold[answer_turn])
        return ({"status": "INSUFFICIENT", "intent": plan["intent"], "clarification": question,
                 "replanned": plan["replanned"]}, {"withheld_turn": turn})

    def _plan(self, p: dict[str, Any], turn: int) -> tuple[dict, dict]:
        """A SUFFICIENT plan of ``turn``'s gold calls (what is left of them), for input ``p``."""
        state = self._current = self._turns.setdefault(turn, _TurnState(turn))
        shown = {name: {"name": name, "category": category, "description": description}
                 for category, tools in p["available_tools"].items() for name, description in tools.items()}
        max_steps = p.get("max_steps", planner.DEFAULT_MAX_STEPS)
        if CODE_PRIMITIVE not in shown or any(len(c.inputs) >= max_steps
                                              for c in (self.task.computations or {turn: []})[turn]):
            state.code_dropped = True
        if state.composites is None:  # fixed per turn: the calls' indices must stay valid
            state.composites = [c for c in self.composites if c.name in shown]
        calls = self._calls(state)
        remaining = calls[state.consumed:]
        missing = sorted({c.name for c in remaining if c.name not in shown})
        meta: dict[str, Any] = {}
        visible = list(range(state.consumed, len(calls)))
        if missing:  # never plan with a tool the Planner was not shown: plan the calls before it
            visible = visible[:next(i for i, c in enumerate(remaining) if c.name not in shown)]
            meta["retrieval_miss"] = missing
        # a plan longer than the input allows is cut; the Verifier says what is left
        take = visible[:max_steps]
        redo = list(range(state.consumed)) if self.redo_passed and p.get("feedback") else []
        while True:  # a code step reads its inputs in its own plan: earlier calls it reads come again
            needed = {j for i in take if calls[i].name == CODE_PRIMITIVE
                      for j in calls[i].arguments["inputs"].values() if j < state.consumed}
            again = sorted(needed | set(redo))
            if len(again) + len(take) <= max_steps:
                break
            oldest = next((j for j in redo if j not in needed), None)
            if oldest is not None:  # a whole-turn re-plan holds its latest calls
                redo.remove(oldest)
                continue
            if not take or calls[take[-1]].name != CODE_PRIMITIVE:
                break
            take = take[:-1]  # the code step waits for a later plan (the Verifier names it as left)
        state.plan_indices = again + take  # (the loop keeps passed calls: they do not run again)
        state.pending, state.primitive_faults, state.injected = [], {}, {}  # a new attempt
        state.plan_calls = [calls[i] for i in state.plan_indices]
        text = json.dumps(p, ensure_ascii=False)
        query = " ".join(p["user_query"].split())
        plan = []
        for i, call in enumerate(state.plan_calls, 1):
            if call.name == CODE_PRIMITIVE:
                plan.append({"step": i, "family": "code", "tool_category": CODE_CATEGORY, "tool_hint": CODE_PRIMITIVE,
                             "objective": _code_objective(call.arguments["objective"]),
                             "dependencies": sorted({self._plan_step(state, j) for j in call.arguments["inputs"].values()})})
                continue
            tool = shown[call.name]
            plan.append({"step": i, "tool_category": tool.get("category", ""), "tool_hint": call.name,
                         "objective": self._step_objective(call.name, tool["description"],
                                                           self._args_parts(call.arguments, text)),
                         "dependencies": [i - 1] if i > 1 else []})
        constraints = []
        for call in state.plan_calls:
            if call.name == CODE_PRIMITIVE:
                continue
            for name, value in call.arguments.items():
                if isinstance(value, (str, int, float)) and not isinstance(value, bool) \
                        and str(value).strip() and str(value) in query \
                        and len(f"{name}: {value}") <= planner.CONSTRAINT_CHARS \
                        and not is_clipped(f"{name}: {value}"):  # whole, or not at all ("product: A" reads cut off)
                    constraints.append(f"{name}: {value}")
        # the user's task (what is left of it), also when no shown tool serves it: the loop
        # then searches for more tools with this sentence; a shown tool's purpose is the one
        # the Planner's input lists, so the student can read it there
        purposes = list(dict.fromkeys(
            (shown[c.name]["description"] if c.name in shown else _purpose(self._description(c.name), PURPOSE_CHARS))
            or c.name.replace("_", " ") for c in remaining))
        task = whole_parts(purposes, lambda kept: _sentence(", then ".join(kept)), TASK_CHARS) \
            or "Answer without tools."
        intent = {
            "task": task,
            "objective": first_clause(_request_sentence(query), OBJECTIVE_CHARS) or task,
            "tool_categories": sorted({s["tool_category"] for s in plan}),
            "constraints": list(dict.fromkeys(constraints))[:MAX_CONSTRAINTS],
        }
        answer = {"status": "SUFFICIENT", "intent": intent, "plan": plan, "replanned": bool(p.get("feedback"))}
        if planner.asks_for_subgoals(p):  # the sub-goals form: what was asked, one per step, before the plan
            answer = {"status": "SUFFICIENT", "intent": intent,
                      "subgoals": [self._subgoal(call, state.plan_calls, shown, text) for call in state.plan_calls],
                      "plan": plan, "replanned": answer["replanned"]}
        return answer, meta

    def _subgoal(self, call: ToolCall, calls: list[ToolCall], shown: dict[str, dict[str, str]], text: str) -> str:
        """A sub-goal of the request, for one gold call of ``calls`` (the plan's): the tool's
        purpose in a few words and the call's values the request states ("Get the weather:
        city='Paris'"), the values that tell it from the plan's other calls of the same tool
        first, whole parts only; a code step's own objective."""
        if call.name == CODE_PRIMITIVE:
            return first_clause(call.arguments["objective"], planner.SUBGOAL_CHARS) or "Compute the value"
        parts = self._args_parts(call.arguments, text)
        shared = [part for part in parts
                  if all(part in self._args_parts(c.arguments, text) for c in calls if c.name == call.name)]
        parts = [part for part in parts if part not in shared] + shared
        purpose = lead_phrase(shown[call.name]["description"] or call.name.replace("_", " "), SUBGOAL_PURPOSE_CHARS)
        return whole_parts(parts, lambda kept: purpose + (": " + ", ".join(kept) if kept else ""),
                           planner.SUBGOAL_CHARS)

    @staticmethod
    def _plan_step(state: _TurnState, index: int) -> int:
        """The current plan's step number of the turn's call ``index``."""
        return state.plan_indices.index(index) + 1

    # -- Router ----------------------------------------------------------------------------
    def _router(self, p: dict[str, Any]) -> tuple[dict, dict]:
        if router.is_step_input(p):
            return self._router_step(p)
        state = self._current
        state.pending, state.primitive_faults, state.injected = [], {}, {}
        text = json.dumps(p, ensure_ascii=False)
        meta: dict[str, Any] = {}
        dispatch = []
        for i, call in enumerate(state.plan_calls, 1):
            if call.name == CODE_PRIMITIVE:  # its inputs: the results of the calls it reads
                state.pending.append((i, call))
                objective = call.arguments["objective"]
                bindings = self._code_bindings(state, call)
                dispatch.append({
                    "step": i, "target_tool": CODE_PRIMITIVE,
                    "invocation_request": router.invocation_request(CODE_PRIMITIVE, bindings,
                                                                    _code_objective(objective)),
                    "resolved_bindings": bindings, "h_params": h_params(CODE_PRIMITIVE)})
                continue
            params = p["tools"].get(call.name, {})
            call = ToolCall(call.name, _in_order(call.arguments, params.get("required", []) + params.get("optional", [])))
            bindings: dict[str, Any] = {}
            for name, value in call.arguments.items():
                follows = i > 1 and state.plan_indices[i - 2] == state.plan_indices[i - 1] - 1
                if grounded(value, text) or not follows:
                    bindings[name] = value
                else:  # produced upstream: the Primitive takes it from the previous step's result
                    bindings[name] = f"$step_{i - 1}.result"
            meta = self._router_fault(state, i, bindings) or meta
            state.pending.append((i, call))
            dispatch.append({
                "step": i, "target_tool": call.name,
                "invocation_request": router.invocation_request(call.name, bindings),
                "resolved_bindings": bindings,
                "h_params": h_params(call.name),
            })
        # a step whose result a later step reads ($step_j) goes first among those ready
        read = {ref.split(".")[0] for d in dispatch for ref in d["resolved_bindings"].values()
                if isinstance(ref, str) and ref.startswith("$step_")}
        for d in dispatch:
            if f"$step_{d['step']}" in read:
                d["h_params"]["priority"] = "high"
        return {"status": "READY", "dispatch": dispatch}, meta

    def _code_bindings(self, state: _TurnState, call: ToolCall) -> dict[str, str]:
        """A code step's bindings: each input of its computation, the whole result it reads."""
        return {name: f"$step_{self._plan_step(state, j)}.result" for name, j in call.arguments["inputs"].items()}

    def _router_fault(self, state: _TurnState, step: int, bindings: dict[str, Any]) -> dict[str, Any] | None:
        """Maybe inject a fault into ``step``: a stale reference into its bindings (the event's
        meta, returned), or a fault its Primitive will carry out."""
        fault = self._maybe_fault(state)
        if fault == "stale_reference" and bindings:
            name = self.rng.choice(list(bindings))
            bindings[name] = f"$step_{len(state.plan_calls) + 1}.result.{name}"  # a step that never runs
            state.injected[step] = fault
            return {"injected_fault": fault, "fault_step": step}
        if fault:
            state.primitive_faults[step] = "wrong_argument" if fault == "stale_reference" else fault
        return None

    def _router_step(self, p: dict[str, Any]) -> tuple[dict, dict]:
        """Step mode (β_k ← ROUTER(π_k, C)): one step's bindings. A value the query, the
        clarifications, the conversation or earlier attempts state is bound literally; one an
        upstream step's listed fields hold, as the reference to that step and field (the
        first field equal to it); one inside a longer text of an upstream result (a listed
        field or its summary), or a list or object gathered from past the fields shown, as
        that step's whole result (the Primitive takes it out); a scalar otherwise as is (the
        build's ``router_ungrounded`` filter drops the row)."""
        state = self._current
        step = p["plan"][0]
        i = step["step"]
        call = state.plan_calls[i - 1]
        if call.name == CODE_PRIMITIVE:
            state.pending.append((i, call))
            answer = {"step": i, "target_tool": CODE_PRIMITIVE, "resolved_bindings": self._code_bindings(state, call),
                      "h_params": h_params(CODE_PRIMITIVE)}
            return {"status": "READY", "dispatch": [answer]}, {}
        params = p["tools"].get(call.name, {})
        call = ToolCall(call.name, _in_order(call.arguments, params.get("required", []) + params.get("optional", [])))
        stated = json.dumps({k: v for k, v in p.items() if k not in ("upstream", "plan", "tools")}, ensure_ascii=False)
        upstream = p["upstream"]
        bindings: dict[str, Any] = {}
        for name, value in call.arguments.items():
            if grounded(value, stated) or not upstream:
                bindings[name] = value
                continue
            exact = next((f"$step_{u['step']}.{path}" for u in upstream for path, shown in u["fields"].items()
                          if _same_value(shown, value)), None)
            inside = next((f"$step_{u['step']}.result" for u in upstream
                           if grounded(value, json.dumps(u["fields"], ensure_ascii=False) + u["summary"])), None)
            # a list or object no listed field holds whole: taken from the last upstream result
            # by the Primitive (its items lie past the fields shown); a scalar neither stated nor
            # shown (derived from a result, or a case the text does not spell): bound as is, so
            # the build's router_ungrounded filter drops the row rather than teach a reference
            # to a result that does not hold it
            gathered = f"$step_{upstream[-1]['step']}.result" if isinstance(value, (list, dict)) else None
            bindings[name] = exact or inside or gathered or value
        meta = self._router_fault(state, i, bindings) or {}
        state.pending.append((i, call))
        answer = {"step": i, "target_tool": call.name, "resolved_bindings": bindings, "h_params": h_params(call.name)}
        return {"status": "READY", "dispatch": [answer]}, meta

    # -- Primitive -------------------------------------------------------------------------
    def _relevance(self, p: dict[str, Any]) -> tuple[dict, dict]:
        """Gold relevance: the tool applies when the turn's gold calls use it; ``how`` names
        the parameters its gold calls fill, and whether from the request or from earlier
        results (the gold calls and the request, never the checker's answer)."""
        if p["request"] not in self.task.turns:
            raise ValueError(f"relevance request is not a turn of task {self.task.task_id}: {p['request'][:80]!r}")
        turn = self.task.turns.index(p["request"])
        if turn in self._withheld:  # the tools the turn runs once the user gives what it withholds
            turn += 1
        name = p["tool"]["name"]
        calls = [c for c in self.task.gold[turn] if c.name == name]
        if not calls:
            return {"applies": False, "how": ""}, {}
        return {"applies": True, "how": gold_how(calls, p["request"])}, {}

    def _messages(self, p: dict[str, Any]) -> tuple[dict, dict]:
        """Messages mode: for each dependent step, the field of this result where its gold
        call's values for the bindings that read this step appear (:func:`message_for`);
        to a code step, the whole result and what it computes."""
        state = self._current
        messages = []
        for dep in p["dependents"]:
            call = state.plan_calls[dep["step"] - 1] if dep["step"] <= len(state.plan_calls) else None
            if call is None:
                continue
            if call.name == CODE_PRIMITIVE:
                note = whole_parts([call.arguments["objective"]], lambda kept: "needs a computation"
                                   + (f": {kept[0]}" if kept else ""), primitive_messages.NOTE_CHARS)
                messages.append({"to": dep["step"], "field": "result", "note": note})
                continue
            message = message_for(p["result"], {r: call.arguments[r] for r in dep["reads"] if r in call.arguments})
            if message is not None:
                messages.append({"to": dep["step"], **message})
        return {"tool": p["tool"], "messages": messages}, {}

    def _primitive(self, p: dict[str, Any]) -> tuple[dict, dict]:
        state = self._current
        tool = p["tool"]["name"]
        step, call = state.pending.pop(next(i for i, (_, c) in enumerate(state.pending) if c.name == tool))
        if tool == CODE_PRIMITIVE:
            return {"tool": tool, "family": "code", "expression": call.arguments["expression"]}, {}
        arguments = _in_order(call.arguments, list(p["tool"]["parameters"].get("properties", {})))
        fault = state.primitive_faults.pop(step, None)
        if fault is None and state.faults < self.max_faults_per_turn and self.student_rng.random() < self.student_rate:
            return self._student_primitive(state, step, p, {"tool": tool, "arguments": arguments})
        if fault is None:
            return {"tool": tool, "arguments": arguments}, {}
        if fault == "semantic_value":
            answer, meta = self._semantic_fault(tool, arguments, p)
        else:
            answer, meta = self._schema_fault(fault, tool, arguments, p["tool"]["parameters"])
        state.injected[step] = meta["injected_fault"]
        return answer, meta

    def _student_primitive(self, state: _TurnState, step: int, p: dict[str, Any],
                           gold: dict[str, Any]) -> tuple[dict | str, dict]:
        """The student's answer to this very Primitive input, as the loop would ask it (its
        prompt, the input's schema as the decoding constraint): the gold answer when the two
        agree, else the student's text, executed as it is (a natural fault)."""
        mode = get_role("primitive").mode_for(p)
        messages = mode.build_messages(p, system_prompt=mode.system_prompt(short=self.student_short))
        sampling = SamplingConfig(guided_json=json.dumps(mode.schema_for_input(p)))
        text = self.student.generate("primitive", messages, sampling).text
        parsed = mode.parse_for_input(text, p)
        answer = parsed.value.model_dump(mode="json", exclude_none=True) if parsed.ok else None
        if answer is not None and answer.get("tool") == gold["tool"] and answer.get("status") != "UNRESOLVABLE" \
                and self._bound(gold["tool"], answer.get("arguments") or {}) == self._bound(gold["tool"], gold["arguments"]):
            return gold, {"student": "agreed"}  # (the same call once bound, e.g. "5" for 5)
        state.faults += 1
        state.injected[step] = NATURAL
        return text, {"injected_fault": NATURAL, "student": "differed"}

    def _semantic_fault(self, tool: str, arguments: dict, p: dict) -> tuple[dict, dict]:
        """A plausible other value for one literally bound argument (same task's context);
        falls back to a schema fault when no argument has a plausible alternative."""
        props = p["tool"]["parameters"].get("properties", {})
        options = []
        for name, value in arguments.items():
            if p["resolved_bindings"].get(name) != value or isinstance(value, bool):
                continue  # the Verifier must see what was asked: only literal bindings
            spec = props.get(name, {})
            if "enum" in spec:
                others = [o for o in spec["enum"] if o != value]
            elif isinstance(value, str) and _DATE.match(value):
                others = [value[:8] + f"{(int(value[8:10]) % 28) + 1:02d}" + value[10:]]
            elif isinstance(value, str):
                others = [s for s in self._context_strings.get(name, []) + self._context_strings["*"]
                          if s != value and s.strip()]
            elif isinstance(value, (int, float)):
                others = [value + 1 if isinstance(value, int) else round(value * 2 + 1, 2)]
            else:
                others = []
            if others:
                options.append((name, others))
        if not options:
            return self._schema_fault("wrong_argument", tool, arguments, p["tool"]["parameters"])
        name, others = self.rng.choice(options)
        wrong = self.rng.choice(others)
        return ({"tool": tool, "arguments": {**arguments, name: wrong}},
                {"injected_fault": "semantic_value", "fault_argument": name})

    def _schema_fault(self, fault: str, tool: str, arguments: dict, schema: dict) -> tuple[dict, dict]:
        """Break the answer so that binding fails: real failures, and no side effects."""
        props = schema.get("properties", {})
        required = [r for r in schema.get("required", []) if r in arguments]
        if fault == "wrong_tool":
            other = self.rng.choice(sorted(n for n in self.specs if n != tool) or [tool + "_v2"])
            return {"tool": other, "arguments": arguments}, {"injected_fault": fault}
        if fault == "missing_argument" and required:
            arguments.pop(self.rng.choice(required))
            return {"tool": tool, "arguments": arguments}, {"injected_fault": fault}
        name = self.rng.choice(sorted(props)) if props else "unexpected_argument"
        spec = props.get(name, {})
        if "enum" in spec:
            arguments[name] = "not-one-of-the-options"
        elif spec.get("type") in ("integer", "number", "boolean"):
            arguments[name] = "an unreadable value"
        elif name in props:
            arguments[name] = {"value": arguments.get(name)}  # an object where a scalar is due
        else:
            arguments[name] = 1  # a parameter the tool does not have
        return {"tool": tool, "arguments": arguments}, {"injected_fault": "wrong_argument"}

    # -- Verifier --------------------------------------------------------------------------
    def _judge(self, entry: dict[str, Any]) -> tuple[dict[str, str], str, str]:
        """(criteria, feedback, fault kind) for one step entry of the Verifier's input:
        FAIL when the step deviates from its gold call, criteria and feedback from the input."""
        state = self._current
        step, tool, envelope = entry["step"], entry["tool"], entry["envelope"]
        fault = state.injected.get(step)
        criteria = dict.fromkeys(verifier.CRITERIA, "pass")
        status = envelope["status"]
        if fault is None and status in ("SUCCESS", "FAILURE") and (
                status == "SUCCESS" or envelope.get("failure_type") == "RUNTIME_ERROR"):
            # the gold call ran; a RUNTIME_ERROR of a gold call is the benchmark's own answer
            return criteria, "", "none"
        asked, used = entry["resolved_bindings"], envelope.get("bound_arguments", {})
        changed = [k for k in asked if k in used and asked[k] != used[k] and not str(asked[k]).startswith("$step_")]
        reasons = []
        if fault == NATURAL:
            # the student's own answer, judged by what the tool was really called with
            # (an answer that never reached the tool, e.g. unparseable, differs in no argument)
            differs = self._natural_differences(state, step, tool, used, asked) if used or status == "SUCCESS" else []
            if status == "SUCCESS" and not differs:
                return criteria, "", "none"  # an equivalent answer (e.g. "5" bound as 5): it passed
            changed = [k for k, _ in differs]
            if differs:
                criteria.update(argument_consistency="fail", constraint_satisfaction="fail", task_completion="fail")
                reasons.append(differs[0][1])
        elif changed:
            k = changed[0]
            criteria.update(argument_consistency="fail", constraint_satisfaction="fail", task_completion="fail")
            reasons.append(f"{k} was {_value_text(used[k])} but the request asked for {_value_text(asked[k])}")
        if status != "SUCCESS":
            criteria.update(execution_validity="fail", task_completion="fail")
            kind = envelope.get("failure_type") or status
            if kind in ("SCHEMA_RESOLUTION", "CONSTRAINT_VIOLATION"):
                criteria["argument_consistency"] = "fail"
            if kind == "CONSTRAINT_VIOLATION":
                criteria["constraint_satisfaction"] = "fail"
            # the criteria say which checks failed; the feedback says what happened
            details = first_clause(str(envelope.get("details", "")).split(". ")[0], DETAILS_CHARS).rstrip(".")
            reasons.append(f"failed with {kind}" + (f": {details}" if details and not is_clipped(details) else ""))
        advice = (f"call {tool} with {changed[0]} as {'the request asks' if fault == NATURAL else 'asked'}"
                  if changed else f"call {tool} with arguments its schema accepts")
        head, tail = f"Step {step} ({tool}): ", f". Re-plan: {advice}."
        # a reason quoting a long value says which argument differs instead (whole, not cut)
        reasons = [r if len(head + r + tail) <= verifier.FEEDBACK_CHARS else
                   (f"{changed[0]} differs from what the request asked" if changed and r.startswith(changed[0])
                    else f"failed with {kind}") for r in reasons]
        feedback = whole_parts(reasons, lambda kept: head + "; ".join(kept) + tail, verifier.FEEDBACK_CHARS)
        return criteria, feedback, fault or "unlabelled"

    def _bound(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any] | None:
        """``arguments`` as the Primitive binds them to ``tool``'s schema (the default
        middleware's corrections made); None when they do not bind."""
        try:
            return bind_arguments(dict(arguments), self.specs[tool].parameters) if tool in self.specs else None
        except BindingError:
            return None

    def _natural_differences(self, state: _TurnState, step: int, tool: str, used: dict[str, Any],
                             asked: dict[str, Any]) -> list[tuple[str, str]]:
        """(argument, reason) for each way the arguments ``tool`` was called with depart from
        the step's gold call, each reason said from what the Verifier's input shows: a value
        the Router bound literally is quoted as asked; any other only as not matching."""
        call = state.plan_calls[step - 1]
        if tool != call.name:
            return [("tool", f"it called {tool}, not the tool the plan's step names")]
        props = self.specs[call.name].parameters.get("properties", {}) if call.name in self.specs else {}
        gold = self._bound(call.name, call.arguments) or call.arguments
        differs = []
        for name, value in gold.items():
            if name not in used:
                differs.append((name, f"{name} was left out"))
            elif used[name] != value:
                literal = name in asked and asked[name] == value
                differs.append((name, f"{name} was {_value_text(used[name])} but the request asked for "
                                      f"{_value_text(value)}" if literal else
                                f"{name} was {_value_text(used[name])}, which the request does not give"))
        for name, value in used.items():
            if name not in gold and value != props.get(name, {}).get("default", object()):
                differs.append((name, f"{name} was given, which the request does not ask for"))
        # a reason whose quoted value reads as a cut clause (e.g. a placeholder "...") says less, whole
        return [(name, reason if not is_clipped(reason) else f"{name} differs from what the request asked")
                for name, reason in differs]

    def _verifier(self, p: dict[str, Any]) -> tuple[dict, dict]:
        state = self._current
        steps = p["steps"]
        judged = [(entry, *self._judge(entry)) for entry in steps]
        failing = next(((e, c, f, k) for e, c, f, k in judged if f), None)
        passed_prefix = 0
        for _, _, feedback, _ in judged:
            if feedback:
                break
            passed_prefix += 1
        if passed_prefix:  # steps run in plan order: those before a passed one passed (or were kept)
            state.consumed = max(state.consumed, state.plan_indices[steps[passed_prefix - 1]["step"] - 1] + 1)
        left = self._calls(state)[state.consumed:]
        last = bool(steps) and max(e["step"] for e in steps) == len(state.plan_calls)
        if failing is None and last and left:
            # every planned call ran as asked, yet the turn's request needs more (a tool that
            # was not shown, or a plan cut at max_steps): task_completion fails, and the
            # feedback names what is left by the tools' purposes, which the re-plan searches for
            entry = max(steps, key=lambda e: e["step"])
            todo = list(dict.fromkeys(_purpose(self._description(c.name), PURPOSE_CHARS) or c.name for c in left))
            head = f"Step {entry['step']} ({entry['tool']}) ran as asked; the request is not done."
            feedback = whole_parts(todo, lambda kept: head + (f" Still to do: {'; '.join(kept)}." if kept else ""),
                                   verifier.FEEDBACK_CHARS)
            criteria = {**dict.fromkeys(verifier.CRITERIA, "pass"), "task_completion": "fail"}
            return (verifier.answer(entry["step"], criteria, feedback),
                    {"fault_kind": "incomplete"})
        if failing is None:
            step = steps[-1]["step"] if steps else 0
            return verifier.answer(step, dict.fromkeys(verifier.CRITERIA, "pass")), {"fault_kind": "none"}
        entry, criteria, feedback, kind = failing
        return (verifier.answer(entry["step"], criteria, feedback),
                {"fault_kind": kind})
