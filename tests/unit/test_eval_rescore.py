"""`heart eval rescore`: recorded answers scored again under the checkout's metrics, in place."""

import json
import shutil
from pathlib import Path

import pytest

PUBLISHED = Path(__file__).resolve().parents[2] / "docs" / "results" / "role-benchmark"
SIDE = PUBLISHED / "eval" / "primitive-stratified" / "roles-distilled"


@pytest.fixture
def evaluation(tmp_path):
    folder = tmp_path / "roles-distilled"
    shutil.copytree(SIDE, folder)
    return folder


def test_rescore_recomputes_figures_from_the_recorded_answers_and_records_what_moved(evaluation):
    from heart_distill.eval.rescore import main

    results = json.loads((evaluation / "roles.json").read_text())
    truth = results["figures"]["primitive"]["extraction_arguments_em"]
    # as if scored under an older definition: a figure and one row's columns differ
    results["figures"]["primitive"]["extraction_arguments_em"] = {**truth, "value": 0.9, "n": 51}
    (evaluation / "roles.json").write_text(json.dumps(results))
    records = [json.loads(line) for line in (evaluation / "roles_examples.jsonl").open()]
    answers = [r["output"] for r in records]
    extracted = next(i for i, r in enumerate(records) if r["extraction"] == 1)
    records[extracted]["extraction"] = 0
    (evaluation / "roles_examples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))

    assert main([str(evaluation), "--data", str(PUBLISHED / "heldout")]) == 0

    after = json.loads((evaluation / "roles.json").read_text())
    assert after["figures"]["primitive"]["extraction_arguments_em"] == truth
    moved = after["rescored"][-1]["changed"]["primitive"]
    assert set(moved) == {"extraction_arguments_em"}
    assert moved["extraction_arguments_em"]["was"]["value"] == 0.9
    assert after["provenance"] == results["provenance"]  # the run's own stamp is kept
    assert {"command", "commit", "date", "machine"} <= set(after["rescored"][-1])
    rescored = [json.loads(line) for line in (evaluation / "roles_examples.jsonl").open()]
    assert rescored[extracted]["extraction"] == 1
    assert [r["output"] for r in rescored] == answers  # nothing decoded again


def test_rescore_refuses_rows_the_run_did_not_answer(evaluation, tmp_path, capsys):
    from heart_distill.eval.rescore import main

    before = (evaluation / "roles.json").read_bytes()
    other = tmp_path / "other"
    shutil.copytree(PUBLISHED / "heldout" / "planner", other / "primitive")  # rows of another role
    assert main([str(evaluation), "--data", str(other)]) == 2
    assert "has no held-out row" in capsys.readouterr().err
    assert (evaluation / "roles.json").read_bytes() == before  # nothing written
    assert main([str(tmp_path / "nowhere")]) == 2
    assert "holds no roles.json" in capsys.readouterr().err
