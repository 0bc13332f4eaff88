"""The gold Planner: plans of what is left of the turn's gold calls with the tools it was
shown, sub-goals in the sub-goals form, and the clarification question in a turn that
withholds a parameter (BFCL miss_param)."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any, Sequence

from heart.environments.base import ToolCall
from heart.families import CODE_CATEGORY, CODE_PRIMITIVE
from heart.grounding import grounded, literals
from heart.roles import planner
from heart.roles.common import first_clause, is_clipped, lead_phrase, whole_parts
from heart_distill.data.gold_teacher.common import MAX_CONSTRAINTS, OBJECTIVE_CHARS, PURPOSE_CHARS, SUBGOAL_PURPOSE_CHARS, TASK_CHARS, TurnState, as_sentence, code_objective, purpose_phrase, request_sentence


def telling_arguments(call: ToolCall, plan_calls: Sequence[ToolCall]) -> set[str]:
    """The arguments of ``call`` whose values differ among the plan's calls of the same tool.
    A step's objective keeps only the parts that fit its length; the parts that tell two calls
    apart ("time=4" against "time=10" beside a shared "b_field=5, area=2") go first, or the
    steps read alike and a Router binds them alike."""
    same_tool = [c.arguments for c in plan_calls if c.name == call.name]
    return {name for name in call.arguments
            if len({json.dumps(arguments.get(name), sort_keys=True, default=str) for arguments in same_tool}) > 1}


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


class PlannerAnswers:
    """The gold Planner's answers (a mixin of :class:`~heart_distill.data.gold_teacher.GoldTeacher`)."""

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
        state = self._current = self._turns.setdefault(turn, TurnState(turn))
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
        plan, parts = [], {}
        for i, call in enumerate(state.plan_calls, 1):
            if call.name == CODE_PRIMITIVE:
                plan.append({"step": i, "family": "code", "tool_category": CODE_CATEGORY, "tool_hint": CODE_PRIMITIVE,
                             "objective": code_objective(call.arguments["objective"]),
                             "dependencies": sorted({self._plan_step(state, j) for j in call.arguments["inputs"].values()})})
                continue
            tool = shown[call.name]
            telling = telling_arguments(call, state.plan_calls)
            told = self._args_parts({k: v for k, v in call.arguments.items() if k in telling}, text)
            parts[i] = told + self._args_parts({k: v for k, v in call.arguments.items() if k not in telling}, text)
            plan.append({"step": i, "tool_category": tool.get("category", ""), "tool_hint": call.name,
                         "objective": self._telling_objective(call.name, tool["description"], told, parts[i]),
                         "dependencies": [i - 1] if i > 1 else []})
        read_alike = Counter((s["tool_hint"], s["objective"]) for s in plan if s.get("family") != "code")
        for step in plan:  # steps that still read alike (values the request words otherwise: 1.5% for
            # 0.015, lists, results of earlier steps) say which of the tool's calls they are
            if read_alike[step["tool_hint"], step["objective"]] > 1:
                same_tool = [s["step"] for s in plan if s["tool_hint"] == step["tool_hint"]]
                call_of_n = f"call {same_tool.index(step['step']) + 1} of {len(same_tool)}"
                step["objective"] = self._telling_objective(step["tool_hint"], shown[step["tool_hint"]]["description"],
                                                            [call_of_n], [call_of_n, *parts[step["step"]]])
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
            (shown[c.name]["description"] if c.name in shown else purpose_phrase(self._description(c.name), PURPOSE_CHARS))
            or c.name.replace("_", " ") for c in remaining))
        task = whole_parts(purposes, lambda kept: as_sentence(", then ".join(kept)), TASK_CHARS) \
            or "Answer without tools."
        intent = {
            "task": task,
            "objective": first_clause(request_sentence(query), OBJECTIVE_CHARS) or task,
            "tool_categories": sorted({s["tool_category"] for s in plan}),
            "constraints": list(dict.fromkeys(constraints))[:MAX_CONSTRAINTS],
        }
        answer = {"status": "SUFFICIENT", "intent": intent, "plan": plan, "replanned": bool(p.get("feedback"))}
        if planner.asks_for_subgoals(p):  # the sub-goals form: what was asked, one per step, before the plan
            answer = {"status": "SUFFICIENT", "intent": intent,
                      "subgoals": [self._subgoal(call, state.plan_calls, shown, text) for call in state.plan_calls],
                      "plan": plan, "replanned": answer["replanned"]}
        return answer, meta

    def _telling_objective(self, tool: str, description: str, told: list[str], parts: list[str]) -> str:
        """A step's objective (:meth:`_step_objective`) that keeps every part of ``told`` (what
        tells the call from the plan's other calls of its tool) where the tool's name in words,
        shorter than its description, leaves room for them."""
        objective = self._step_objective(tool, description, parts)
        if any(part not in objective for part in told):
            shorter = self._step_objective(tool, tool.rsplit(".", 1)[-1].replace("_", " "), parts)
            if sum(part in shorter for part in told) > sum(part in objective for part in told):
                return shorter
        return objective

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
    def _plan_step(state: TurnState, index: int) -> int:
        """The current plan's step number of the turn's call ``index``."""
        return state.plan_indices.index(index) + 1
