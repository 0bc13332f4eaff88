"""The gold Primitive: the gold call resolved against the tool's schema, the relevance
verdicts, and the messages to the steps that read a result (the field that holds their
values, found with deepdiff's search)."""

from __future__ import annotations


from typing import Any

from heart.families import CODE_PRIMITIVE
from heart.roles import primitive_messages
from heart.roles.common import whole_parts
from heart_distill.data.gold_teacher.common import gold_how, in_schema_order


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


class PrimitiveAnswers:
    """The gold Primitive's answers (a mixin of :class:`~heart_distill.data.gold_teacher.GoldTeacher`)."""

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
        arguments = in_schema_order(call.arguments, list(p["tool"]["parameters"].get("properties", {})))
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
