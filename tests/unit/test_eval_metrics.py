"""Per-role metrics on hand-made cases: perfect, empty, partly wrong."""

from __future__ import annotations

import pytest

from heart_distill.eval.formats import canonical
from heart_distill.eval.metrics import (
    binding_value,
    planner_scores,
    primitive_scores,
    router_scores,
    summarize,
    verifier_scores,
)


def plan(*tools, status="SUFFICIENT"):
    return {"status": status, "plan": [{"step": i, "tool_hint": t, "dependencies": []} for i, t in enumerate(tools, 1)]}


# -- Planner -----------------------------------------------------------------------------

def test_planner_perfect_and_partly_wrong():
    perfect = planner_scores(plan("ls", "cd"), plan("ls", "cd"))
    assert {k: perfect[k] for k in ("sufficiency_correct", "tool_sequence_em", "tool_tp", "tool_predicted",
                                    "tool_gold")} == {
        "sufficiency_correct": 1, "tool_sequence_em": 1, "tool_tp": 2, "tool_predicted": 2, "tool_gold": 2}
    wrong = planner_scores(plan("ls", "cd"), plan("ls", "mv", "cp"))
    assert wrong["tool_sequence_em"] == 0 and wrong["sufficiency_correct"] == 1
    assert (wrong["tool_tp"], wrong["tool_predicted"], wrong["tool_gold"]) == (1, 3, 2)
    assert planner_scores(plan("ls", "cd"), plan("cd", "ls"))["tool_sequence_em"] == 0  # order matters


def test_planner_empty_and_unparsed():
    ask = {"status": "INSUFFICIENT", "clarification": "which file?"}
    assert planner_scores(ask, dict(ask))["tool_sequence_em"] == 1
    assert planner_scores(ask, plan())["tool_sequence_em"] == 0  # an empty plan is not a question
    missed = planner_scores(plan("ls"), None)
    assert {k: missed[k] for k in ("sufficiency_correct", "tool_sequence_em", "tool_tp", "tool_predicted",
                                   "tool_gold", "step_count_correct")} == {
        "sufficiency_correct": 0, "tool_sequence_em": 0, "tool_tp": 0, "tool_predicted": 0, "tool_gold": 1,
        "step_count_correct": 0}


def test_planner_figures_by_plan_length_beside_the_first_tool_baseline():
    shown = ["ls", "cd", "mv"]
    rows = [planner_scores(plan("ls"), plan("ls"), shown),              # one step, right; baseline right
            planner_scores(plan("cd"), plan("ls"), shown),              # one step, wrong tool; baseline wrong
            planner_scores(plan("ls", "cd"), plan("ls"), shown),        # two steps written as one
            planner_scores(plan("mv", "ls", "cd"), plan("mv", "ls", "cd"), shown),
            planner_scores({"status": "INSUFFICIENT", "clarification": "which?"}, plan("ls"), shown)]
    for row in rows:
        row.update(valid_output=1, parse_failure=0, prompt_tokens=1, completion_tokens=1, latency_s=0.1)
    figures = summarize("planner", rows)
    assert (figures["one_step_tool_sequence_em"].value, figures["one_step_tool_sequence_em"].n) == (0.5, 2)
    assert (figures["multi_step_tool_sequence_em"].value, figures["multi_step_tool_sequence_em"].n) == (0.5, 2)
    assert figures["one_step_count_accuracy"].value == 1.0 and figures["multi_step_count_accuracy"].value == 0.5
    # "plan one step with the first tool shown": right on one one-step input, never on multi-step ones
    assert figures["one_step_first_tool_baseline_em"].value == 0.5
    assert figures["multi_step_first_tool_baseline_em"].value == 0.0
    assert figures["first_tool_baseline_em"].value == pytest.approx(1 / 5)
    assert figures["step_count_accuracy"].value == pytest.approx(3 / 5)  # the question answered with a plan: wrong
    assert figures["multi_step_share"].value == 0.5 and figures["multi_step_share"].n == 4


def test_planner_summary_micro_precision_recall():
    rows = [{**planner_scores(plan("a", "b"), plan("a", "c")), "valid_output": 1},
            {**planner_scores(plan("a"), plan("a")), "valid_output": 0}]
    for row in rows:
        row.update(parse_failure=0, prompt_tokens=10, completion_tokens=5, latency_s=0.1)
    figures = summarize("planner", rows)
    assert figures["tool_precision"].value == pytest.approx(2 / 3)
    assert figures["tool_recall"].value == pytest.approx(2 / 3)
    assert figures["tool_sequence_em"].value == 0.5 and figures["tool_sequence_em"].n == 2
    assert figures["valid_output_rate"].value == 0.5
    assert figures["prompt_tokens_per_call"].value == 10


# -- Router ------------------------------------------------------------------------------

def dispatch(*bindings, retry=1, priority="normal", timeout=30):
    return {"status": "READY", "dispatch": [
        {"step": i, "target_tool": f"t{i}", "invocation_request": "", "resolved_bindings": b,
         "h_params": {"retry": retry, "priority": priority, "timeout_s": timeout}} for i, b in enumerate(bindings, 1)]}


def test_router_perfect_with_symbolic_references():
    target = dispatch({"path": "a.txt"}, {"content": "$step_1.result.file_content", "n": 3})
    prediction = dispatch({"path": " a.txt"}, {"content": "$step_1.file_content", "n": 3.0})
    assert router_scores(target, prediction) == {"args_matched": 3, "args_total": 3, "steps_matched": 2,
                                                 "steps_total": 2, "hparams_valid": 2, "hparams_total": 2}


def test_router_partly_wrong_and_invalid_hparams():
    target = dispatch({"path": "a.txt", "mode": "r"}, {"content": "$step_1.result.text"})
    prediction = dispatch({"path": "a.txt", "mode": "w"}, {"content": "$step_2.result.text"}, retry=0)
    scores = router_scores(target, prediction)
    assert (scores["args_matched"], scores["args_total"]) == (1, 3)
    assert (scores["steps_matched"], scores["steps_total"]) == (0, 2)
    assert scores["hparams_valid"] == 0  # retry counts attempts: 0 is not in [1, 5]
    extra = router_scores(dispatch({"a": 1}), dispatch({"a": 1, "b": 2}))
    assert extra["args_matched"] == 1 and extra["steps_matched"] == 0  # an invented binding breaks the step


def test_router_unparsed_and_empty():
    assert router_scores(dispatch({"a": 1}), None) == {"args_matched": 0, "args_total": 1, "steps_matched": 0,
                                                       "steps_total": 1, "hparams_valid": 0, "hparams_total": 1}
    empty = router_scores({"status": "READY", "dispatch": []}, {"status": "READY", "dispatch": []})
    assert empty["steps_total"] == 0 and empty["args_total"] == 0


def test_binding_values_compare_references_and_numbers():
    assert binding_value("$step_2.x.y") == "$step_2.result.x.y"
    assert binding_value("$step_2.summary") == "$step_2.summary"
    assert binding_value("see $step_1.x") == "see $step_1.x"  # embedded: compared as text
    assert binding_value(3) == binding_value(3.0) and binding_value(True) != binding_value(1)


def test_router_hparams_validity_rules():
    ok = router_scores(dispatch({}, retry=5, priority="high", timeout=60), dispatch({}, retry=5, priority="high",
                                                                                   timeout=60))
    assert ok["hparams_valid"] == 1
    for bad in (dict(retry=6), dict(priority="urgent"), dict(timeout=2.5), dict(timeout=0)):
        assert router_scores(dispatch({}), dispatch({}, **bad))["hparams_valid"] == 0, bad


# -- Primitive ---------------------------------------------------------------------------

SCHEMA = {"type": "object", "required": ["n", "unit"],
          "properties": {"n": {"type": "integer"}, "unit": {"type": "string", "enum": ["cm", "in"]},
                         "note": {"type": "string"}}}


def call(**arguments):
    return {"tool": "measure", "arguments": arguments}


def test_primitive_exact_match_after_schema_normalisation():
    perfect = primitive_scores(call(n=5, unit="cm"), call(n="5", unit="CM"), SCHEMA)
    assert perfect["arguments_em"] == 1 and perfect["failure_type_correct"] is None
    assert primitive_scores(call(n=5, unit="cm"), call(n=6, unit="cm"), SCHEMA)["arguments_em"] == 0
    assert primitive_scores(call(n=5, unit="cm"), call(n=5, unit="cm", note="x"), SCHEMA)["arguments_em"] == 0
    assert primitive_scores(call(n=5, unit="cm"), None, SCHEMA)["arguments_em"] == 0


def test_primitive_failure_type_accuracy():
    # The target is a binding failure (missing unit): the prediction must fail the same way.
    target = call(n=5)
    assert primitive_scores(target, call(n=7), SCHEMA)["failure_type_correct"] == 1
    wrong = primitive_scores(target, call(n=5, unit="km"), SCHEMA)
    assert wrong["predicted_failure"] == "CONSTRAINT_VIOLATION" and wrong["failure_type_correct"] == 0
    unresolvable = {"status": "UNRESOLVABLE", "tool": "measure", "reason": "no unit"}
    both = primitive_scores(unresolvable, dict(unresolvable), SCHEMA)
    assert both["arguments_em"] == 1 and both["failure_type_correct"] == 1
    # A recorded failure type (RUNTIME_ERROR is only known by executing) wins over binding.
    runtime = primitive_scores(call(n=5, unit="cm"), call(n=5, unit="cm"), SCHEMA, "RUNTIME_ERROR")
    assert runtime["failure_type_correct"] == 0 and runtime["arguments_em"] == 1


def test_primitive_copy_baseline_and_extraction_stratum():
    """The copy baseline answers with the input's bindings; an input binding a whole earlier
    result (an object or list) is an extraction row, where copying cannot score."""
    copied = primitive_scores(call(n=5, unit="cm"), call(n=5, unit="cm"), SCHEMA, bindings={"n": 5, "unit": "cm"})
    assert copied["copy_em"] == 1 and copied["extraction"] == 0 and copied["extraction_em"] is None
    extracted = primitive_scores(call(n=5, unit="cm"), call(n=5, unit="cm"), SCHEMA,
                                 bindings={"n": {"count": 5, "of": "items"}, "unit": "cm"})
    assert extracted["arguments_em"] == 1 and extracted["copy_em"] == 0
    assert extracted["extraction"] == 1 and extracted["extraction_em"] == 1 and extracted["extraction_copy_em"] == 0
    missed = primitive_scores(call(n=5, unit="cm"), call(n=6, unit="cm"), SCHEMA, bindings={"n": [5], "unit": "cm"})
    assert missed["extraction_em"] == 0
    figures = summarize("primitive", [copied, extracted, missed])
    assert figures["copy_baseline_em"].value == pytest.approx(1 / 3)
    assert figures["extraction_arguments_em"].value == 0.5 and figures["extraction_arguments_em"].n == 2
    assert figures["extraction_copy_baseline_em"].value == 0.0
    # without the input's bindings (older callers) the columns are absent, not zero
    assert "copy_em" not in primitive_scores(call(n=5, unit="cm"), None, SCHEMA)



def test_extraction_means_a_result_the_parameter_does_not_take_as_is():
    """A list bound to an array parameter is the argument (BFCL's ``numbers=[87, 65]``), not
    a result to take apart; an object bound to a number is; an untyped parameter counts any
    object or list as a result."""
    from heart_distill.eval.metrics import needs_extraction

    schema = {"type": "object", "properties": {"numbers": {"type": "array"}, "fuel": {"type": "number"},
                                               "options": {"type": "dict"}, "loose": {}}}
    assert not needs_extraction({"numbers": [87, 65, 43]}, schema)
    assert not needs_extraction({"options": {"a": 1}, "fuel": 2.6}, schema)
    assert needs_extraction({"fuel": {"gallon": 2.64}}, schema)
    assert needs_extraction({"numbers": {"result": [1, 2]}}, schema)
    assert needs_extraction({"loose": [1]}, schema) and needs_extraction({"numbers": [1]}, None)
    scored = primitive_scores(call(n=5, unit="cm"), call(n=5, unit="cm"),
                              {**SCHEMA, "properties": {**SCHEMA["properties"], "note": {"type": "array"}}},
                              bindings={"n": 5, "unit": "cm", "note": ["a"]})
    assert scored["extraction"] == 0 and scored["extraction_em"] is None

# -- Verifier ----------------------------------------------------------------------------

def verdict(status, **criteria):
    names = ("task_completion", "argument_consistency", "execution_validity", "constraint_satisfaction")
    return {"status": status, "step": 1, "criteria": {n: criteria.get(n, "pass") for n in names}, "feedback": ""}


def test_verifier_against_the_environment_label():
    fail = verdict("FAIL", execution_validity="fail")
    perfect = verifier_scores(fail, dict(fail), "FAIL")
    assert perfect["verdict_correct"] == 1 and perfect["criterion_execution_validity"] == 1
    # The environment's label wins over the teacher's verdict.
    assert verifier_scores(verdict("PASS"), verdict("PASS"), "FAIL")["verdict_correct"] == 0
    partly = verifier_scores(fail, verdict("FAIL", task_completion="fail"), "FAIL")
    assert partly["verdict_correct"] == 1 and partly["criterion_task_completion"] == 0
    assert partly["criterion_argument_consistency"] == 1
    unparsed = verifier_scores(fail, None, "FAIL")
    assert unparsed["verdict_correct"] == 0 and unparsed["predicted_fail"] == 0 and unparsed["label_fail"] == 1


def test_verifier_fail_precision_recall():
    cases = [("FAIL", "FAIL"), ("FAIL", "PASS"), ("PASS", "FAIL"), ("PASS", "PASS")]  # (prediction, label)
    rows = [{**verifier_scores(verdict(label), verdict(pred), label), "parse_failure": 0, "prompt_tokens": 1,
             "completion_tokens": 1, "latency_s": 0.0} for pred, label in cases]
    figures = summarize("verifier", rows)
    assert figures["verdict_accuracy"].value == 0.5
    assert figures["fail_precision"].value == 0.5 and figures["fail_recall"].value == 0.5
    assert figures["fail_f1"].value == 0.5


def test_summarize_of_no_rows_reports_n_zero():
    figures = summarize("router", [])
    assert figures["binding_step_em"].n == 0 and figures["binding_step_em"].value is None


# -- legacy formats ----------------------------------------------------------------------

def test_canonical_maps_pre_issue_7_outputs_onto_appendix_d_names():
    old_plan = {"status": "SUFFICIENT", "plan": [{"step": 1, "tool": "ls", "depends_on": []}]}
    assert canonical("planner", old_plan)["plan"][0] == {"step": 1, "tool_hint": "ls", "dependencies": []}
    old_dispatch = {"status": "READY", "dispatch": [{"step": 1, "target_tool": "ls", "resolved_bindings": {},
                                                     "h_params": {"retry": 0, "priority": 0, "timeout_s": 10}}]}
    assert canonical("router", old_dispatch)["dispatch"][0]["h_params"] == {"retry": 1, "priority": "normal",
                                                                            "timeout_s": 10}
    old_verdict = {"verdict": "FAIL", "criteria": {"task_completion": False}, "feedback": "x"}
    assert canonical("verifier", old_verdict) == {"status": "FAIL", "criteria": {"task_completion": "fail"},
                                                  "feedback": "x"}
    new = verdict("PASS")
    assert canonical("verifier", new) == new and canonical("verifier", None) is None


def test_paired_difference_pairs_examples_by_key():
    from heart_distill.eval.metrics import paired_difference

    def row(i, em):
        return {"episode_id": "e", "turn": 0, "attempt": 0, "step": i, "arguments_em": em, "errored": False}

    base = [row(1, 0), row(2, 1), row(3, 0), row(4, 0)]
    distilled = [row(1, 1), row(2, 1), row(3, 1), row(4, 0), row(5, 1)]  # step 5 has no base: left out
    diff = paired_difference("primitive", "arguments_em", base, distilled)
    assert diff.value == pytest.approx(0.5) and diff.n == 4
    assert 0.0 <= diff.low <= 0.5 <= diff.high <= 1.0  # differences per pair are 0 or 1
