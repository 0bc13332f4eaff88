"""BFCL multi_turn_miss_param: the user withholds a parameter, the Planner asks, the user answers.

The withheld turns come from BFCL's own data (an empty gold turn, the next turn giving the
value), the simulated user answers from the task's next turn (no model), the gold teacher
asks exactly there, BFCL's checker scores the episode, the clarification rows reach the
Planner's dataset and its card, and the end-to-end figures tell a Planner that asks from
one that does not.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from heart.environments.bfcl import CLARIFY_ANSWER, BFCLEnvironment, withheld_turns
from heart.environments.splits import split_of
from heart.episode import run_episode
from heart.roles.common import render_answer, role_input
from heart_distill.data.gold_teacher import GoldTeacher, clarification_question
from heart.traces import TraceWriter, read_trace
from heart_distill.eval.metrics import clarification_counts, clarification_figures

MISS = "multi_turn_miss_param"


@pytest.fixture(scope="module")
def env() -> BFCLEnvironment:
    return BFCLEnvironment(MISS)


@pytest.fixture(scope="module")
def base() -> BFCLEnvironment:
    return BFCLEnvironment()


def episode(env, task, backend=None):
    """One episode of ``task`` (the gold teacher by default) and its trace rows."""
    rows = []

    class Rows:
        def write(self, item):
            rows.append(item if isinstance(item, dict) else dataclasses.asdict(item))

    result = run_episode(env, task, backend or GoldTeacher(task, env.catalog()), trace=Rows())
    return result.record, rows


class NeverAsks(GoldTeacher):
    """The gold teacher told nothing is withheld: it plans each turn's gold calls as they
    come (nothing in the withheld turn; the value when the next user turn brings it)."""

    def __init__(self, task, tools):
        super().__init__(dataclasses.replace(task, meta={**task.meta, "withheld_turns": []}), tools)


class AlwaysAsks(GoldTeacher):
    """The gold teacher that first asks a question in every turn, needed or not."""

    def generate(self, role, messages, sampling=None):
        payload = role_input(messages)
        if role == "planner" and not payload.get("clarifications") and not payload.get("feedback"):
            answer = {"status": "INSUFFICIENT", "intent": {"task": "Ask.", "objective": "Ask.", "tool_categories": [],
                                                           "constraints": []},
                      "clarification": "Anything else I should know?", "replanned": False}
            generation = super().generate(role, messages, sampling)
            return dataclasses.replace(generation, text=render_answer(answer), meta={})
        return super().generate(role, messages, sampling)


# -- the data ------------------------------------------------------------------------------
def test_the_category_runs_and_marks_the_withheld_turns_from_bfcl_data(env):
    ids = env.task_ids()
    assert len(ids) == 200 and ids[0] == "multi_turn_miss_param_0"
    task = env.load_task("multi_turn_miss_param_1")
    assert task.meta["withheld_turns"] == [3]
    assert task.gold[3] == [] and task.gold[4][0].name == "tail"
    assert task.turns[4] == "To be exact, it should be last 20 lines."
    withheld = {tid: env.load_task(tid).meta["withheld_turns"] for tid in ids}
    assert all(withheld.values()), "every miss_param task withholds a parameter somewhere"
    # BFCL's own empty turns (the last turn of base_167) withhold nothing the user will give
    assert withheld["multi_turn_miss_param_167"] == [1]
    assert withheld["multi_turn_miss_param_180"] == [1, 5]


def test_the_rule_reads_empty_gold_followed_by_gold():
    assert withheld_turns([["a()"], [], ["b()"], [], [], ["c()"], []]) == [1, 4]
    assert withheld_turns([["a()"], ["b()"]]) == []


def test_other_categories_withhold_nothing(base):
    assert all(not base.load_task(t).meta["withheld_turns"] for t in base.task_ids())


def test_an_unknown_category_is_refused_by_name():
    with pytest.raises(ValueError, match="multi_turn_miss_func.*multi_turn_miss_param"):
        BFCLEnvironment("multi_turn_miss_func")


def test_a_miss_param_task_takes_the_split_of_the_base_task_it_rewrites(env):
    for i in range(200):
        assert split_of("bfcl", f"multi_turn_miss_param_{i}") == split_of("bfcl", f"multi_turn_base_{i}")
    assert [t for t in env.task_ids("test")] == [t.replace("base", "miss_param")
                                                 for t in BFCLEnvironment().task_ids("test")]


# -- the simulated user --------------------------------------------------------------------
def test_the_user_answers_a_withheld_turn_with_the_next_turn_and_its_calls_belong_there(env):
    task = env.load_task("multi_turn_miss_param_1")
    session = env.start(task)
    tools = {t.name: t for t in session.tools}
    session.start_turn(2)
    assert session.clarify("Which file?") == CLARIFY_ANSWER  # nothing withheld in turn 2
    session.start_turn(3)
    assert session.clarify("How many lines?") == task.turns[4]
    assert session.answered_turns == {4}
    assert session.clarify("Anything else?") == CLARIFY_ANSWER  # answered once
    tools["ls"].fn()
    assert [[c.name for c in turn] for turn in session.executed_calls()][3:] == [[], ["ls"]]
    assert session.clarification_record() == {"needed": [3], "asked": [2, 3]}


def test_the_answer_does_not_depend_on_the_question(env):
    task = env.load_task("multi_turn_miss_param_3")
    answers = set()
    for question in ("What is the folder name?", "x"):
        session = env.start(task)
        session.start_turn(1)
        answers.add(session.clarify(question))
    assert answers == {task.turns[2]}


# -- the gold teacher, end to end ------------------------------------------------------------
def test_the_gold_teacher_asks_exactly_in_the_withheld_turn_and_bfcls_checker_accepts(env):
    task = env.load_task("multi_turn_miss_param_1")
    record, rows = episode(env, task)
    assert record.success and not record.errored
    assert record.checker["clarifications"] == {"needed": [3], "asked": [3]}
    assert len(record.verdicts) == len(task.turns) - 1  # the answer turn ran inside turn 3
    plans = [(r["turn"], r["parsed"]) for r in rows if r.get("role") == "planner"]
    asked = [(turn, p["clarification"]) for turn, p in plans if p["status"] == "INSUFFICIENT"]
    assert asked == [(3, "Which lines should I use for tail?")]
    after = next(p for turn, p in plans if turn == 3 and p["status"] == "SUFFICIENT")
    assert [s["tool_hint"] for s in after["plan"]] == ["tail"]
    primitive = [r for r in rows if r.get("role") == "primitive" and r["turn"] == 3]
    assert primitive[0]["parsed"]["arguments"] == {"file_name": "log.txt", "lines": 20}


def test_later_turns_see_the_users_answer_in_the_conversation(env):
    task = env.load_task("multi_turn_miss_param_2")  # turn 0 withholds the file name, turn 2 writes to it
    record, rows = episode(env, task)
    assert record.success
    router = next(r for r in rows if r.get("role") == "router" and r["turn"] == 2)
    conversation = role_input(router["messages"])["conversation"]
    assert task.turns[1] in conversation[0]["user"]


@pytest.mark.parametrize("task_id", ["multi_turn_miss_param_0", "multi_turn_miss_param_5",
                                     "multi_turn_miss_param_130", "multi_turn_miss_param_167",
                                     "multi_turn_miss_param_180"])
def test_gold_episodes_are_valid_and_ask_where_needed(env, task_id):
    record, _ = episode(env, env.load_task(task_id))
    assert record.success, record.checker
    clarifications = record.checker["clarifications"]
    assert clarifications["asked"] == clarifications["needed"] == env.load_task(task_id).meta["withheld_turns"]


def test_a_planner_that_never_asks_can_pass_bfcls_checker_and_gets_recall_zero(env):
    task = env.load_task("multi_turn_miss_param_1")
    record, _ = episode(env, task, NeverAsks(task, env.catalog()))
    # BFCL's runner gives the next turn anyway, and its checker skips empty turns: success
    # alone cannot tell a Planner that asks from one that waits, recall does
    assert record.success
    assert record.checker["clarifications"] == {"needed": [3], "asked": []}
    figures = clarification_figures([{"task_id": task.task_id, "errored": False, "checker": record.checker}])
    assert figures["clarification_recall"]["value"] == 0.0
    assert figures["clarification_precision"]["value"] is None  # nothing asked


def test_a_planner_that_always_asks_gets_precision_below_one(env, base):
    task = env.load_task("multi_turn_miss_param_1")
    record, _ = episode(env, task, AlwaysAsks(task, env.catalog()))
    assert record.checker["clarifications"]["asked"] == [0, 1, 2, 3]
    figures = clarification_figures([{"task_id": task.task_id, "errored": False, "checker": record.checker}])
    assert figures["clarification_precision"]["value"] == pytest.approx(1 / 4)
    assert figures["clarification_recall"]["value"] == 1.0

    plain = base.load_task("multi_turn_base_1")
    record, _ = episode(base, plain, AlwaysAsks(plain, base.catalog()))
    assert record.success  # the base user has nothing to add, and the loop plans on
    assert record.checker["clarifications"] == {"needed": [], "asked": [0, 1, 2, 3]}


def test_the_question_names_what_the_answer_gives_and_no_earlier_turn_did(env):
    task = env.load_task("multi_turn_miss_param_3")
    said, answer = " ".join(task.turns[:2]), task.turns[2]
    assert clarification_question(said, answer, task.gold[2]) == "Which destination should I use for cp?"
    task = env.load_task("multi_turn_miss_param_4")  # "Please mention Julia." gives mentions=['@Julia']
    assert clarification_question(" ".join(task.turns[:3]), task.turns[3], task.gold[3]) == \
        "Your request leaves out a detail that post_tweet needs: what is it?"


# -- the figures -----------------------------------------------------------------------------
def test_clarification_figures_are_micro_over_turns_and_skip_what_has_no_record():
    rows = [
        {"task_id": "a", "errored": False, "checker": {"clarifications": {"needed": [1], "asked": [1]}}},
        {"task_id": "a", "errored": False, "checker": {"clarifications": {"needed": [1], "asked": []}}},
        {"task_id": "b", "errored": False, "checker": {"clarifications": {"needed": [2, 4], "asked": [0, 2]}}},
        {"task_id": "c", "errored": True, "checker": {"clarifications": {"needed": [], "asked": [5]}}},
        {"task_id": "d", "errored": False, "checker": {"irrelevance_valid": True}},
    ]
    figures = clarification_figures(rows)
    assert figures["clarification_precision"]["value"] == pytest.approx(2 / 3)  # a: 1/1, b: 1/2
    assert figures["clarification_precision"]["n"] == 2
    assert figures["clarification_recall"]["value"] == pytest.approx(2 / 4)  # a: 1/2 (two seeds), b: 1/2
    assert figures["clarifications_needed_per_task"]["value"] == pytest.approx((1 + 2) / 2)
    assert clarification_counts({"irrelevance_valid": True}) is None
    assert clarification_figures([rows[-1]]) == {}


def test_e2e_reports_clarification_precision_and_recall_beside_success(tmp_path):
    from heart_distill.eval.e2e import E2EConfig, run

    results = run(E2EConfig(env="bfcl", category=MISS, split="test", roles_spec="teacher:gold", limit=3,
                            concurrency=1, out=str(tmp_path / "e2e")))
    figures = results["figures"]
    assert figures["success_rate"]["value"] == 1.0
    assert figures["clarification_precision"]["value"] == figures["clarification_recall"]["value"] == 1.0
    assert figures["clarification_recall"]["n"] == 3
    on_disk = json.loads((tmp_path / "e2e" / "e2e.json").read_text())
    assert on_disk["figures"]["clarification_recall"] == figures["clarification_recall"]
    from heart_distill.eval.report import e2e_tables, find_results

    (found,) = find_results([str(tmp_path / "e2e")])
    table = "\n".join(e2e_tables([found]))
    assert "| clarification_precision | 100.0 [" in table and "| clarifications_needed_per_task | 1.00" in table
    plain = "\n".join(e2e_tables([{**found, "figures": {"success_rate": figures["success_rate"]}}]))
    assert "clarification" not in plain  # AgentDojo's rows have none: no empty rows


# -- collection and the Planner's dataset ----------------------------------------------------
def test_collect_refuses_a_category_outside_bfcl(tmp_path, capsys):
    from heart_distill.data.collect import main

    with pytest.raises(SystemExit) as exit_:
        main(["--env", "agentdojo", "--category", MISS, "--out", str(tmp_path / "run")])
    assert exit_.value.code == 2
    assert "--category applies to bfcl only" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--env", "bfcl", "--category", "multi_turn_nope", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert "invalid choice: 'multi_turn_nope'" in err


@pytest.mark.parametrize("command", [["collect", "--out", "unused"], ["eval", "e2e", "--out", "unused"], ["tasks"]])
def test_every_command_names_every_bfcl_category_it_takes(command, capsys):
    """One list of BFCL categories (heart.environments.BFCL_CATEGORIES) for every command:
    an unknown category is refused with all of them named, single-turn ones included."""
    from heart.environments import BFCL_CATEGORIES
    from heart_distill.cli import main

    with pytest.raises(SystemExit) as exit_:
        main([*command, "--env", "bfcl", "--category", "nonexistent"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'nonexistent'" in err
    assert all(repr(category) in err for category in BFCL_CATEGORIES)


def test_heart_tasks_lists_a_categorys_tasks(capsys):
    from heart_distill.cli import main

    assert main(["tasks", "--env", "bfcl", "--category", "parallel_multiple", "--split", "test"]) == 0
    listed = capsys.readouterr().out.split()
    assert listed and all(t.startswith("parallel_multiple_") for t in listed)
    assert main(["tasks", "--env", "agentdojo", "--category", "simple"]) == 2
    assert "--category applies to bfcl only" in capsys.readouterr().err


def test_clarification_rows_reach_the_planners_dataset_and_its_card(tmp_path):
    from datasets import load_from_disk

    from heart_distill.data.build import BuildOptions, build_role_datasets
    from heart_distill.data.collect import main

    run_dir = tmp_path / "run"
    common = ["--env", "bfcl", "--split", "train", "--teacher", "gold", "--limit", "4", "--concurrency", "2",
              "--out", str(run_dir)]
    assert main([*common, "--category", MISS]) == 0
    assert main(common) == 0  # base's collection beside it: one manifest entry per category
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert [c.get("category") for c in manifest["collections"]] == [MISS, None]
    report = build_role_datasets(run_dir, tmp_path / "datasets",
                                 BuildOptions(token_counter="whitespace", roles=("planner",)))
    data = load_from_disk(str(tmp_path / "datasets" / "planner"))
    asking = [r for split in data.values() for r in split
              if json.loads(r["messages"][-1]["content"])["status"] == "INSUFFICIENT"]
    assert asking and all(r["task_id"].startswith(MISS) for r in asking)
    quality = report.roles["planner"]["quality"]
    assert quality["clarification_rows"] == len(asking)
    card = (tmp_path / "datasets" / "planner" / "README.md").read_text()
    assert f"withholds, as in BFCL multi_turn_miss_param): {len(asking)} of " in card
