"""Per-role evaluation over real held-out role inputs (a gold collection), the held-out
discipline of the datasets, and the report — with scripted backends, no model."""

from __future__ import annotations

import json

import pytest
from datasets import load_from_disk

from heart_distill.data.build import BuildOptions, build_role_datasets
from heart_distill.data.collect import main as collect
from heart_distill.eval.formats import ROLES
from heart_distill.eval.heldout import build_heldout
from heart_distill.eval.report import write_report
from heart_distill.eval.roles import RoleEvalConfig, run
from heart.environments.splits import split_of
from heart.runtime.scripted import ScriptedBackend
from heart.traces import read_trace


@pytest.fixture(scope="module")
def collection(tmp_path_factory):
    """A gold collection (with faults) over train, dev and test tasks of BFCL in one run."""
    run_dir = tmp_path_factory.mktemp("run")
    for split, limit in (("train", 3), ("dev", 1), ("test", 3)):
        collect(["--env", "bfcl", "--split", split, "--limit", str(limit), "--fault-rate", "0.3",
                 "--concurrency", "1", "--out", str(run_dir)])
    return run_dir


@pytest.fixture(scope="module")
def heldout(collection, tmp_path_factory):
    out = tmp_path_factory.mktemp("heldout")
    counts = build_heldout(collection, out, "test")
    assert all(counts[role] > 0 for role in ROLES), counts
    return out


def test_no_test_split_task_reaches_a_training_dataset(collection, tmp_path):
    traced = {(row["env"], str(row["task_id"])) for path in (collection / "traces").glob("*.jsonl")
              for row in read_trace(path)}
    assert any(split_of(*task) == "test" for task in traced)  # the check below is not vacuous
    report = build_role_datasets(collection, tmp_path, BuildOptions(token_counter="whitespace"))
    for role in ROLES:
        dataset = load_from_disk(str(tmp_path / role))
        assert set(dataset) <= {"train", "validation"}  # what train.role_data reads
        for split in dataset.values():
            assert all(split_of(env, task) != "test" for env, task in zip(split["env"], split["task_id"]))
    assert sum(r["removed"].get("test_split_task", 0) for r in report.roles.values()) > 0


def test_heldout_datasets_hold_only_test_tasks(heldout):
    for role in ROLES:
        dataset = load_from_disk(str(heldout / role))
        assert list(dataset) == ["test"]
        assert {split_of(e, t) for e, t in zip(dataset["test"]["env"], dataset["test"]["task_id"])} == {"test"}


def _targets(heldout):
    return {(role, row["messages"][1]["content"]): row["messages"][2]["content"]
            for role in ROLES for row in load_from_disk(str(heldout / role))["test"]}


def test_the_teachers_own_answers_score_perfectly(heldout, tmp_path):
    targets = _targets(heldout)
    echo = ScriptedBackend(lambda role, messages: targets[(role, messages[-1]["content"])], name="echo")
    results = run(RoleEvalConfig(data=str(heldout), out=str(tmp_path), roles_spec="teacher:openai:http://x#m"),
                  backend=echo)
    f = results["figures"]
    rows = [json.loads(line) for line in (tmp_path / "roles_examples.jsonl").read_text().splitlines()]
    # The gold teacher sometimes plans with a tool ToolFace did not retrieve (a retrieval miss): the
    # loop's parser refuses that answer from a student, so it scores as a parse failure.
    planner_rows = [r for r in rows if r["role"] == "planner"]
    refused = [r for r in planner_rows if r["parse_failure"]]
    assert all("do not exist" in r["parse_error"] for r in refused)
    assert all(r["tool_sequence_em"] == 1 for r in planner_rows if not r["parse_failure"])
    assert f["planner"]["tool_sequence_em"]["value"] == pytest.approx(1 - len(refused) / len(planner_rows))
    assert f["router"]["binding_step_em"]["value"] == 1.0 and f["router"]["binding_argument_em"]["value"] == 1.0
    assert f["primitive"]["arguments_em"]["value"] == 1.0
    # the label is the environment's; the gold teacher's verdicts agree with it
    assert f["verifier"]["verdict_accuracy"]["value"] == 1.0
    for role in ("router", "primitive", "verifier"):
        assert f[role]["parse_failure_rate"]["value"] == 0.0
    for role in ROLES:
        assert f[role]["parse_failure_rate"]["n"] == results["counts"][role]["rows"]
    assert len(rows) == sum(c["rows"] for c in results["counts"].values())


def test_unreadable_answers_are_parse_failures_scored_wrong(heldout, tmp_path):
    results = run(RoleEvalConfig(data=str(heldout), out=str(tmp_path), roles_spec="teacher:openai:http://x#m",
                                 roles=("planner", "verifier")),
                  backend=ScriptedBackend(lambda role, messages: "I cannot help with that.", name="mute"))
    f = results["figures"]
    assert f["planner"]["parse_failure_rate"]["value"] == 1.0
    assert f["planner"]["tool_sequence_em"]["value"] == 0.0 and f["planner"]["valid_output_rate"]["value"] == 0.0
    assert f["verifier"]["verdict_accuracy"]["value"] == 0.0
    assert f["verifier"]["fail_recall"]["value"] == 0.0


def test_backend_exceptions_are_errored_rows(heldout, tmp_path):
    def broken(role, messages):
        raise ConnectionError("server down")

    results = run(RoleEvalConfig(data=str(heldout), out=str(tmp_path), roles_spec="teacher:openai:http://x#m",
                                 roles=("router",)), backend=ScriptedBackend(broken))
    assert results["counts"]["router"]["errored"] == results["counts"]["router"]["rows"]
    assert results["figures"]["router"]["binding_step_em"]["n"] == 0


def test_a_missing_split_is_a_clear_error(heldout, tmp_path):
    with pytest.raises(ValueError, match="no 'validation' split"):
        run(RoleEvalConfig(data=str(heldout), out=str(tmp_path), split="validation",
                           roles_spec="teacher:openai:http://x#m"), backend=ScriptedBackend(lambda r, m: ""))


def test_report_renders_tables_plots_and_provenance(heldout, tmp_path):
    targets = _targets(heldout)
    echo = ScriptedBackend(lambda role, messages: targets[(role, messages[-1]["content"])], name="echo")
    mute = ScriptedBackend(lambda role, messages: "no", name="mute")
    base = run(RoleEvalConfig(data=str(heldout), out=str(tmp_path / "base")), backend=mute,
               argv=["eval", "roles", "--roles", "base"])
    assert base["label"] == "base"
    run(RoleEvalConfig(data=str(heldout), out=str(tmp_path / "teacher"), roles_spec="teacher:openai:http://x#m"),
        backend=echo)
    e2e_dir = tmp_path / "e2e"
    for label, scores in (("base", {"t1": 0.0, "t2": 0.0}), ("distilled", {"t1": 1.0, "t2": 0.0})):
        folder = e2e_dir / label
        folder.mkdir(parents=True)
        (folder / "e2e.json").write_text(json.dumps({
            "kind": "e2e", "label": label, "env": "bfcl", "category": "simple", "config": {"split": "test",
                                                                                           "seeds": [0]},
            "figures": {"success_rate": {"value": sum(scores.values()) / 2, "low": 0.0, "high": 1.0, "n": 2}},
            "pass_hat_k": {"1": {"value": sum(scores.values()) / 2, "n": 2}}, "per_task_score": scores,
            "counts": {"episodes": 2, "errored": 0}, "adapters": {}, "provenance": base["provenance"]}))
    page = write_report([str(tmp_path)], tmp_path / "report")
    text = page.read_text()
    assert "### Planner" in text and "| metric | base | teacher |" in text
    assert "**tool_sequence_em** | 0.0 [0.0, 0.0]" in text and "100.0 [100.0, 100.0]" in text
    assert "### bfcl/simple/test" in text and "Lift_s" in text and "+50.0" in text
    # one run of the condition: its lift is printed, reliability statistics are not
    assert "no reliability statistics" in text and "MeanLift +" not in text and "RR0 1" not in text
    assert "heart eval roles --roles base" in text and "fingerprint" in text
    # the e2e columns carry the base run's command: one process's command is listed once, under
    # every column it made
    assert text.count("heart eval roles --roles base") == 1 and "# e2e: distilled" in text
    assert "Δ tool_sequence_em vs base (paired, points)" in text
    assert (tmp_path / "report" / "roles.png").stat().st_size > 0
    assert (tmp_path / "report" / "lift.png").stat().st_size > 0


def test_report_prints_reliability_statistics_only_over_repeated_runs(tmp_path):
    """Two distilled runs of one condition: MeanLift / RR0 / RelLift95 appear, with the rule."""
    provenance = {"command": "heart eval e2e", "commit": "abc", "versions": {}}
    for label, runs in (("base", [{"t1": 0.0, "t2": 0.0}]), ("distilled", [{"t1": 1.0, "t2": 0.0},
                                                                          {"t1": 1.0, "t2": 1.0}])):
        for index, scores in enumerate(runs):
            folder = tmp_path / f"{label}-{index}"
            folder.mkdir()
            (folder / "e2e.json").write_text(json.dumps({
                "kind": "e2e", "label": label, "env": "bfcl", "category": "simple",
                "config": {"split": "test", "seeds": [index]},
                "figures": {"success_rate": {"value": sum(scores.values()) / 2, "low": 0.0, "high": 1.0, "n": 2}},
                "pass_hat_k": {}, "per_task_score": scores, "counts": {"episodes": 2, "errored": 0},
                "adapters": {}, "provenance": provenance}))
    text = write_report([str(tmp_path)], tmp_path / "report").read_text()
    assert "no reliability statistics" not in text
    assert "MeanLift +75.0" in text and "RR0 100%" in text and "S=2 runs" in text


def test_verifier_samples_are_label_balanced(heldout):
    """A held-out collection's verdicts are imbalanced (mostly PASS on clean runs, mostly FAIL
    with many injected faults); the Verifier's sample takes the two labels in turn, so always
    answering the common label scores about half, not most."""
    from heart_distill.eval.roles import LABEL_COLUMNS, balanced_sample, load_rows

    full = load_rows(heldout, "verifier", "test", None, 0)
    label = next(c for c in LABEL_COLUMNS if c in full[0])
    verdicts = [row[label] for row in full]
    rare, common = sorted(("PASS", "FAIL"), key=verdicts.count)
    n_each = verdicts.count(rare) - 1  # a sample smaller than the rows, whichever label is rarer
    assert n_each > 0 and verdicts[: 2 * n_each].count(rare) < n_each, verdicts  # the first rows are not balanced
    sample = load_rows(heldout, "verifier", "test", 2 * n_each, 0)
    taken = [row[label] for row in sample]
    assert taken.count("PASS") == taken.count("FAIL") == n_each
    # past the rarer label, the rest comes from the other one; never a row twice
    rows = [{"verdict": v, "i": i} for i, v in enumerate(["PASS"] * 5 + ["FAIL"] * 2)]
    picked = balanced_sample(rows, "verdict", 6)
    assert [r["verdict"] for r in picked] == ["PASS", "FAIL", "PASS", "FAIL", "PASS", "PASS"]
    assert len({r["i"] for r in picked}) == 6


def test_each_role_decodes_within_its_own_budget(heldout):
    from heart_distill.eval.roles import MAX_NEW_TOKENS, RoleEvalConfig, load_rows, request_for
    from heart_distill.eval.models import RoleModels

    models = RoleModels("base", "base", "smollm2-135m")
    for role in ROLES:
        row = load_rows(heldout, role, "test", 1, 0)[0]
        default = request_for(role, row, models, RoleEvalConfig(data=str(heldout), out="-"))
        assert default.sampling.max_new_tokens == MAX_NEW_TOKENS[role]
        fixed = request_for(role, row, models, RoleEvalConfig(data=str(heldout), out="-", max_new_tokens=50))
        assert fixed.sampling.max_new_tokens == 50


def test_over_long_prompts_are_left_out_and_counted(heldout, smollm2_path):
    """Rows longer than the training max_length never reach a batch; how many is reported."""
    from heart_distill.eval.roles import load_role_rows, prompt_fits

    all_rows, none_out = load_role_rows(heldout, "verifier", "test", None, 0)
    assert none_out == 0
    fits = prompt_fits("smollm2-135m", 700)
    kept, left_out = load_role_rows(heldout, "verifier", "test", None, 0, fits)
    assert left_out > 0 and len(kept) + left_out == len(all_rows)
    assert all(fits(row) for row in kept) and not all(fits(row) for row in all_rows)


def test_base_out_answers_both_sides_on_one_shared_backend(heldout, tmp_path, monkeypatch):
    import dataclasses
    import threading

    from heart_distill.eval import models as eval_models
    from heart_distill.eval.roles import run_sides

    for role in ROLES:
        (tmp_path / "adapters" / role).mkdir(parents=True)
        (tmp_path / "adapters" / role / "adapter_config.json").write_text("{}")
    seen, lock, built = [], threading.Lock(), []

    def answer(role, messages):
        with lock:
            seen.append(role)
        return "not json"

    def one_model(models, max_batch_size=8, engine="peft"):
        built.append((models.label, max_batch_size))
        return ScriptedBackend(answer, name="shared")

    monkeypatch.setattr(eval_models, "shared_backend", one_model)
    distilled = RoleEvalConfig(data=str(heldout), out=str(tmp_path / "distilled"),
                               roles_spec=str(tmp_path / "adapters"), roles=("verifier",), batch_size=4)
    base = dataclasses.replace(distilled, roles_spec="base", out=str(tmp_path / "base"))
    results = run_sides([distilled, base])
    assert built == [("distilled", 8)]  # one model for both sides, with room for both batches
    assert [r["label"] for r in results] == ["distilled", "base"]
    assert results[1]["backend"] == "shared (unadapted)"
    rows = results[0]["counts"]["verifier"]["rows"]
    assert rows == results[1]["counts"]["verifier"]["rows"] > 0
    assert sorted(seen) == ["base"] * rows + ["verifier"] * rows  # the base side asked as the bare base
    assert (tmp_path / "base" / "roles.json").is_file() and (tmp_path / "distilled" / "roles.json").is_file()
    with pytest.raises(ValueError, match="limit"):
        run_sides([distilled, dataclasses.replace(base, limit=3)])


def test_sides_run_together_do_not_race_on_tqdms_lock(heldout, tmp_path, monkeypatch):
    """datasets' load_from_disk runs tqdm's thread_map, which creates tqdm's class lock when
    missing and deletes it when done. Two sides loading in two threads, both finding no lock,
    made one fail with "AttributeError: type object 'tqdm' has no attribute '_lock'". Here
    that interleaving is forced: creating the lock waits until two threads want it at once."""
    import dataclasses
    import threading

    import tqdm.asyncio
    import tqdm.std
    from datasets.utils.tqdm import tqdm as hf_tqdm

    from heart_distill.eval import models as eval_models
    from heart_distill.eval.roles import run_sides

    for cls in (tqdm.std.tqdm, tqdm.asyncio.tqdm_asyncio, hf_tqdm):  # as in a fresh process
        if "_lock" in vars(cls):
            monkeypatch.delattr(cls, "_lock")
    both_want_it = threading.Barrier(2, timeout=20)
    create = tqdm.std.tqdm.get_lock.__func__

    def racing_get_lock(cls):
        if not hasattr(cls, "_lock"):  # about to create one: wait for the other thread to want it too
            both_want_it.wait()
        return create(cls)

    monkeypatch.setattr(hf_tqdm, "get_lock", classmethod(racing_get_lock))
    for role in ROLES:
        (tmp_path / "adapters" / role).mkdir(parents=True)
        (tmp_path / "adapters" / role / "adapter_config.json").write_text("{}")
    monkeypatch.setattr(eval_models, "shared_backend",
                        lambda models, *a, **kw: ScriptedBackend(lambda role, messages: "not json", name="shared"))
    distilled = RoleEvalConfig(data=str(heldout), out=str(tmp_path / "distilled"),
                               roles_spec=str(tmp_path / "adapters"), roles=("router", "verifier"), batch_size=4)
    results = run_sides([distilled, dataclasses.replace(distilled, roles_spec="base", out=str(tmp_path / "base"))])
    assert [r["counts"]["verifier"]["rows"] > 0 for r in results] == [True, True]


def test_the_reports_adapter_table_names_the_steps_trained_not_the_recipes_sentinel():
    from heart_distill.eval.report import _training

    epochs = {"max_steps": -1, "epochs": 1.0}
    assert _training({"metrics": {"steps": 32}}, epochs) == "32 steps"
    assert _training({}, epochs) == "1.0 epoch(s)"
    assert _training({}, {"max_steps": 5}) == "5 steps"


def test_the_primitive_sample_takes_extraction_rows_and_others_in_turn():
    from heart.roles import primitive
    from heart.roles.common import render_input
    from heart_distill.eval.roles import balanced_sample, primitive_stratum

    card = primitive.tool_card("cd", "Change directory.", {"type": "object", "properties": {"folder": {"type": "string"}}})

    def row(bindings, i):
        user = render_input(primitive.INSTRUCTION, primitive.build_payload("Call cd.", bindings, card))
        return {"i": i, "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": user},
                                     {"role": "assistant", "content": "{}"}]}

    copies = [row({"folder": "docs"}, i) for i in range(6)]
    extractions = [row({"folder": {"current_directory_content": ["docs"]}}, 10 + i) for i in range(2)]
    assert {primitive_stratum(r) for r in copies} == {"other"}
    assert {primitive_stratum(r) for r in extractions} == {"extraction"}
    picked = balanced_sample(copies + extractions, primitive_stratum, 5)
    assert [primitive_stratum(r) for r in picked] == ["other", "extraction", "other", "extraction", "other"]
