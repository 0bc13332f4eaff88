"""The gold teacher as a backend: one per episode, following the loop role call by role call
and answering each from the task's gold calls (the roles' answers: :mod:`.planner`,
:mod:`.router`, :mod:`.primitive`, :mod:`.verifier`; the faults: :mod:`.faults`)."""

from __future__ import annotations

import random
import time
from typing import Any, Sequence

from heart.environments.base import Task, ToolCall
from heart.families import CODE_DESCRIPTION, CODE_PRIMITIVE
from heart.grounding import grounded
from heart.library import Composite, compose_calls
from heart.roles import primitive_messages, relevance
from heart.roles.common import render_answer, role_input, whole_parts
from heart.runtime.base import Generation, GenerationRequest, Message, SamplingConfig
from heart.toolface import ToolSpec
from heart_distill.data.gold_teacher.common import QUOTED, STEP_OBJECTIVE_CHARS, TurnState, as_sentence, value_text
from heart_distill.data.gold_teacher.faults import FaultAnswers
from heart_distill.data.gold_teacher.planner import PlannerAnswers
from heart_distill.data.gold_teacher.primitive import PrimitiveAnswers
from heart_distill.data.gold_teacher.router import RouterAnswers
from heart_distill.data.gold_teacher.verifier import VerifierAnswers


def gold_teacher_name(fault_rate: float, student: str | None = None, student_rate: float = 0.0) -> str:
    """The gold teacher's backend name (it enters episode ids, so resume depends on it);
    ``student`` names the model that makes its natural faults (:class:`GoldTeacher`)."""
    name = "gold" if fault_rate == 0 else f"gold+faults{fault_rate:g}"
    return name + (f"+natural{student_rate:g}-{student}" if student and student_rate else "")


class GoldTeacher(PlannerAnswers, RouterAnswers, PrimitiveAnswers, VerifierAnswers, FaultAnswers):
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
        self._turns: dict[int, TurnState] = {}
        self._current: TurnState | None = None
        self._context_strings = self._task_strings(task)
        self._withheld = set(task.meta.get("withheld_turns", []))
        """Turns whose request withholds a parameter that the next turn gives (BFCL miss_param)."""

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
            by_name["*"] += QUOTED.findall(query)
        return {k: sorted(set(v)) for k, v in by_name.items()}

    def _args_parts(self, arguments: dict[str, Any], text: str, references: dict[str, str] | None = None) -> list[str]:
        """"k=v" for the grounded values only; references named by their step."""
        parts = []
        for name, value in arguments.items():
            if references and name in references:
                parts.append(f"{name} from {references[name].split('.')[0][1:].replace('_', ' ')}")
            elif not isinstance(value, (dict, list)) and grounded(value, text) and value is not None:
                parts.append(f"{name}={value_text(value)}")
        return parts

    @staticmethod
    def _step_objective(tool: str, shown: str, parts: list[str]) -> str:
        """A plan step's objective: the tool's purpose as the Planner's input shows it (its
        listed description, else its name in words), with as many whole "k=v" parts of the
        request as fit in the objective's length."""
        purpose = shown or tool.replace("_", " ")
        return whole_parts(parts, lambda kept: as_sentence(purpose + (f" ({', '.join(kept)})" if kept else "")),
                           STEP_OBJECTIVE_CHARS)

    def _description(self, tool: str) -> str:
        """The tool's own description (its documentation, not an answer): objectives and
        requests take their purpose phrase from it, also when the Planner's input omits it
        as a restatement of the name."""
        if tool == CODE_PRIMITIVE:
            return CODE_DESCRIPTION
        spec = self.specs.get(tool)
        return spec.description if spec else ""

    def _calls(self, state: TurnState) -> list[ToolCall]:
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
