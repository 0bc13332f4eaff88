"""The HEART loop: Algorithm 1 of the paper, for one user turn.

    Input: query q, ToolFace T, budget B
    T_q ← T.retrieve(q)                                  # names + short descriptions only
    for b = 0 … B:                                       # the first plan, then ≤ B re-plans
        P ← Planner(q, T_q, context, feedback)
        while P is INSUFFICIENT:                         # ask, at most C times
            context ← context ∪ {(P.question, User(P.question))};  P ← Planner(…)
        D ← Router(q, P, context)                        # bindings, $step_j.field, h-params
        for each dispatch d ∈ D, in plan order:
            r_d ← Primitive_{d.tool}(d.request, resolve(d.bindings, r_<d))   # SUCCESS | FAILURE
        V ← Verifier(q, P, r)                            # four criteria
        if V = PASS: return V.response
        feedback ← V.feedback
    return failure report                                # budget spent

Steps run in plan order (tools share state: `cd` before `mkdir`); after a failed step the
rest of the attempt is skipped, so nothing acts on a state the plan did not expect. A
malformed role output fails the attempt with its parse error as feedback, like a FAIL.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from heart.calls import RoleClient
from heart.primitives import SCHEMA_RESOLUTION, BindingError, Envelope, execute, failure, resolve_references
from heart.roles import planner, primitive, router, verifier
from heart.roles.planner import PlannerOutput
from heart.roles.router import RouterOutput
from heart.toolface import ToolFace

Observer = Callable[[str, dict[str, Any]], None]


@dataclass(frozen=True)
class LoopConfig:
    """How one HEART turn runs."""

    replan_budget: int = 3
    """B: how many times the Planner may re-plan after a FAIL (attempts = B + 1)."""
    max_clarifications: int = 2
    """How many clarification questions the Planner may ask per turn."""
    retrieve_k: int = 10
    """How many tools ToolFace shows the Planner."""
    max_plan_steps: int = 6
    """Longest plan constrained decoding lets the Planner write."""
    short_prompts: tuple[str, ...] = ()
    """Roles served by context-distilled adapters: they get the short system prompt."""
    prefill: bool = False
    """Start each answer with the role's RESPONSE_PREFIX (steers small base models into JSON)."""
    constrained: bool = False
    """Constrain decoding to each role's output schema (tools, steps and arguments included);
    it supersedes ``prefill``. Backends that cannot constrain answer unconstrained."""


@dataclass
class Attempt:
    attempt: int
    plan: PlannerOutput | None = None
    dispatch: RouterOutput | None = None
    results: dict[int, Envelope] = field(default_factory=dict)
    verdict: str = "ERROR"
    """PASS, FAIL, or ERROR when no verdict could be read."""
    feedback: str = ""


@dataclass
class TurnResult:
    verdict: str
    """PASS when the Verifier passed an attempt; FAIL when the budget ran out."""
    response: str
    attempts: list[Attempt]
    clarifications: list[dict[str, str]]

    @property
    def replans_used(self) -> int:
        return max(0, len(self.attempts) - 1)


def _quiet(kind: str, payload: dict[str, Any]) -> None:
    pass


class HeartLoop:
    """Runs Algorithm 1 for one turn over a ToolFace, a role client and the user."""

    def __init__(self, roles: RoleClient, toolface: ToolFace, ask_user: Callable[[str], str],
                 config: LoopConfig = LoopConfig(), observe: Observer = _quiet):
        self.roles = roles
        self.toolface = toolface
        self.ask_user = ask_user
        self.config = config
        self.observe = observe

    # -- Algorithm 1 -----------------------------------------------------------------------
    def solve(self, query: str, conversation: list[dict[str, str]] | None = None) -> TurnResult:
        conversation = conversation or []
        # T_q ← T.retrieve(q): names and one-line descriptions, never schemas
        tools = [{"name": t.name, "description": t.description}
                 for t in self.toolface.retrieve(query, self.config.retrieve_k)]
        clarifications: list[dict[str, str]] = []
        executed: list[dict[str, Any]] = []
        attempts: list[Attempt] = []
        feedback: str | None = None

        for b in range(self.config.replan_budget + 1):  # the first plan, then ≤ B re-plans
            attempt = Attempt(b)
            attempts.append(attempt)
            if b > 0:
                self.observe("replan", {"attempt": b, "feedback": feedback})

            # P ← Planner(q, T_q, context, feedback); while P is INSUFFICIENT, ask the user
            plan = self.plan(query, tools, conversation, clarifications, executed, feedback, attempt)
            while plan is not None and plan.status == "INSUFFICIENT":
                if len(clarifications) >= self.config.max_clarifications:
                    break
                answer = self.ask_user(plan.clarification)
                clarifications.append({"question": plan.clarification, "answer": answer})
                self.observe("clarification", clarifications[-1])
                plan = self.plan(query, tools, conversation, clarifications, executed, feedback, attempt)
            if plan is None or plan.status == "INSUFFICIENT":
                feedback = attempt.feedback = (
                    attempt.feedback or "The clarification budget is spent: plan with the information given."
                )
                continue
            attempt.plan = plan

            if plan.plan:  # D ← Router(q, P, context); r_d ← Primitive_d(…) in plan order
                dispatch = self.route(query, plan, conversation, executed, attempt)
                if dispatch is None:
                    feedback = attempt.feedback
                    continue
                attempt.dispatch = dispatch
                attempt.results = self.execute(dispatch, b)
            executed += [{"step": s, "attempt": b, "tool": r.tool, "status": r.status, "summary": r.summary}
                         for s, r in attempt.results.items() if r.status != "SKIPPED"]

            # V ← Verifier(q, P, r); PASS returns, FAIL feeds back to the Planner
            verdict = self.verify(query, plan, attempt.results, conversation, attempt)
            if verdict is not None and verdict.verdict == "PASS":
                attempt.verdict = "PASS"
                return TurnResult("PASS", verdict.response, attempts, clarifications)
            attempt.verdict = "FAIL" if verdict is not None else "ERROR"
            feedback = attempt.feedback = verdict.feedback if verdict is not None else attempt.feedback

        return TurnResult("FAIL", self.failure_report(attempts), attempts, clarifications)  # budget spent

    # -- the four roles --------------------------------------------------------------------
    def _system(self, module) -> str:
        short = module.ROLE in self.config.short_prompts
        return module.SHORT_SYSTEM_PROMPT if short else module.SYSTEM_PROMPT

    def _prefill(self, module) -> str:
        return module.RESPONSE_PREFIX if self.config.prefill and not self.config.constrained else ""

    def _schema(self, build, *args) -> dict[str, Any] | None:
        return build(*args) if self.config.constrained else None

    def plan(self, query, tools, conversation, clarifications, executed, feedback,
             attempt: Attempt) -> PlannerOutput | None:
        b = attempt.attempt
        messages = planner.build_messages(query, tools, conversation, clarifications, executed, feedback,
                                          system_prompt=self._system(planner))
        call = self.roles.call("planner", messages, lambda text: planner.parse(text, set(self.toolface.names())), b,
                               prefill=self._prefill(planner),
                               schema=self._schema(planner.output_schema, self.toolface.names(),
                                                   len(clarifications) < self.config.max_clarifications,
                                                   self.config.max_plan_steps))
        if not call.ok:
            self._attempt_error(attempt, "planner", call.result.error)
            return None
        self.observe("plan", {"attempt": b, "plan": call.result.value})
        return call.result.value

    def route(self, query, plan: PlannerOutput, conversation, executed, attempt: Attempt) -> RouterOutput | None:
        b = attempt.attempt
        steps = [s.model_dump() for s in plan.plan]
        parameters = {s.tool: list(self.toolface.get(s.tool).spec.parameters.get("properties", {}))
                      for s in plan.plan}
        messages = router.build_messages(query, steps, parameters, conversation, executed,
                                         system_prompt=self._system(router))
        call = self.roles.call("router", messages,
                               lambda text: router.parse(text, {s.step: s.tool for s in plan.plan}), b,
                               prefill=self._prefill(router),
                               schema=self._schema(router.output_schema, {s.step: s.tool for s in plan.plan}, parameters))
        if not call.ok:
            self._attempt_error(attempt, "router", call.result.error)
            return None
        self.observe("dispatch", {"attempt": b, "dispatch": call.result.value})
        return call.result.value

    def execute(self, dispatch: RouterOutput, b: int) -> dict[int, Envelope]:
        results: dict[int, Envelope] = {}
        for d in sorted(dispatch.dispatch, key=lambda d: d.step):
            failed = next((s for s, r in results.items() if not r.ok), None)
            if failed is not None:
                results[d.step] = Envelope("SKIPPED", d.target_tool, details=f"not run: step {failed} failed",
                                           summary=f"not run: step {failed} failed")
                continue
            results[d.step] = self.run_primitive(d, results, b)
            self.observe("result", {"attempt": b, "step": d.step, "envelope": results[d.step]})
        return results

    def run_primitive(self, d, results: dict[int, Envelope], b: int) -> Envelope:
        tool = self.toolface.get(d.target_tool)
        try:
            bindings = resolve_references(d.resolved_bindings, results)
        except BindingError as err:
            return failure(tool.name, err.failure_type, err.details, d.resolved_bindings)
        card = primitive.tool_card(tool.name, tool.spec.description, tool.spec.parameters)
        messages = primitive.build_messages(d.invocation_request, bindings, card,
                                            system_prompt=self._system(primitive))
        call = self.roles.call("primitive", messages, lambda text: primitive.parse(text, tool.name), b,
                               step=d.step, record=False, prefill=self._prefill(primitive),
                               schema=self._schema(primitive.output_schema, tool.name, tool.spec.parameters))
        if not call.ok:
            envelope = failure(tool.name, SCHEMA_RESOLUTION, f"unreadable primitive output: {call.result.error}")
        elif call.result.value.status == "UNRESOLVABLE":
            envelope = failure(tool.name, SCHEMA_RESOLUTION, call.result.value.reason)
        else:
            for _ in range(d.h_params.retry + 1):  # retries re-run execution, not the model
                envelope = execute(tool, call.result.value.arguments, d.h_params.timeout_s)
                if envelope.ok or envelope.failure_type != "RUNTIME_ERROR":
                    break
        self.roles.record(call, envelope=envelope.to_dict())
        return envelope

    def verify(self, query, plan: PlannerOutput, results: dict[int, Envelope], conversation, attempt: Attempt):
        b = attempt.attempt
        steps = [s.model_dump() for s in plan.plan]
        rows = [{"step": s, **r.to_dict()} for s, r in sorted(results.items())]
        messages = verifier.build_messages(query, steps, rows, conversation, system_prompt=self._system(verifier))
        call = self.roles.call("verifier", messages, verifier.parse, b, prefill=self._prefill(verifier),
                               schema=self._schema(verifier.output_schema))
        if not call.ok:
            self._attempt_error(attempt, "verifier", call.result.error)
            return None
        self.observe("verdict", {"attempt": b, "verdict": call.result.value})
        return call.result.value

    # -- bookkeeping -----------------------------------------------------------------------
    def _attempt_error(self, attempt: Attempt, role: str, error: str) -> None:
        self.observe("parse_error", {"attempt": attempt.attempt, "role": role, "error": error})
        attempt.feedback = f"The {role}'s output could not be used ({error}). Answer with valid JSON in the required form."

    def failure_report(self, attempts: list[Attempt]) -> str:
        lines = [f"Could not complete the request after {len(attempts)} attempt(s)."]
        for a in attempts:
            failed = [f"step {s} {r.tool}: {r.failure_type} {r.details}" for s, r in a.results.items()
                      if r.status == "FAILURE"]
            lines.append(f"attempt {a.attempt}: {a.verdict}; {a.feedback or 'no feedback'}"
                         + (f"; failures: {'; '.join(failed)}" if failed else ""))
        return "\n".join(lines)
