"""The gold teacher's faults: injected ones (schema faults that fail binding, semantic
faults that execute with a plausible wrong value from the task's own context) and natural
ones (another model's Primitive answer, executed as it is), so the traces hold real
failures, real Verifier FAILs and real recoveries."""

from __future__ import annotations

import json
from typing import Any

from heart.roles.common import is_clipped
from heart.roles.registry import get_role
from heart.runtime.base import SamplingConfig
from heart_distill.data.gold_teacher.common import DATE, TurnState, value_text


SCHEMA_FAULTS = ("wrong_argument", "wrong_tool", "missing_argument", "stale_reference")
"""Faults that fail binding or resolution: visible failures without side effects."""
SEMANTIC_FAULTS = ("semantic_value",)
"""Faults that bind and may execute cleanly, but with a plausible wrong value."""
FAULT_KINDS = SCHEMA_FAULTS + SEMANTIC_FAULTS
SEMANTIC_SHARE = 0.85
"""Share of injected faults that are semantic."""
NATURAL = "natural"
"""The fault of a step whose Primitive answer came from the student and differs from gold."""


class FaultAnswers:
    """The faults a gold answer carries (a mixin of :class:`~heart_distill.data.gold_teacher.GoldTeacher`)."""

    def _maybe_fault(self, state: TurnState) -> str | None:
        if state.faults >= self.max_faults_per_turn or self.rng.random() >= self.fault_rate:
            return None
        state.faults += 1
        if self.rng.random() < SEMANTIC_SHARE:
            return "semantic_value"
        return self.rng.choice(SCHEMA_FAULTS)

    def _router_fault(self, state: TurnState, step: int, bindings: dict[str, Any]) -> dict[str, Any] | None:
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

    def _student_primitive(self, state: TurnState, step: int, p: dict[str, Any],
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
            elif isinstance(value, str) and DATE.match(value):
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

    def _natural_differences(self, state: TurnState, step: int, tool: str, used: dict[str, Any],
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
                differs.append((name, f"{name} was {value_text(used[name])} but the request asked for "
                                      f"{value_text(value)}" if literal else
                                f"{name} was {value_text(used[name])}, which the request does not give"))
        for name, value in used.items():
            if name not in gold and value != props.get(name, {}).get("default", object()):
                differs.append((name, f"{name} was given, which the request does not ask for"))
        # a reason whose quoted value reads as a cut clause (e.g. a placeholder "...") says less, whole
        return [(name, reason if not is_clipped(reason) else f"{name} differs from what the request asked")
                for name, reason in differs]
