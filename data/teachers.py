"""Teachers: backends that answer every role well enough to learn from.

- :class:`GoldTeacher` answers from the task's gold calls (BFCL ground truth, AgentDojo
  ``ground_truth()``), with optional fault injection so the traces hold real failures,
  real Verifier FAILs and real recoveries;
- ``openai:<url>#<model>`` — any chat-completions endpoint (:mod:`heart.runtime.openai_compat`);
- ``hf:<model>`` — any transformers model by id or folder (:mod:`heart.runtime.hf`).

A teacher is a backend like any other, so collection runs the very loop inference runs.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass
from typing import Any, Sequence

from heart.environments.base import Task, ToolCall
from heart.roles.common import role_input
from heart.runtime.base import Generation, GenerationRequest, Message, SamplingConfig
from heart.toolface import ToolSpec

def gold_teacher_name(fault_rate: float) -> str:
    """The gold teacher's backend name (it enters episode ids, so resume depends on it)."""
    return "gold" if fault_rate == 0 else f"gold+faults{fault_rate:g}"


FAULT_KINDS = ("wrong_argument", "wrong_tool", "missing_argument", "stale_reference")


def _args_text(arguments: dict[str, Any]) -> str:
    if not arguments:
        return "no arguments"
    return ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in arguments.items())


def _purpose(spec: ToolSpec | None) -> str:
    """A short verb phrase from the tool's description (its first sentence, lowercased)."""
    if spec is None:
        return ""
    text = spec.description.split("Tool description:")[-1].strip()
    sentence = text.split(". ")[0].rstrip(".").strip()
    return sentence[:1].lower() + sentence[1:] if sentence else ""


# Natural-language fields are written from several templates so the student learns the
# content, not one phrasing.
OBJECTIVES = (
    "{Purpose} using {tool} ({args}).",
    "Call {tool} with {args}.",
    "Use {tool} to {purpose}.",
    "{Purpose}: {tool}({args}).",
)
REQUESTS = (
    "Run {tool} with {args}.",
    "Please {purpose} — arguments: {args}.",
    "{Purpose}. Use exactly: {args}.",
    "Invoke {tool} so that it will {purpose} ({args}).",
)
INTENTS = ("Carry out the user's request: {query}", "The user wants: {query}", "Goal — {query}")
PASS_OPENERS = ("Done.", "All steps succeeded.", "Completed your request.", "Here is what I did.")


@dataclass
class _TurnState:
    turn: int
    faults: int = 0
    plan_calls: list[ToolCall] | None = None
    """The gold calls the current plan covers, in order."""
    pending: list[tuple[int, ToolCall]] | None = None
    """Dispatched (step, call) pairs whose Primitive has not answered yet."""


class GoldTeacher:
    """Answers each role from the gold calls of one task (build one per episode).

    The loop calls roles in a fixed order — Planner, Router, one Primitive per step until
    a step fails, Verifier — so the teacher follows along with a little state per turn.
    """

    def __init__(self, task: Task, tools: Sequence[ToolSpec], fault_rate: float = 0.0,
                 max_faults_per_turn: int = 1, seed: int = 0):
        if task.gold is None:
            raise ValueError(f"task {task.task_id} has no gold calls: the gold teacher cannot answer it")
        if not 0.0 <= fault_rate <= 1.0:
            raise ValueError(f"fault_rate must be within [0, 1], got {fault_rate}")
        self.task = task
        self.specs = {s.name: s for s in tools}
        self.fault_rate = fault_rate
        self.max_faults_per_turn = max_faults_per_turn
        self.rng = random.Random(f"{task.env}/{task.task_id}/{seed}")
        self.name = gold_teacher_name(fault_rate)
        self._turns: dict[int, _TurnState] = {}
        self._current: _TurnState | None = None
        self._faults: dict[int, str] = {}  # plan step → fault the Primitive will carry out

    # -- backend protocol ------------------------------------------------------------------
    def generate(self, role: str, messages: list[Message], sampling: SamplingConfig | None = None) -> Generation:
        start = time.perf_counter()
        payload = role_input(messages)
        answer, meta = {"planner": self._planner, "router": self._router,
                        "primitive": self._primitive, "verifier": self._verifier}[role](payload)
        text = json.dumps(answer, ensure_ascii=False)
        return Generation(text=text, backend=self.name, meta=meta,
                          prompt_tokens=sum(len(m["content"].split()) for m in messages),
                          completion_tokens=len(text.split()), latency_s=time.perf_counter() - start)

    def generate_batch(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        return [self.generate(r.role, r.messages, r.sampling) for r in requests]

    # -- helpers ---------------------------------------------------------------------------
    def _fill(self, templates: Sequence[str], call: ToolCall, **more: str) -> str:
        purpose = _purpose(self.specs.get(call.name)) or f"run {call.name}"
        return self.rng.choice(templates).format(
            tool=call.name, args=_args_text(call.arguments), purpose=purpose,
            Purpose=purpose[:1].upper() + purpose[1:], **more)

    @staticmethod
    def _consumed(executed: list[dict[str, Any]]) -> int:
        """How many gold calls of the turn already ran.

        Every SUCCESS consumed one, in order. Injected faults never reach execution (they
        fail binding), so a RUNTIME_ERROR is a gold call that the benchmark itself answers
        with an error — part of the gold sequence, and consumed too.
        """
        return sum(1 for e in executed if e["status"] == "SUCCESS" or e["summary"].startswith("RUNTIME_ERROR"))

    def _maybe_fault(self, state: _TurnState) -> str | None:
        if state.faults >= self.max_faults_per_turn or self.rng.random() >= self.fault_rate:
            return None
        state.faults += 1
        return self.rng.choice(FAULT_KINDS)

    # -- roles -----------------------------------------------------------------------------
    def _planner(self, p: dict[str, Any]) -> tuple[dict, dict]:
        turn = self.task.turns.index(p["user_query"])
        state = self._current = self._turns.setdefault(turn, _TurnState(turn))
        state.plan_calls = self.task.gold[turn][self._consumed(p.get("executed_so_far", [])):]
        plan = [{"step": i, "tool": c.name, "objective": self._fill(OBJECTIVES, c),
                 "depends_on": [i - 1] if i > 1 else []} for i, c in enumerate(state.plan_calls, 1)]
        intent = self.rng.choice(INTENTS).format(query=" ".join(p["user_query"].split())[:200])
        return {"status": "SUFFICIENT", "intent": intent, "plan": plan}, {}

    def _router(self, p: dict[str, Any]) -> tuple[dict, dict]:
        state = self._current
        state.pending, self._faults, meta, dispatch = [], {}, {}, []
        for i, call in enumerate(state.plan_calls, 1):
            bindings = dict(call.arguments)
            fault = self._maybe_fault(state)
            if fault == "stale_reference" and bindings:
                key = self.rng.choice(list(bindings))
                bindings[key] = f"$step_{len(state.plan_calls) + 1}.result.{key}"  # a step that never runs
                meta = {"injected_fault": fault, "fault_step": i}
            elif fault:
                self._faults[i] = "wrong_argument" if fault == "stale_reference" else fault
            state.pending.append((i, call))
            dispatch.append({
                "step": i, "target_tool": call.name,
                "invocation_request": self._fill(REQUESTS, call),
                "resolved_bindings": bindings,
                "h_params": {"retry": self.rng.choice((0, 0, 1)), "priority": 0,
                             "timeout_s": self.rng.choice((10, 15, 30))},
            })
        return {"status": "READY", "dispatch": dispatch}, meta

    def _primitive(self, p: dict[str, Any]) -> tuple[dict, dict]:
        tool = p["tool"]["name"]
        pending = self._current.pending
        step, _ = pending.pop(next(i for i, (_, c) in enumerate(pending) if c.name == tool))
        arguments = dict(p["resolved_bindings"])
        fault = self._faults.pop(step, None)
        if fault is None:
            return {"tool": tool, "arguments": arguments}, {}
        return self._inject(fault, tool, arguments, p["tool"]["parameters"])

    def _inject(self, fault: str, tool: str, arguments: dict, schema: dict) -> tuple[dict, dict]:
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

    def _verifier(self, p: dict[str, Any]) -> tuple[dict, dict]:
        results = p["results"]
        criteria = {"task_completion": True, "argument_consistency": True,
                    "execution_validity": True, "constraint_satisfaction": True}
        # A RUNTIME_ERROR of a gold call, with nothing skipped after it, is the benchmark's
        # expected answer (e.g. "no such file"): the turn is done and the user is told.
        failed = next((r for r in results if r["status"] != "SUCCESS"
                       and not (r.get("failure_type") == "RUNTIME_ERROR" and r is results[-1])), None)
        if not results:  # an empty plan: no available tool serves the request
            return {"verdict": "PASS", "criteria": criteria, "feedback": "",
                    "response": "None of the available tools can carry out this request, so I called none."}, {}
        if failed is None:
            lines = [f"{r['tool']}: {r['summary']}" for r in results]
            turn = self._current.turn
            gold = self.task.gold_response[turn] if self.task.gold_response else ""
            response = " ".join([self.rng.choice(PASS_OPENERS), *lines, gold]).strip()
            return {"verdict": "PASS", "criteria": criteria, "feedback": "", "response": response}, {}
        criteria.update(task_completion=False, execution_validity=False)
        if failed.get("failure_type") in ("SCHEMA_RESOLUTION", "CONSTRAINT_VIOLATION"):
            criteria["argument_consistency"] = False
        step = failed["step"]
        kind = failed.get("failure_type") or failed["status"]
        feedback = (f"Step {step} ({failed['tool']}) failed with {kind}: {failed.get('details') or failed['summary']}. "
                    f"Re-plan from step {step}: call {failed['tool']} with arguments that match its schema and "
                    f"the request; do not repeat the steps that succeeded.")
        return {"verdict": "FAIL", "criteria": criteria, "feedback": feedback, "response": ""}, {}
