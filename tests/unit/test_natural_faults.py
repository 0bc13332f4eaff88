"""Natural faults: a student model's own Primitive answers, executed and judged by the gold teacher.

The student here is a scripted backend (the logic under test is the teacher's, not a
model's); `heart collect --student base` runs the embedded model the same way.
"""

import json

import pytest

from heart.environments import load_environment
from heart.episode import run_episode
from heart.roles.common import role_input
from heart.runtime.scripted import ScriptedBackend
from heart.roles.common import render_answer
from heart_distill.data.gold_teacher import NATURAL, GoldTeacher
from heart.traces import TraceWriter, read_trace
from heart_distill.eval.metrics import summarize, verifier_scores
from heart_distill.eval.roles import balanced_sample, natural_fails_in_turn


def copying_student(role, messages):
    """Answers a Primitive input with its bindings as they are (references included)."""
    assert role == "primitive"
    payload = role_input(messages)
    return json.dumps({"tool": payload["tool"]["name"], "arguments": payload["resolved_bindings"]})


def run(environment, task_id, path, student, rate=1.0, fault_rate=0.0):
    task = environment.load_task(task_id)
    teacher = GoldTeacher(task, environment.catalog(), fault_rate=fault_rate, student=student, student_rate=rate,
                          student_name="copier")
    with TraceWriter(path, fsync=False) as trace:
        record = run_episode(environment, task, teacher, trace=trace, seed=0).record
    return record, [r for r in read_trace(path) if r["kind"] == "event"], teacher


@pytest.fixture(scope="module")
def bfcl():
    return load_environment("bfcl")


def test_a_student_answer_that_differs_is_executed_and_judged_natural(bfcl, tmp_path):
    record, events, teacher = run(bfcl, "multi_turn_base_20", tmp_path / "t.jsonl", ScriptedBackend(copying_student))
    assert teacher.name == "gold+natural1-copier"
    asked = [e for e in events if e["role"] == "primitive" and e["extra"].get("student")]
    assert asked, "the student was never asked"
    differed = [e for e in asked if e["extra"]["student"] == "differed"]
    agreed = [e for e in asked if e["extra"]["student"] == "agreed"]
    assert differed and agreed  # copying is right where the bindings are the answer, wrong elsewhere
    for e in differed:  # executed as the student wrote it
        assert e["extra"]["injected_fault"] == NATURAL
        assert e["raw_output"] == copying_student("primitive", e["messages"])
    for e in agreed:  # the gold rendering, indistinguishable from a step without a student
        gold = {"tool": e["parsed"]["tool"], "arguments": e["parsed"]["arguments"]}
        assert e["raw_output"] == render_answer(gold) and "injected_fault" not in e["extra"]
    natural = [e for e in events if e["role"] == "verifier" and e["extra"].get("fault_kind") == NATURAL]
    assert natural and all(e["parsed"]["status"] == "FAIL" for e in natural)
    assert all(e["parsed"]["feedback"] and "…" not in e["parsed"]["feedback"] for e in natural)
    assert record.success  # one fault per turn: the re-plan runs the gold calls and the turn passes


def test_a_malformed_student_answer_is_a_recorded_failure(bfcl, tmp_path):
    record, events, _ = run(bfcl, "multi_turn_base_0", tmp_path / "t.jsonl",
                            ScriptedBackend(lambda role, messages: "not an answer"))
    broken = [e for e in events if e["role"] == "primitive" and e["extra"].get("student") == "differed"]
    assert broken and all(e["parse_error"] and e["raw_output"] == "not an answer" for e in broken)
    verdicts = [e for e in events if e["role"] == "verifier" and e["extra"].get("fault_kind") == NATURAL]
    assert verdicts and all(e["parsed"]["criteria"]["execution_validity"] == "fail" for e in verdicts)
    assert not record.errored and record.success


def test_without_a_student_the_injected_faults_are_unchanged(bfcl, tmp_path):
    never = ScriptedBackend(lambda role, messages: pytest.fail("a student at rate 0 is never asked"))
    _, plain, _ = run(bfcl, "multi_turn_base_1", tmp_path / "a.jsonl", None, rate=0.0, fault_rate=0.5)
    _, zero, teacher = run(bfcl, "multi_turn_base_1", tmp_path / "b.jsonl", never, rate=0.0, fault_rate=0.5)
    assert teacher.name == "gold+faults0.5"
    assert [e["raw_output"] for e in plain] == [e["raw_output"] for e in zero]


def test_student_options_are_checked():
    from heart_distill.data.teachers import TeacherFactory

    with pytest.raises(ValueError, match="go together"):
        TeacherFactory("gold", 0.3, environment=None, student="base", student_rate=0.0)
    with pytest.raises(ValueError, match="gold teacher only"):
        TeacherFactory("openai:http://localhost:1#m", 0.0, environment=None, student="base", student_rate=0.5)
    with pytest.raises(ValueError, match="student_rate"):
        GoldTeacher(load_environment("bfcl").load_task("multi_turn_base_0"), [], student=object(), student_rate=2.0)


def test_verifier_accuracy_is_split_by_natural_and_injected_fails():
    fail = {"status": "FAIL", "criteria": {}}
    rows = [verifier_scores(fail, {"status": "FAIL"}, "FAIL", NATURAL),
            verifier_scores(fail, {"status": "PASS"}, "FAIL", NATURAL),
            verifier_scores(fail, {"status": "FAIL"}, "FAIL", "semantic_value"),
            verifier_scores({"status": "PASS"}, {"status": "PASS"}, "PASS", "none")]
    figures = summarize("verifier", rows)
    assert figures["natural_fail_accuracy"].value == 0.5 and figures["natural_fail_accuracy"].n == 2
    assert figures["injected_fail_accuracy"].value == 1.0 and figures["injected_fail_accuracy"].n == 1
    assert figures["natural_fail_share"].value == pytest.approx(2 / 3)
    assert figures["verdict_accuracy"].value == 0.75


def test_a_balanced_sample_takes_natural_and_injected_fails_in_turn():
    rows = ([{"verdict": "PASS", "fault_kind": "none", "i": i} for i in range(10)]
            + [{"verdict": "FAIL", "fault_kind": "semantic_value", "i": i} for i in range(10, 18)]
            + [{"verdict": "FAIL", "fault_kind": NATURAL, "i": i} for i in range(18, 21)])
    sample = balanced_sample(natural_fails_in_turn(rows, "verdict"), "verdict", 12)
    fails = [r["fault_kind"] for r in sample if r["verdict"] == "FAIL"]
    assert len(fails) == 6 and fails.count(NATURAL) == 3  # every natural FAIL, up to half
    assert sorted(r["i"] for r in natural_fails_in_turn(rows, "verdict")) == list(range(21))  # nothing lost
