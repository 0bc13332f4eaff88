"""The gold Router: binds a gold value literally only where its input holds it, else refers
to the previous step's result; plan mode (the whole plan) and step mode (one step)."""

from __future__ import annotations

import json
from typing import Any

from heart.environments.base import ToolCall
from heart.families import CODE_PRIMITIVE
from heart.grounding import grounded
from heart.roles import router
from heart_distill.data.gold_teacher.common import TurnState, code_objective, h_params, in_schema_order, same_value


class RouterAnswers:
    """The gold Router's answers (a mixin of :class:`~heart_distill.data.gold_teacher.GoldTeacher`)."""

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
                                                                    code_objective(objective)),
                    "resolved_bindings": bindings, "h_params": h_params(CODE_PRIMITIVE)})
                continue
            params = p["tools"].get(call.name, {})
            call = ToolCall(call.name, in_schema_order(call.arguments, params.get("required", []) + params.get("optional", [])))
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

    def _code_bindings(self, state: TurnState, call: ToolCall) -> dict[str, str]:
        """A code step's bindings: each input of its computation, the whole result it reads."""
        return {name: f"$step_{self._plan_step(state, j)}.result" for name, j in call.arguments["inputs"].items()}

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
        call = ToolCall(call.name, in_schema_order(call.arguments, params.get("required", []) + params.get("optional", [])))
        stated = json.dumps({k: v for k, v in p.items() if k not in ("upstream", "plan", "tools")}, ensure_ascii=False)
        upstream = p["upstream"]
        bindings: dict[str, Any] = {}
        for name, value in call.arguments.items():
            if grounded(value, stated) or not upstream:
                bindings[name] = value
                continue
            exact = next((f"$step_{u['step']}.{path}" for u in upstream for path, shown in u["fields"].items()
                          if same_value(shown, value)), None)
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
