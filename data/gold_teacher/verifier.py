"""The gold Verifier: each step judged against its gold call, FAIL when it deviates, with
criteria per fault kind and feedback written from the Verifier's own input."""

from __future__ import annotations

from typing import Any

from heart.primitives import BindingError, bind_arguments
from heart.roles import verifier
from heart.roles.common import first_clause, is_clipped, whole_parts
from heart_distill.data.gold_teacher.common import DETAILS_CHARS, PURPOSE_CHARS, purpose_phrase, value_text
from heart_distill.data.gold_teacher.faults import NATURAL


class VerifierAnswers:
    """The gold Verifier's answers (a mixin of :class:`~heart_distill.data.gold_teacher.GoldTeacher`)."""

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
            reasons.append(f"{k} was {value_text(used[k])} but the request asked for {value_text(asked[k])}")
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
            todo = list(dict.fromkeys(purpose_phrase(self._description(c.name), PURPOSE_CHARS) or c.name for c in left))
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
