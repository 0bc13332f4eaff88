"""The HEART loop: Algorithm 1 of the paper, for one user turn.

Algorithm 1 (HEART, Appendix C), as the paper writes it::

    Input: query q, ToolFace T, budget B;  C ← ∅ (context), b ← 0
    T_q ← T.retrieve(q)
    while b ≤ B:
        π ← PLANNER(q, T_q, C)                  # intent, sufficiency, plan (or a question)
        D ← ROUTER(π, C)                        # bindings, $step_j references, h-params
        for each step k of π:
            β_k ← ROUTER(π_k, C)                # (line 9: the per-step form of the same call)
            r_k ← P_k(x_k; c)                   # Eq. 1: the Primitive gets the upstream result c
            v_k, ϕ_k ← VERIFIER(r_k, π_k, s_k)  # the step, its plan entry, its tool schema
            if v_k = FAIL:  C ← C ∪ {ϕ_k};  b ← b + 1;  re-plan;  break
        if every step passed: return the results
    return failure                               # budget spent

How this module maps it: :meth:`HeartLoop.solve` is the ``while`` (the first plan, then at
most B re-plans, each annotated ``replanned: true`` by the Planner); :class:`TurnState`
carries q, T_q and C (its ``feedback``, every feedback of the turn, so a re-plan sees all of
them); :meth:`run_steps` is the
``for``: among the steps whose dependencies succeeded it runs the one of highest priority
(then the lowest step number), gives its Primitive the results of the steps it depends on
(``upstream_context``), and verifies it at once with its tool's schema in the Verifier's
input; a step whose dependencies did not succeed is skipped, whatever happened to
unrelated steps.

Where it departs from the paper, and why:

- **Two Router modes** (``LoopConfig.router_mode``). Algorithm 1 writes the Router both
  ways: ``D ← ROUTER(π, C)`` once per plan (Appendix D.2's whole-plan dispatch: ``plan``)
  and ``β_k ← ROUTER(π_k, C)`` per step (``step``). In ``step`` mode :meth:`run_steps`
  routes each step when its dependencies have run, showing their results' fields, so a
  value produced upstream is bound as a reference to the step and field that hold it; the
  step's invocation request is then written by code from its bindings
  (:func:`heart.roles.router.invocation_request`), and no messages are sent (the Router
  reads the upstream fields itself).
- **Final answer.** Algorithm 1 returns the results; users need a sentence. The turn's
  response is assembled deterministically from the results of the steps that ran (no model
  call, so nothing can be invented or copied from hidden answers); with an empty plan it
  says that no available tool serves the request. An empty plan has no step to verify, so
  it ends the turn without a Verifier call.
- **Clarifications.** INSUFFICIENT plans ask the environment's user, at most
  ``max_clarifications`` times per turn (the paper sets no cap); after that the Planner's
  input says ``may_ask: false`` and its schema no longer allows a question.
- **Malformed outputs.** A role answer that does not parse ends the attempt like a FAIL,
  with the parse error as feedback (the paper assumes well-formed answers).
- **Re-plans look for more tools.** Algorithm 1 retrieves ``T_q`` once per query. Here,
  when the Verifier's only complaint is that the request is not done (``task_completion``
  alone: every step ran as asked), the re-plan's input also shows up to
  ``LoopConfig.replan_tools`` (default 3) further tools, retrieved for that feedback.
  Some needs only show up once a step has run — "do the actions in the email" needs
  ``append_to_file`` only after the email is read — and a task with more tools than the
  Planner is shown cannot get its last ones any other way. The shown list only grows, so
  every tool of the plan being repaired stays in view. For the same reason a first empty
  plan ("no shown tool serves this") is re-planned once, with tools retrieved for the
  Planner's own statement of the task. A re-plan after a wrongly called step adds nothing.
- **Primitive families** (HEELO). HEART's Primitives wrap tools; here a step may also be
  a code step (``"family": "code"``, ``tool_hint`` the Code primitive ``compute``,
  :mod:`heart.families`), shown to the Planner beside the retrieved tools (unless
  ``LoopConfig.code`` is off): its Router binds named inputs (``$step_j`` references to
  earlier results), its Primitive writes one Python expression over them, and
  :mod:`heart.sandbox` evaluates it — no imports, no I/O, bounded time, memory and output;
  a hostile or broken expression is a typed FAILURE envelope like a tool's. It is how an
  answer that needs a value no tool returns (a total, a product, a time span) gets it; the
  turn's answer quotes its result like any step's. A code step has no effect, so the
  ledger below does not track it.
- **Re-plans revise only the implicated work** (HEELO's COMPOSE). Algorithm 1 re-plans and
  runs the new plan whole; a Planner asked "do not redo SUCCESS steps" may still repeat one,
  and a ``send_money`` that passed then ran twice in one turn. Here the turn keeps a ledger
  (:class:`heart.ledger.TurnLedger`) and, before a step executes, its call (tool and bound
  arguments: exactly what would run) is looked up: a call that succeeded and that the
  Verifier passed is not executed again, and a state-changing call
  (:func:`heart.roles.router.is_read_only` false) that succeeded is never executed twice in
  the turn, whatever its verdict. The step gets the earlier envelope, marked ``reused``
  (``meta.reused`` names the attempt and step that ran it; the trace's Primitive event
  carries it), is not shown again in ``executed_so_far`` nor quoted twice in the answer, and
  needs no new verdict when the Verifier had passed it. A read is the same work only on
  the same state: after a state-changing call it runs again. The plan is still re-planned
  whole (D.1's ``replanned: true``); what is kept is decided by the call, not by the
  Planner's step numbers. Each turn counts ``reused_steps``, ``passed_steps_reexecuted`` and
  ``state_changing_executed_twice`` (:attr:`TurnResult.counts`; the last two are 0 by
  construction, and measured, not assumed); the episode record sums them.
- **Relevance before selection** (HEELO). With ``LoopConfig.relevance`` the first
  Planner call is shown, instead of ToolFace's list, the candidates of ToolFace's top 20
  whose Primitives say, in their relevance mode, that they apply (at most 10, best ToolFace
  rank first; :mod:`heart.relevance`); with ``relevance_thresholds`` ToolFace's list less the
  tools whose Primitives are confident they do not apply, each with its ``how``. Tools a
  re-plan adds for feedback are not judged.
- **Messages between primitives** (HEELO). A step that passed and whose result later
  steps read (their Router bindings refer to ``$step_j``) gets one more Primitive call, in
  its messages mode (:mod:`heart.roles.primitive_messages`, ``LoopConfig.messages``): it
  sees its result and those steps and addresses each the field it needs, with a caveat when
  one helps. Each dependent step's Primitive sees the messages addressed to it in its
  upstream context. The Router dispatches the whole plan before any step runs (Algorithm 1's
  ``D ← ROUTER(π, C)``), so it sees messages of earlier attempts only, in
  ``executed_so_far``. An unreadable answer sends no message; the step keeps its result.
- **Carried validation after execution** (HEELO). A tool step's SUCCESS carries the checks
  of :mod:`heart.validation` (``LoopConfig.validation``): the result against the shape mined
  for its tool, and for a state-changing tool whether the environment's state changed with
  the asked values in it. They are evidence in the envelope the Verifier sees, not a
  FAILURE (the tool ran and its effects happened; the module says why).
- **Tool-boundary middleware** (PRISM). Every Primitive call passes the intercept set
  ``LoopConfig.middleware`` names (:mod:`heart.middleware`, docs/middleware.md): silent
  corrections of its arguments, error blocks and prerequisite blocks (looked up in the
  turn's successful calls, :class:`heart.middleware.TurnCalls`) before it runs; what
  applied is in the envelope's ``meta["middleware"]``. The default set is the binding's
  coercion; ``"none"`` binds arguments as given.
- **Harness prompt edits** (PRISM). ``LoopConfig.prompt_edits`` (a harness folder,
  :mod:`heart.harness`, ``--harness``) appends to or replaces a role's system prompt; the
  paper's prompts are the default and stay the same for roles the harness does not edit.
- **Whole-attempt variant.** ``LoopConfig.verify = "attempt"`` keeps the earlier design for
  comparison: all steps run (dependency-aware), then one Verifier call judges the attempt
  (no step is Verifier-passed before the attempt ends, so only the state-changing rule
  applies within it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable

from heart.calls import RoleClient
from heart.families import CODE_CATEGORY, CODE_DESCRIPTION, CODE_PRIMITIVE
from heart.ledger import COUNTERS, TurnLedger
from heart.middleware import TurnCalls, load_middleware
from heart.primitives import (
    CODE_TOOL,
    REFERENCE,
    SCHEMA_RESOLUTION,
    BindingError,
    Envelope,
    bind_arguments,
    clip,
    execute_code,
    execute_with_retry,
    failure,
    one_line,
    resolve_references,
    shrink,
)
from heart.provenance import PROVENANCE_VIOLATION, unregistered
from heart.roles import planner, primitive, primitive_messages, router, verifier
from heart.roles.planner import PlannerOutput
from heart.roles.registry import PLANNER, PRIMITIVE, ROUTER, VERIFIER, Role, get_role
from heart.roles.router import PRIORITY_RANK, Dispatch, RouterOutput
from heart.roles.verifier import VerifierOutput
from heart.settings import LoopConfig  # the loop's settings, one declaration (also heart.loop.LoopConfig)
from heart.toolface import ToolFace
from heart.validation import CarriedValidation, load_result_shapes

Observer = Callable[[str, dict[str, Any]], None]

PLANNER_CONVERSATION_CHARS = 60
"""The Planner sees earlier turns' responses cut to this: it plans from the gist, while the
Router, which must ground values, sees them as the episode keeps them."""
RESPONSE_RESULT_CHARS = 4000
"""How much of each step's result the turn's answer quotes. The answer states what the
tools returned, as an agent's answer would: a cut at 600 characters dropped values the
user asked about (AgentDojo workspace/user_task_28: two of the three scores asked for sat
past the cut in the file's content). Later turns see the answer shortened
(``heart.episode.CONVERSATION_RESPONSE_CHARS``), the Planner far less; only the user (and
the benchmark's checker) reads it whole."""
NO_TOOL_RESPONSE = "None of the available tools can carry out this request, so I called none."


@dataclass
class Attempt:
    attempt: int
    plan: PlannerOutput | None = None
    dispatch: RouterOutput | None = None
    results: dict[int, Envelope] = field(default_factory=dict)
    """Envelope per step, in the order the steps ran (SKIPPED: dependencies did not succeed)."""
    verdicts: dict[int, VerifierOutput] = field(default_factory=dict)
    """Verifier verdict per judged step (whole-attempt variant: one, under its ``step``)."""
    verdict: str = "ERROR"
    """PASS, FAIL, or ERROR when no verdict could be read."""
    feedback: str = ""


@dataclass
class TurnState:
    """What one turn carries from role call to role call: Algorithm 1's q, T_q and C, and
    what the turn has gathered so far. One per turn; its lists grow in place, attempt after
    attempt, so every re-plan sees all of them."""

    query: str
    """q: the user's query."""
    tools: list[dict[str, str]]
    """T_q: the tools the Planner is shown (name, description, category); a re-plan that
    looks further replaces it by a longer list (:meth:`HeartLoop.more_tools`)."""
    conversation: list[dict[str, str]]
    """The earlier turns of the episode (user, response)."""
    ledger: TurnLedger
    """The calls this turn executed: what a re-plan reuses (:mod:`heart.ledger`)."""
    calls: TurnCalls
    """The turn's successful calls: what prerequisite intercepts look at (:mod:`heart.middleware`)."""
    clarifications: list[dict[str, str]] = field(default_factory=list)
    """The Planner's questions this turn and the user's answers."""
    executed: list[dict[str, Any]] = field(default_factory=list)
    """The steps run so far this turn, as the Planner's and Router's ``executed_so_far`` show them."""
    feedback: list[str] = field(default_factory=list)
    """C: every feedback of the turn, oldest first."""


@dataclass
class TurnResult:
    verdict: str
    """PASS when every step of an attempt passed; FAIL when the budget ran out."""
    response: str
    attempts: list[Attempt]
    clarifications: list[dict[str, str]]
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    """The turn ledger's counters: ``reused_steps`` (steps served an earlier envelope),
    ``passed_steps_reexecuted`` and ``state_changing_executed_twice`` (0 by construction)."""

    @property
    def replans_used(self) -> int:
        return max(0, len(self.attempts) - 1)


def quiet(kind: str, payload: dict[str, Any]) -> None:
    """The default observer: ignores every event."""


def referenced_steps(value: Any) -> set[int]:
    """The steps a binding value refers to (``$step_j`` anywhere inside it)."""
    if isinstance(value, dict):
        return set().union(*map(referenced_steps, value.values()))
    if isinstance(value, list):
        return set().union(*map(referenced_steps, value))
    return {int(m.group(1)) for m in REFERENCE.finditer(value)} if isinstance(value, str) else set()


def readers(step: int, plan_steps: dict, pending: dict[int, Dispatch | None]) -> list[dict[str, Any]]:
    """The pending steps whose bindings read ``step``'s result, as the messages input shows
    them (:func:`heart.roles.primitive_messages.dependent`); a step not routed yet (step
    mode) reads nothing so far."""
    return [primitive_messages.dependent(s, d.target_tool, plan_steps[s].objective,
                                         [name for name, value in d.resolved_bindings.items()
                                          if step in referenced_steps(value)])
            for s, d in sorted(pending.items())
            if d is not None and any(step in referenced_steps(v) for v in d.resolved_bindings.values())]


MESSAGE_VALUE_CHARS = 300
"""How much of the value a message's field names the dependent step's Primitive is shown."""


def field_value(envelope: Envelope, path: str) -> Any:
    """The value a message's field (``result.<key>…``) names in ``envelope``; raises
    :class:`BindingError` when it names none."""
    return resolve_references({"value": f"$step_0.{path}"}, {0: envelope})["value"]


def field_resolves(envelope: Envelope, path: str) -> bool:
    try:
        field_value(envelope, path)
    except BindingError:
        return False
    return True


def shown_message(message: dict[str, Any]) -> dict[str, Any]:
    """A message as the Router of a re-plan sees it: the field, and the note if any."""
    return {"field": message["field"], **({"note": message["note"]} if message.get("note") else {})}


def addressed(envelope: Envelope, step: int) -> dict[str, Any]:
    """``{"messages": [...]}`` of ``envelope``'s messages to ``step`` (empty when none), each
    with the value its field names, read from the whole result: the upstream context shows
    the result clipped, and the value a later step needs may lie past the cut."""
    mine = [{**shown_message(m),  # (the whole result is in the upstream context already)
             **({"value": clip(field_value(envelope, m["field"]), MESSAGE_VALUE_CHARS)} if m["field"] != "result"
                else {})}
            for m in envelope.messages if m.get("to") == step]
    return {"messages": mine} if mine else {}


def looks_further(attempt: Attempt) -> bool:
    """Whether the re-plan after ``attempt`` searches for more tools: its plan was empty,
    or its Verifier failed it on ``task_completion`` alone (every step ran as asked, the
    request needs more), not on how a step was called."""
    if attempt.plan is not None and not attempt.plan.plan:
        return True
    failed = [v for v in attempt.verdicts.values() if v.status == "FAIL"]
    return bool(failed) and failed[-1].criteria.failed() == ["task_completion"]


def system_prompt(role: Role | str, config: LoopConfig, payload: dict[str, Any] | None = None,
                  mode: str | None = None) -> str:
    """The system prompt ``role`` gets for ``payload`` (or in its ``mode``) under ``config``:
    the short one for a context-distilled role, else the full one of the input's mode, with a
    harness's edits where they apply (:attr:`heart.roles.registry.Mode.edited_by_harness`).
    The loop's role calls and the MCP server's ``call_primitive`` (:mod:`heart.mcp`) both take it."""
    role = get_role(role)
    chosen = role.mode(mode) if mode is not None else role.mode_for(payload)
    prompt = chosen.system_prompt(short=role.name in config.short_prompts)
    for edited, edit, text in config.prompt_edits if chosen.edited_by_harness else ():  # heart.harness
        if edited == role.name:
            prompt = text if edit == "replace" else f"{prompt}\n{text}"
    return prompt


class HeartLoop:
    """Runs Algorithm 1 for one turn over a ToolFace, a role client and the user."""

    def __init__(self, roles: RoleClient, toolface: ToolFace, ask_user: Callable[[str], str],
                 config: LoopConfig = LoopConfig(), observe: Observer = quiet,
                 state: Callable[[], Any] | None = None):
        """``state``: the environment session's state (``session.state``), for the carried
        validation's state-change check; None: state changes are not checked."""
        self.roles = roles
        self.toolface = toolface
        self.ask_user = ask_user
        self.config = config
        self.observe = observe
        self.middleware = load_middleware(config.middleware)
        self.relevance_thresholds = None  # the prune policy's, read once per loop like the middleware
        if config.relevance_thresholds is not None:
            from heart.relevance import Thresholds

            self.relevance_thresholds = Thresholds.load(config.relevance_thresholds)
        self.carried = None if config.validation == "none" else CarriedValidation(
            load_result_shapes(None if config.validation == "default" else config.validation), state)
        if config.code and CODE_PRIMITIVE in set(toolface.names()):
            raise ValueError(f"the environment has a tool named {CODE_PRIMITIVE!r}, the Code primitive's name: "
                             "run with LoopConfig(code=False)")

    # -- Algorithm 1 -----------------------------------------------------------------------
    def solve(self, query: str, conversation: list[dict[str, str]] | None = None) -> TurnResult:
        conversation = conversation or []
        # T_q ← T.retrieve(q): names, one-line descriptions and categories, never schemas
        # (the full description: the Planner's input shows each tool's own first sentence)
        tools = self.first_tools(query)
        if self.config.code:  # the Code primitive is always at hand, like the Planner's own arithmetic
            tools.append({"name": CODE_PRIMITIVE, "description": CODE_DESCRIPTION, "category": CODE_CATEGORY})
        # C ← ∅: the turn's feedback, clarifications and executed steps stay in its state;
        # TurnLedger is looked up here, at run time (bench/replan_reuse.py swaps it)
        turn = TurnState(query, tools, conversation, ledger=TurnLedger(), calls=TurnCalls())
        attempts: list[Attempt] = []

        def result(verdict: str, response: str) -> TurnResult:
            return TurnResult(verdict, response, attempts, turn.clarifications, dict(turn.ledger.counts))

        for b in range(self.config.replan_budget + 1):  # the first plan, then ≤ B re-plans
            attempt = Attempt(b)
            attempts.append(attempt)
            if b > 0:
                self.observe("replan", {"attempt": b, "feedback": list(turn.feedback)})
                if looks_further(attempts[-2]):
                    turn.tools = self.more_tools(turn.tools, turn.feedback[-1])

            # π ← PLANNER(q, T_q, C); an INSUFFICIENT plan asks the user (bounded)
            plan = self.plan(turn, attempt)
            while plan is not None and plan.status == "INSUFFICIENT" \
                    and len(turn.clarifications) < self.config.max_clarifications:
                answer = self.ask_user(plan.clarification)
                turn.clarifications.append({"question": plan.clarification, "answer": answer})
                self.observe("clarification", turn.clarifications[-1])
                plan = self.plan(turn, attempt)
            if plan is None or plan.status == "INSUFFICIENT":
                attempt.feedback = attempt.feedback or "The clarification budget is spent: plan with the information given."
                turn.feedback.append(attempt.feedback)
                continue
            attempt.plan = plan
            if not plan.plan:  # nothing any available tool can do: no step to verify
                # once per turn (no earlier empty plan): search for the task the Planner stated
                if self.config.replan_tools and b < self.config.replan_budget \
                        and not any(a.plan is not None and not a.plan.plan for a in attempts[:-1]):
                    attempt.verdict = "FAIL"
                    attempt.feedback = f"No shown tool serves this ({plan.intent.task}); more tools are shown."
                    turn.feedback.append(attempt.feedback)
                    continue
                attempt.verdict = "PASS"
                return result("PASS", NO_TOOL_RESPONSE)

            # D ← ROUTER(π, C); in step mode β_k ← ROUTER(π_k, C) inside run_steps
            if self.config.router_mode == "plan":
                dispatch = self.route(turn, plan, attempt)
                if dispatch is None:
                    turn.feedback.append(attempt.feedback)
                    continue
                attempt.dispatch = dispatch
            else:
                attempt.dispatch = RouterOutput(status="READY", dispatch=[])

            # for each step k: r_k ← P_k(x_k; c); VERIFIER(r_k, π_k, s_k); FAIL → C ∪ {ϕ_k}, break
            self.run_steps(turn, attempt)
            turn.executed += [{"attempt": b, "step": s, "tool": r.tool, "status": r.status, "summary": r.summary,
                               **({"messages": [shown_message(m) for m in r.messages]} if r.messages else {})}
                              for s, r in attempt.results.items() if r.status != "SKIPPED" and not r.reused]
            if attempt.verdict == "PASS":
                return result("PASS", self.response(attempts))
            turn.feedback.append(attempt.feedback)

        return result("FAIL", self.failure_report(attempts))  # budget spent

    def first_tools(self, query: str) -> list[dict[str, str]]:
        """The tools the first Planner call is shown: ToolFace's retrieval, or with
        ``LoopConfig.relevance`` what the candidates' Primitives say (one batch of relevance
        calls, traced as role ``primitive``, mode ``relevance``): those that apply (gate), or
        with ``relevance_thresholds`` the retrieval less the confidently irrelevant (prune),
        each shown tool with its Primitive's ``how``."""
        if not self.config.relevance:
            return self._listed(self.toolface.retrieve(query, self.config.retrieve_k))
        from heart.relevance import relevant_tools
        from heart.roles import relevance

        thresholds = self.relevance_thresholds
        names, judgements = relevant_tools(self.roles, self.toolface, query, self.config.relevance_candidates,
                                           self.config.relevance_shown, thresholds=thresholds,
                                           retrieve_k=self.config.retrieve_k, prefill=self.config.prefill,
                                           constrained=self.config.constrained,
                                           system_prompt=self._system(PRIMITIVE, mode=relevance.MODE))
        listed = self._listed([self.toolface.get(name) for name in names])
        if thresholds is not None:  # the "how" half of the answer reaches the Planner
            hows = {j.name: j.how for j in judgements if j.how}
            listed = [{**tool, "how": hows[tool["name"]]} if tool["name"] in hows else tool for tool in listed]
        return listed

    def primitive_tool(self, name: str):
        """The Tool a step names: the Code primitive's, or the environment's via ToolFace."""
        return CODE_TOOL if name == CODE_PRIMITIVE and self.config.code else self.toolface.get(name)

    def _listed(self, retrieved) -> list[dict[str, str]]:
        return [{"name": t.name, "description": self.toolface.get(t.name).spec.description,
                 "category": self.toolface.get(t.name).spec.category} for t in retrieved]

    def more_tools(self, tools: list[dict[str, str]], feedback: str) -> list[dict[str, str]]:
        """The re-plan's tool list: every tool shown so far, then up to ``replan_tools`` more
        that ToolFace retrieves for the feedback (see the module docstring)."""
        if not self.config.replan_tools or not feedback:
            return tools
        shown = {t["name"] for t in tools}
        extra = [t for t in self.toolface.retrieve(feedback) if t.name not in shown]
        return tools + self._listed(extra[:self.config.replan_tools])

    def run_steps(self, turn: TurnState, attempt: Attempt) -> None:
        """Run the attempt's steps in dependency + priority order, verifying as configured;
        sets ``attempt.verdict`` and, on FAIL, ``attempt.feedback``."""
        plan_steps = {s.step: s for s in attempt.plan.plan}
        # step → its dispatch; in step mode None until the step is ready and routed
        pending: dict[int, Dispatch | None] = (
            {d.step: d for d in attempt.dispatch.dispatch} if self.config.router_mode == "plan"
            else dict.fromkeys(plan_steps))
        done: set[int] = set()  # steps that succeeded: their dependants may run
        while pending:
            blocked = {s: d for s, d in pending.items()
                       if any(dep in attempt.results and dep not in done for dep in plan_steps[s].dependencies)}
            for s in sorted(blocked):
                failed = [dep for dep in plan_steps[s].dependencies if dep in attempt.results and dep not in done]
                pending.pop(s)
                attempt.results[s] = Envelope("SKIPPED", plan_steps[s].tool_hint,
                                              details=f"not run: step(s) {failed} did not succeed",
                                              summary=f"not run: step(s) {failed} did not succeed")
            ready = [s for s in pending if all(dep in done for dep in plan_steps[s].dependencies)]
            if not ready:
                if pending and not blocked:  # only when a dependency is never dispatched
                    for s in sorted(pending):
                        pending.pop(s)
                        attempt.results[s] = Envelope("SKIPPED", plan_steps[s].tool_hint,
                                                      details="not run: a dependency was not dispatched",
                                                      summary="not run: a dependency was not dispatched")
                continue
            for s in ready:  # β_k ← ROUTER(π_k, C): step mode routes a step once it is ready
                if pending[s] is None:
                    pending[s] = self.route_step(turn, attempt, plan_steps[s])
                    if pending[s] is None:
                        attempt.verdict = "ERROR"
                        return
                    attempt.dispatch.dispatch.append(pending[s])
            d = min((pending[s] for s in ready), key=lambda d: (-PRIORITY_RANK[d.h_params.priority], d.step))
            del pending[d.step]
            envelope = attempt.results[d.step] = self.run_primitive(d, attempt, plan_steps, turn.ledger, turn.calls)
            self.observe("result", {"attempt": attempt.attempt, "step": d.step, "envelope": envelope})
            if envelope.reused and envelope.meta["reused"].get("passed") and self.config.verify == "step":
                done.add(d.step)  # the Verifier passed this very call: kept, not judged again
                self.send_messages(d, attempt, plan_steps, pending)
                continue
            if self.config.verify == "attempt":
                if envelope.ok:
                    done.add(d.step)
                    self.send_messages(d, attempt, plan_steps, pending)
                continue
            verdict = self.verify(turn, attempt, [d])
            if verdict is None:
                attempt.verdict = "ERROR"
                return
            if verdict.status == "FAIL":
                attempt.verdict, attempt.feedback = "FAIL", verdict.feedback
                return
            done.add(d.step)
            if not envelope.reused:
                turn.ledger.passed(attempt.attempt, d.step)
            self.send_messages(d, attempt, plan_steps, pending)
        if self.config.verify == "step":
            attempt.verdict = "PASS"
            return
        verdict = self.verify(turn, attempt, list(attempt.dispatch.dispatch))
        if verdict is None:
            attempt.verdict = "ERROR"
        else:
            attempt.verdict = verdict.status
            attempt.feedback = verdict.feedback

    # -- the four roles --------------------------------------------------------------------
    def _system(self, role: Role, payload: dict[str, Any] | None = None, mode: str | None = None) -> str:
        return system_prompt(role, self.config, payload, mode)

    def _ask(self, role: Role, payload: dict[str, Any], attempt: int, step: int | None = None, record: bool = True):
        """One role call: messages from the payload, parsed against the payload, decoding
        constrained by the schema the payload implies (all from the payload's mode)."""
        mode = role.mode_for(payload)
        prefill = mode.response_prefix if self.config.prefill and not self.config.constrained else ""
        schema = mode.schema_for_input(payload) if self.config.constrained else None
        return self.roles.call(role.name, mode.build_messages(payload, system_prompt=self._system(role, payload)),
                               lambda text: mode.parse_for_input(text, payload), attempt, step=step,
                               record=record, prefill=prefill, schema=schema)

    def plan(self, turn: TurnState, attempt: Attempt) -> PlannerOutput | None:
        conversation = [{"user": c["user"], "response": one_line(c["response"], PLANNER_CONVERSATION_CHARS)}
                        for c in turn.conversation]
        payload = planner.build_payload(
            turn.query, turn.tools, conversation=conversation,
            clarifications=turn.clarifications, executed_so_far=turn.executed,
            feedback=turn.feedback,
            may_ask=len(turn.clarifications) < self.config.max_clarifications,
            max_steps=self.config.max_plan_steps, form=self.config.planner_form)
        call = self._ask(PLANNER, payload, attempt.attempt)
        if not call.ok:
            self._attempt_error(attempt, "planner", call.result.error)
            return None
        self.observe("plan", {"attempt": attempt.attempt, "plan": call.result.value})
        return call.result.value

    def route(self, turn: TurnState, plan: PlannerOutput, attempt: Attempt) -> RouterOutput | None:
        steps = [{"step": s.step, "tool_hint": s.tool_hint, "objective": s.objective, "dependencies": s.dependencies}
                 for s in plan.plan]
        tools = {s.tool_hint: router.parameters_for(s.tool_hint, self.primitive_tool(s.tool_hint).spec.parameters)
                 for s in plan.plan}
        payload = router.build_payload(turn.query, steps, tools, conversation=turn.conversation,
                                       clarifications=turn.clarifications,
                                       executed_so_far=turn.executed)
        call = self._ask(ROUTER, payload, attempt.attempt)
        if not call.ok:
            self._attempt_error(attempt, "router", call.result.error)
            return None
        self.observe("dispatch", {"attempt": attempt.attempt, "dispatch": call.result.value})
        return call.result.value

    def route_step(self, turn: TurnState, attempt: Attempt, step) -> Dispatch | None:
        """β_k ← ROUTER(π_k, C): the step-mode Router call for one ready ``step``, shown the
        results of the steps it depends on; its invocation request written from its bindings."""
        tools = {step.tool_hint: router.parameters_for(step.tool_hint, self.primitive_tool(step.tool_hint).spec.parameters)}
        upstream = [router.upstream_entry(dep, attempt.results[dep].tool, attempt.results[dep].summary,
                                          attempt.results[dep].result)
                    for dep in step.dependencies if dep in attempt.results and attempt.results[dep].ok]
        payload = router.build_step_payload(
            turn.query, {"step": step.step, "tool_hint": step.tool_hint, "objective": step.objective,
                         "dependencies": step.dependencies},
            tools, upstream, conversation=turn.conversation, clarifications=turn.clarifications,
            executed_so_far=turn.executed, feedback=turn.feedback)
        call = self._ask(ROUTER, payload, attempt.attempt, step=step.step)
        if not call.ok:
            self._attempt_error(attempt, "router", call.result.error)
            return None
        routed = call.result.value.dispatch[0]
        routed = routed.model_copy(update={"invocation_request": router.invocation_request(
            routed.target_tool, routed.resolved_bindings, step.objective)})
        self.observe("dispatch", {"attempt": attempt.attempt, "dispatch": RouterOutput(status="READY", dispatch=[routed])})
        return routed

    def run_primitive(self, d: Dispatch, attempt: Attempt, plan_steps: dict,
                      ledger: TurnLedger | None = None, calls: TurnCalls | None = None) -> Envelope:
        tool = self.primitive_tool(d.target_tool)
        code = tool is CODE_TOOL
        try:
            bindings = resolve_references(d.resolved_bindings, attempt.results)
        except BindingError as err:
            return failure(tool.name, err.failure_type, err.details, d.resolved_bindings)
        # Eq. 1, P_i(x; c): the results of the steps this one depends on, with the messages
        # their Primitives addressed to this step (HEELO)
        upstream = [{"step": dep, "tool": attempt.results[dep].tool, "result": clip(attempt.results[dep].result),
                     **addressed(attempt.results[dep], d.step)}
                    for dep in plan_steps[d.step].dependencies if dep in attempt.results]
        card = primitive.code_card() if code else primitive.tool_card(tool.name, tool.spec.description,
                                                                       tool.spec.parameters)
        payload = primitive.build_payload(d.invocation_request, bindings, card, upstream)
        call = self._ask(PRIMITIVE, payload, attempt.attempt, step=d.step, record=False)
        if not call.ok:
            envelope = failure(tool.name, SCHEMA_RESOLUTION, f"unreadable primitive output: {call.result.error}")
        elif call.result.value.status == "UNRESOLVABLE":
            envelope = failure(tool.name, SCHEMA_RESOLUTION, call.result.value.reason)
        elif code:  # the Code family: the expression over the bound inputs, in the sandbox (no effects)
            envelope = execute_code(call.result.value.expression, bindings, d.h_params.timeout_s)
        else:
            envelope = self.execute_once(tool, call.result.value.arguments, d, attempt, ledger,
                                         self.middleware, calls, self.carried)
        self.roles.record(call, envelope=envelope.to_dict())
        return envelope

    @staticmethod
    def execute_once(tool, arguments: dict[str, Any], d: Dispatch, attempt: Attempt,
                     ledger: TurnLedger | None, middleware=None, calls: TurnCalls | None = None,
                     carried: CarriedValidation | None = None) -> Envelope:
        """Execute the Primitive's call through the tool-boundary ``middleware``, unless the
        turn's ledger holds an execution it must reuse (see the module docstring): then the
        earlier envelope, marked ``reused``. Retries re-run execution, not the model; every
        failed attempt stays in meta. A SUCCESS carries the ``carried`` validation's record.
        A tool no ToolFace registered is not run (:func:`heart.provenance.unregistered`)."""
        refused = unregistered(tool)
        if refused is not None:
            return failure(tool.name, PROVENANCE_VIOLATION, refused, arguments)
        if ledger is not None:
            try:
                renamed = (middleware.rename(tool.name, arguments, tool.spec.parameters, [])
                           if middleware is not None else arguments)
                bound = bind_arguments(renamed, tool.spec.parameters, tool.fn, middleware=middleware,
                                       tool=tool.name)
            except BindingError:
                bound = None  # execution reports the binding failure
            earlier = ledger.reusable(tool.name, bound) if bound is not None else None
            if earlier is not None:
                ledger.reused()
                return earlier.envelope.as_reused(earlier.attempt, earlier.step, earlier.passed)
        before = carried.snapshot(tool.name) if carried is not None else (False, None)
        envelope = execute_with_retry(tool, arguments, d.h_params.timeout_s, d.h_params.retry,
                                      middleware, calls)
        if carried is not None and envelope.ok:  # evidence for the Verifier, never a FAILURE
            envelope.validation = carried.check(tool.name, envelope.bound_arguments, envelope.result, before)
        if ledger is not None:
            ledger.ran(tool.name, envelope.bound_arguments, attempt.attempt, d.step, envelope.status,
                       envelope.failure_type, envelope)
        return envelope

    def send_messages(self, d: Dispatch, attempt: Attempt, plan_steps: dict, pending: dict[int, Dispatch]) -> None:
        """HEELO's messages (see the module docstring): a passed step whose result pending
        steps read asks its Primitive, in messages mode, what each of them needs; the
        messages whose field resolves in the result go into the envelope. One traced
        Primitive call (``extra["mode"] = "messages"``, with the envelope); an unreadable
        answer sends none."""
        envelope = attempt.results[d.step]
        reading = readers(d.step, plan_steps, pending)
        if not self.config.messages or not envelope.ok or not reading:
            return
        payload = primitive_messages.build_payload(envelope.tool, d.invocation_request, shrink(envelope.result),
                                                   reading)
        # the Primitive's messages mode, with its own prompts (no harness edit: those are for the tool mode)
        call = self._ask(PRIMITIVE, payload, attempt.attempt, step=d.step, record=False)
        sent, unresolved = [], []
        for message in (call.result.value.messages if call.ok else []):
            (sent if field_resolves(envelope, message.field) else unresolved).append(message.model_dump())
        envelope.messages = sent
        self.roles.record(call, mode=primitive_messages.MODE, envelope=envelope.to_dict(),
                          **({"unresolved_messages": unresolved} if unresolved else {}))

    def verify(self, turn: TurnState, attempt: Attempt, dispatches: list[Dispatch]) -> VerifierOutput | None:
        """VERIFIER(r_k, π_k, s_k) for one step (with its tool's schema), or the whole
        attempt (every step, no schemas) in the whole-attempt variant."""
        plan_steps = {s.step: s for s in attempt.plan.plan}
        per_step = self.config.verify == "step"
        entries = []
        for d in sorted(dispatches, key=lambda d: list(attempt.results).index(d.step)):
            step = plan_steps[d.step]
            schema = self.primitive_tool(d.target_tool).spec.parameters if per_step else None
            entries.append(verifier.step_entry(
                {"step": step.step, "tool_hint": step.tool_hint, "objective": step.objective},
                d.invocation_request, d.resolved_bindings, attempt.results[d.step].for_input(), schema))
        payload = verifier.build_payload(turn.query, attempt.plan.intent.model_dump(), entries,
                                         conversation=turn.conversation,
                                         clarifications=turn.clarifications)
        call = self._ask(VERIFIER, payload, attempt.attempt, step=dispatches[0].step if per_step else None)
        if not call.ok:
            self._attempt_error(attempt, "verifier", call.result.error)
            return None
        verdict = call.result.value
        attempt.verdicts[verdict.step] = verdict
        self.observe("verdict", {"attempt": attempt.attempt, "verdict": verdict})
        return verdict

    # -- bookkeeping -----------------------------------------------------------------------
    def _attempt_error(self, attempt: Attempt, role: str, error: str) -> None:
        self.observe("parse_error", {"attempt": attempt.attempt, "role": role, "error": error})
        attempt.feedback = f"The {role}'s output could not be used ({error}). Answer with valid JSON in the required form."

    @staticmethod
    def response(attempts: list[Attempt]) -> str:
        """The turn's answer: what each step that ran this turn returned, in order."""
        lines = []
        for a in attempts:
            for s, r in a.results.items():
                if r.reused:  # quoted where it ran
                    continue
                if r.status == "SUCCESS":
                    text = r.result if isinstance(r.result, str) else json.dumps(r.result, ensure_ascii=False, default=str)
                    lines.append(f"{r.tool}: {one_line(text, RESPONSE_RESULT_CHARS)}")
                elif r.status == "FAILURE" and a.verdicts.get(s) is not None and a.verdicts[s].status == "PASS":
                    lines.append(f"{r.tool}: {one_line(r.details, RESPONSE_RESULT_CHARS)}")
        return "\n".join(lines) or "Done."

    @staticmethod
    def failure_report(attempts: list[Attempt]) -> str:
        lines = [f"Could not complete the request after {len(attempts)} attempt(s)."]
        for a in attempts:
            failed = [f"step {s} {r.tool}: {r.failure_type} {r.details}" for s, r in a.results.items()
                      if r.status == "FAILURE"]
            lines.append(f"attempt {a.attempt}: {a.verdict}; {a.feedback or 'no feedback'}"
                         + (f"; failures: {'; '.join(failed)}" if failed else ""))
        return "\n".join(lines)
