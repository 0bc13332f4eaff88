"""Per-role metrics: a target answer (the teacher's) against a prediction (the model's).

Each ``<role>_scores`` function is pure: it takes parsed outputs in the Appendix D names
(:mod:`eval.formats`; ``prediction`` is None when the model's answer did not parse) and
returns the per-example columns; :func:`summarize` turns a role's rows into its figures,
each with a bootstrap 95% interval and n (:mod:`eval.stats`).

- Planner: valid-output rate, sufficiency decision accuracy, tool-sequence exact match,
  tool precision / recall / F1 (micro, over tool multisets), step-count accuracy; the
  exact match and step-count accuracy again on one-step and on multi-step gold plans, each
  beside the trivial one-step Planner that takes the first tool it is shown;
- Router: per-argument and per-step exact match of bindings (``$step_j.field`` references
  compared symbolically: ``$step_1.x`` is ``$step_1.result.x``, as the loop resolves it),
  h-params validity (retry in [1, 5], priority low | normal | high, integer timeout_s > 0);
- Primitive: exact match of arguments after schema normalisation (the loop's own binding:
  coercion, enum matching, defaults; a code primitive's expression, whitespace aside),
  failure-type accuracy (the outcome of binding the prediction vs the target's, on examples
  whose target is a failure);
- Verifier: verdict accuracy against the environment's label, precision / recall / F1 with
  FAIL as the positive class, per-criterion accuracy against the teacher's criteria;
- every role: parse-failure rate, prompt and completion tokens per call, latency per call.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable

import numpy as np

from heart_distill.data.gold_teacher import NATURAL
from heart_distill.eval.formats import CRITERIA, PRIORITIES
from heart_distill.eval.stats import Estimate, bootstrap, micro_prf, ratio

HEADLINE = {"planner": "tool_sequence_em", "router": "binding_step_em",
            "primitive": "arguments_em", "verifier": "verdict_accuracy"}
"""Each role's primary held-out metric (the one the report leads with)."""


# -- Planner -----------------------------------------------------------------------------

def plan_tools(output: dict[str, Any] | None, code_steps: bool = True) -> list[str]:
    """The tools a Planner answer's plan calls, in step order; none unless it is SUFFICIENT
    (``code_steps=False``: the Code primitive's steps left out, as the gold calls hold none)."""
    if not output or output.get("status") != "SUFFICIENT":
        return []
    return [step.get("tool_hint") for step in output.get("plan") or []
            if code_steps or step.get("family", "tool") != "code"]


def planner_scores(target: dict[str, Any], prediction: dict[str, Any] | None,
                   shown: list[str] | None = None) -> dict[str, Any]:
    """The Planner's columns, and by the gold plan's length (one step, or two and more; a
    clarification is in neither stratum) the same figures beside the trivial Planner that
    plans one step with the first tool it is shown (``shown``, the input's tool hints in
    order): a metric that rule satisfies on a stratum measures nothing there."""
    gold, predicted = plan_tools(target), plan_tools(prediction)
    overlap = sum((Counter(gold) & Counter(predicted)).values())
    same_status = prediction is not None and prediction.get("status") == target.get("status")
    em = int(same_status and gold == predicted)
    step_count = int(same_status and len(gold) == len(predicted))
    sufficient = target.get("status") == "SUFFICIENT"
    first_tool = int(sufficient and shown is not None and gold == list(shown[:1]))
    one, multi = sufficient and len(gold) == 1, len(gold) >= 2

    def stratum(value: int, inside: bool) -> int | None:
        return value if inside else None

    return {
        "sufficiency_correct": int(same_status),
        "tool_sequence_em": em,
        "tool_tp": overlap, "tool_predicted": len(predicted), "tool_gold": len(gold),
        "step_count_correct": step_count, "first_tool_em": first_tool if shown is not None else None,
        "one_step_em": stratum(em, one), "multi_step_em": stratum(em, multi),
        "one_step_count_correct": stratum(step_count, one), "multi_step_count_correct": stratum(step_count, multi),
        "one_step_first_tool_em": stratum(first_tool, one and shown is not None),
        "multi_step_first_tool_em": stratum(first_tool, multi and shown is not None),
        "multi_step_gold": int(multi) if sufficient else None,
    }


# -- Router ------------------------------------------------------------------------------

def _reference(text: str) -> str | None:
    """A whole-string ``$step_j.path`` in the loop's resolved form, else None."""
    from heart.primitives import _ENVELOPE_KEYS, REFERENCE

    match = REFERENCE.fullmatch(text.strip())
    if not match:
        return None
    path = [p for p in match.group(2).split(".") if p]
    if not path or path[0] not in _ENVELOPE_KEYS:
        path = ["result", *path]  # the loop reads a bare field from the step's result
    return f"$step_{int(match.group(1))}." + ".".join(path)


def binding_value(value: Any) -> Any:
    """A binding as compared: references resolved symbolically, strings stripped, numbers
    compared by value (3 == 3.0), containers element-wise."""
    if isinstance(value, str):
        return _reference(value) or value.strip()
    if isinstance(value, bool):
        return ("bool", value)  # True is not the number 1 here, though Python says True == 1
    if value is None:
        return value
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, list):
        return [binding_value(v) for v in value]
    if isinstance(value, dict):
        return {k: binding_value(v) for k, v in value.items()}
    return value


def hparams_valid(h: Any) -> bool:
    if not isinstance(h, dict):
        return False
    retry, priority, timeout = h.get("retry"), h.get("priority"), h.get("timeout_s")
    return (isinstance(retry, int) and not isinstance(retry, bool) and 1 <= retry <= 5
            and priority in PRIORITIES
            and isinstance(timeout, (int, float)) and not isinstance(timeout, bool)
            and float(timeout).is_integer() and timeout > 0)


def router_scores(target: dict[str, Any], prediction: dict[str, Any] | None) -> dict[str, Any]:
    gold = {d["step"]: d for d in target.get("dispatch") or []}
    predicted = {d.get("step"): d for d in (prediction or {}).get("dispatch") or []}
    args_matched = args_total = steps_matched = 0
    for step, entry in gold.items():
        want = {k: binding_value(v) for k, v in (entry.get("resolved_bindings") or {}).items()}
        other = predicted.get(step)
        got = {k: binding_value(v) for k, v in ((other or {}).get("resolved_bindings") or {}).items()}
        args_total += len(want)
        args_matched += sum(1 for k, v in want.items() if k in got and got[k] == v)
        same_tool = other is not None and other.get("target_tool") == entry.get("target_tool")
        steps_matched += int(same_tool and got == want)
    entries = list(predicted.values()) if prediction is not None else []
    return {
        "args_matched": args_matched, "args_total": args_total,
        "steps_matched": steps_matched, "steps_total": len(gold),
        "hparams_valid": sum(hparams_valid(e.get("h_params")) for e in entries),
        # A prediction that did not parse has none valid out of the steps it had to dispatch.
        "hparams_total": len(entries) if prediction is not None else len(gold),
    }


# -- Primitive ---------------------------------------------------------------------------

NO_FAILURE = "NONE"


def bind_outcome(output: dict[str, Any], schema: dict[str, Any]) -> tuple[str, dict[str, Any] | None]:
    """(failure type or NONE, the schema-normalised arguments) for a Primitive answer, by
    the loop's own binding; UNRESOLVABLE is a SCHEMA_RESOLUTION failure, as the loop has it."""
    from heart.primitives import SCHEMA_RESOLUTION, BindingError, bind_arguments

    if output.get("status") == "UNRESOLVABLE":
        return SCHEMA_RESOLUTION, None
    if output.get("family") == "code":  # a code primitive's answer: its expression, spacing aside
        expression = output.get("expression")
        if not isinstance(expression, str) or not expression.strip():
            return SCHEMA_RESOLUTION, None
        return NO_FAILURE, {"expression": " ".join(expression.split())}
    try:
        return NO_FAILURE, bind_arguments(output.get("arguments") or {}, schema)
    except BindingError as err:
        return err.failure_type, None


_CONTAINER_TYPES = {list: ("array", "tuple"), dict: ("object", "dict")}
"""The parameter types (JSON Schema's and BFCL's names) that take a list or a dict as is."""


def needs_extraction(bindings: dict[str, Any], schema: dict[str, Any] | None = None) -> bool:
    """Whether a Primitive input binds an earlier step's whole result to a parameter that
    does not take it as is: an object or a list where the tool's ``schema`` declares another
    type (``{"gallon": 2.64}`` for a number). The Primitive must take the value out; copying
    the binding cannot be right. A list bound to an array parameter (``numbers=[87, 65]``) is
    the argument itself, not a result to take apart. A parameter without a declared type
    counts any object or list as a result."""
    properties = (schema or {}).get("properties") or {}
    for name, value in bindings.items():
        for container, accepted in _CONTAINER_TYPES.items():
            if isinstance(value, container) and (properties.get(name) or {}).get("type") not in accepted:
                return True
    return False


def primitive_scores(target: dict[str, Any], prediction: dict[str, Any] | None,
                     schema: dict[str, Any], target_failure: str | None = None,
                     bindings: dict[str, Any] | None = None) -> dict[str, Any]:
    """``target_failure`` is the failure type the loop recorded for the target, when the
    dataset carries it (RUNTIME_ERROR is only known by executing); else it is derived by
    binding the target's arguments. ``bindings``, the input's resolved bindings, give the
    copy baseline (answering with them unchanged) and the extraction stratum
    (:func:`needs_extraction`): on an input whose answer is its bindings, copying scores."""
    derived, want = bind_outcome(target, schema)
    target_type = target_failure or derived
    if prediction is None:
        predicted_type, got = "UNPARSED", None
    else:
        predicted_type, got = bind_outcome(prediction, schema)
    if target.get("status") == "UNRESOLVABLE":
        em = prediction is not None and prediction.get("status") == "UNRESOLVABLE"
    else:
        em = want is not None and got is not None and binding_value(got) == binding_value(want)
    row = {
        "arguments_em": int(em),
        "target_failure": target_type, "predicted_failure": predicted_type,
        "failure_type_correct": None if target_type == NO_FAILURE else int(predicted_type == target_type),
    }
    if bindings is not None and target.get("family") != "code":
        _, copied = bind_outcome({"arguments": bindings}, schema)
        copy_em = int(want is not None and copied is not None and binding_value(copied) == binding_value(want))
        extraction = needs_extraction(bindings, schema)
        row.update(copy_em=copy_em, extraction=int(extraction),
                   extraction_em=int(em) if extraction else None,
                   extraction_copy_em=copy_em if extraction else None)
    return row


# -- Verifier ----------------------------------------------------------------------------

def verifier_scores(target: dict[str, Any], prediction: dict[str, Any] | None,
                    label: str | None = None, fault_kind: str | None = None) -> dict[str, Any]:
    """``label`` is the environment's verdict for the step (the dataset's label column);
    without one the teacher's status stands in. ``fault_kind`` (the dataset's column) splits
    the FAIL inputs into natural ones (a model's real mistake) and injected ones."""
    label = label or target.get("status")
    status = (prediction or {}).get("status")
    natural = label == "FAIL" and fault_kind == NATURAL
    injected = label == "FAIL" and fault_kind is not None and not natural
    row: dict[str, Any] = {
        "verdict_correct": int(status == label),
        "predicted_fail": int(status == "FAIL"), "label_fail": int(label == "FAIL"),
        "natural_fail": int(natural) if label == "FAIL" and fault_kind is not None else None,
        "natural_fail_correct": int(status == label) if natural else None,
        "injected_fail_correct": int(status == label) if injected else None,
    }
    want, got = target.get("criteria") or {}, (prediction or {}).get("criteria") or {}
    for name in CRITERIA:
        row[f"criterion_{name}"] = int(name in got and got.get(name) == want.get(name)) if name in want else None
    return row


# -- aggregation -------------------------------------------------------------------------

def _column(rows: list[dict[str, Any]], *names: str) -> np.ndarray:
    """Rows where every named column is present (not None), as an (n, len(names)) array."""
    kept = [[row[n] for n in names] for row in rows if all(row.get(n) is not None for n in names)]
    return np.asarray(kept, dtype=float).reshape(len(kept), len(names))


def _prf(index: int) -> Callable[[np.ndarray], float]:
    return lambda data: micro_prf(data)[index]


def _fail_prf(index: int) -> Callable[[np.ndarray], float]:
    def statistic(data: np.ndarray) -> float:
        predicted, label = data[:, 0], data[:, 1]
        return micro_prf(np.stack([predicted * label, predicted, label], axis=1))[index]
    return statistic


def _mean(name: str):
    return (name,), lambda data: float(data[:, 0].mean())


METRICS: dict[str, dict[str, tuple[tuple[str, ...], Callable[[np.ndarray], float]]]] = {
    "planner": {
        "valid_output_rate": _mean("valid_output"),
        "sufficiency_accuracy": _mean("sufficiency_correct"),
        "tool_sequence_em": _mean("tool_sequence_em"),
        "tool_precision": (("tool_tp", "tool_predicted", "tool_gold"), _prf(0)),
        "tool_recall": (("tool_tp", "tool_predicted", "tool_gold"), _prf(1)),
        "tool_f1": (("tool_tp", "tool_predicted", "tool_gold"), _prf(2)),
        "step_count_accuracy": _mean("step_count_correct"),
        "first_tool_baseline_em": _mean("first_tool_em"),
        "multi_step_share": _mean("multi_step_gold"),
        # by the gold plan's length: one step, two or more (BFCL parallel / parallel_multiple
        # answers, multi-step turns); the "first tool" baseline plans one step, so it is 0 on
        # the second stratum by construction and the ceiling of "always one step" on the first
        "one_step_tool_sequence_em": _mean("one_step_em"),
        "one_step_count_accuracy": _mean("one_step_count_correct"),
        "one_step_first_tool_baseline_em": _mean("one_step_first_tool_em"),
        "multi_step_tool_sequence_em": _mean("multi_step_em"),
        "multi_step_count_accuracy": _mean("multi_step_count_correct"),
        "multi_step_first_tool_baseline_em": _mean("multi_step_first_tool_em"),
    },
    "router": {
        "binding_argument_em": (("args_matched", "args_total"), ratio),
        "binding_step_em": (("steps_matched", "steps_total"), ratio),
        "hparams_validity": (("hparams_valid", "hparams_total"), ratio),
    },
    "primitive": {
        "arguments_em": _mean("arguments_em"),
        "copy_baseline_em": _mean("copy_em"),
        "extraction_share": _mean("extraction"),
        "extraction_arguments_em": _mean("extraction_em"),
        "extraction_copy_baseline_em": _mean("extraction_copy_em"),
        "failure_type_accuracy": _mean("failure_type_correct"),
    },
    "verifier": {
        "verdict_accuracy": _mean("verdict_correct"),
        "fail_precision": (("predicted_fail", "label_fail"), _fail_prf(0)),
        "fail_recall": (("predicted_fail", "label_fail"), _fail_prf(1)),
        "fail_f1": (("predicted_fail", "label_fail"), _fail_prf(2)),
        "natural_fail_share": _mean("natural_fail"),
        "natural_fail_accuracy": _mean("natural_fail_correct"),
        "injected_fail_accuracy": _mean("injected_fail_correct"),
        **{f"criterion_{c}_accuracy": _mean(f"criterion_{c}") for c in CRITERIA},
    },
}
"""Per role: metric name → (the per-example columns it reads, the statistic over them)."""

COMMON = {
    "parse_failure_rate": _mean("parse_failure"),
    "prompt_tokens_per_call": _mean("prompt_tokens"),
    "completion_tokens_per_call": _mean("completion_tokens"),
    "latency_s_per_call": _mean("latency_s"),
}
"""Figures every role reports (from the per-call columns the evaluator adds)."""

CLARIFICATION_RATES = ("clarification_precision", "clarification_recall")
"""The end-to-end clarification figures that are shares (:func:`clarification_figures`)."""
CLARIFICATION_FIGURES = (*CLARIFICATION_RATES, "clarifications_asked_per_task", "clarifications_needed_per_task")
"""Every end-to-end clarification figure, in the order reports list them."""

RATES = {name for role in METRICS.values() for name in role} | {"parse_failure_rate", *CLARIFICATION_RATES}
"""Figures that are shares in [0, 1] (reported in percent); the rest are raw quantities."""


def summarize(role: str, rows: list[dict[str, Any]], seed: int = 0) -> dict[str, Estimate]:
    """Every figure of ``role`` over its per-example rows, each with interval and n.

    The interval resamples examples (the unit the figure is an average over): for micro
    figures such as precision, whole examples with all their tools or arguments.
    """
    figures = {}
    for name, (columns, statistic) in {**METRICS[role], **COMMON}.items():
        figures[name] = bootstrap(_column(rows, *columns), statistic, seed=seed)
    return figures


def _example_key(row: dict[str, Any]) -> tuple:
    return (row.get("episode_id"), row.get("turn"), row.get("attempt"), row.get("step"))


def paired_difference(role: str, metric: str, base_rows: list[dict[str, Any]], other_rows: list[dict[str, Any]],
                      seed: int = 0) -> Estimate:
    """``metric`` of ``other_rows`` minus that of ``base_rows`` on the examples both scored,
    with a paired bootstrap interval (the same examples resampled for both sides)."""
    columns, statistic = {**METRICS[role], **COMMON}[metric]
    base = {_example_key(r): r for r in base_rows if not r.get("errored")}
    other = {_example_key(r): r for r in other_rows if not r.get("errored")}
    common = [k for k in base if k in other
              and all(base[k].get(c) is not None and other[k].get(c) is not None for c in columns)]
    width = len(columns)
    data = np.asarray([[base[k][c] for c in columns] + [other[k][c] for c in columns] for k in common],
                      dtype=float).reshape(len(common), 2 * width)
    return bootstrap(data, lambda d: statistic(d[:, width:]) - statistic(d[:, :width]), seed=seed)


# -- clarifications (end to end) -----------------------------------------------------------

def clarification_counts(checker: dict[str, Any] | None) -> tuple[int, int, int] | None:
    """(turns asked when needed, turns asked, turns needing a question) of one episode, from
    the ``clarifications`` record its environment's score holds (``needed``: the turns the
    agent ran whose request withholds a parameter, BFCL miss_param; ``asked``: the turns in
    which the Planner asked the user); None when the environment keeps no such record."""
    record = (checker or {}).get("clarifications")
    if not isinstance(record, dict):
        return None
    needed, asked = set(record.get("needed") or []), set(record.get("asked") or [])
    return len(needed & asked), len(asked), len(needed)


def clarification_figures(rows: list[dict[str, Any]], seed: int = 0) -> dict[str, dict[str, Any]]:
    """Clarification precision (the turns where the Planner asked that needed it) and recall
    (the turns needing it where it asked), micro over turns, with bootstrap intervals over
    tasks (a task's seeds pooled), beside the questions asked and needed per task; from the
    end-to-end rows (``checker`` of each episode, errored ones left out). Precision's n
    counts the tasks with a question asked, recall's the tasks with a turn needing one
    (None without any). {} when no episode's environment records clarifications (AgentDojo)."""
    by_task: dict[str, list[tuple[int, int, int]]] = {}
    for row in rows:
        counts = None if row.get("errored") else clarification_counts(row.get("checker"))
        if counts is not None:
            by_task.setdefault(row["task_id"], []).append(counts)
    if not by_task:
        return {}
    totals = np.asarray([np.sum(runs, axis=0) for runs in by_task.values()], dtype=float).reshape(len(by_task), 3)
    means = np.asarray([np.mean(runs, axis=0) for runs in by_task.values()], dtype=float).reshape(len(by_task), 3)
    asked, needed = totals[totals[:, 1] > 0], totals[totals[:, 2] > 0]  # the tasks each ratio is over
    return {
        "clarification_precision": bootstrap(asked[:, [0, 1]], ratio, seed=seed).to_dict(),
        "clarification_recall": bootstrap(needed[:, [0, 2]], ratio, seed=seed).to_dict(),
        "clarifications_asked_per_task": bootstrap(means[:, 1], seed=seed).to_dict(),
        "clarifications_needed_per_task": bootstrap(means[:, 2], seed=seed).to_dict(),
    }
