"""The published role benchmark (docs/results/role-benchmark) is whole and says what it shows.

Its adapters are plain peft folders with manifests; every recorded answer has its held-out
input beside it; scoring the recorded answers again with this checkout's metrics gives the
recorded scores and the figures of roles.json; the report's headline cells are those figures.
Reproducing the answers themselves takes the model: the command is in the folder's README.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from heart import ROLES

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results" / "role-benchmark"
SIDES = {  # an evaluation's folder → (the folder holding its held-out rows, the roles it evaluated)
    "eval/roles-base": (".", ROLES), "eval/roles-distilled": (".", ROLES),
    "eval/primitive-stratified/roles-base": (".", ("primitive",)),
    "eval/primitive-stratified/roles-distilled": (".", ("primitive",)),
    "router-plan/eval/roles-base": ("router-plan", ("router",)),
    "router-plan/eval/roles-distilled": ("router-plan", ("router",)),
}
SCORE_COLUMNS = {"planner": ("tool_sequence_em", "sufficiency_correct"), "router": ("steps_matched", "args_matched"),
                 "primitive": ("arguments_em",), "verifier": ("verdict_correct",)}


def examples(side: str) -> list[dict]:
    return [json.loads(line) for line in (RESULTS / side / "roles_examples.jsonl").open()]


def test_the_folder_stays_small_and_holds_four_plain_peft_adapters():
    size = sum(p.stat().st_size for p in RESULTS.rglob("*") if p.is_file())
    assert size < 15 * 2**20, f"{size / 2**20:.1f} MiB"
    for role in ROLES:
        folder = RESULTS / "adapters" / role
        config = json.loads((folder / "adapter_config.json").read_text())
        manifest = json.loads((folder / "manifest.json").read_text())
        assert config["peft_type"] == "LORA" and config["r"] == 8
        assert (folder / "adapter_model.safetensors").stat().st_size > 10**6
        assert manifest["role"] == role and "base_model" in json.dumps(manifest)


def heldout(folder: str, role: str) -> dict[tuple, dict]:
    from heart_distill.eval.rescore import held_out_rows

    return held_out_rows(RESULTS / folder / "heldout", role, "test")


@pytest.mark.parametrize("side", SIDES)
def test_recorded_answers_score_as_recorded_and_sum_to_the_figures(side):
    from heart_distill.eval.metrics import summarize
    from heart_distill.eval.rescore import recorded_scores, row_key

    folder, roles = SIDES[side]
    figures = json.loads((RESULTS / side / "roles.json").read_text())["figures"]
    by_role: dict[str, list[dict]] = {}
    for record in examples(side):
        by_role.setdefault(record["role"], []).append(record)
    assert set(by_role) == set(roles)
    for role, records in by_role.items():
        rows, rescored = heldout(folder, role), []
        for record in records:
            scores = recorded_scores(role, rows[row_key(record)], record)
            for column in SCORE_COLUMNS[role]:
                assert scores[column] == record[column], (role, column, record["episode_id"])
            rescored.append({**record, **scores})
        for name, figure in summarize(role, rescored).items():
            if name in figures[role] and figures[role][name]["value"] is not None:
                assert figure.value == pytest.approx(figures[role][name]["value"]), (role, name)


def test_the_report_shows_the_recorded_headline_figures():
    from heart_distill.eval.metrics import HEADLINE

    report = (RESULTS / "report.md").read_text()
    distilled = json.loads((RESULTS / "eval" / "roles-distilled" / "roles.json").read_text())["figures"]
    for role in ROLES:
        value = distilled[role][HEADLINE[role]]["value"]
        assert f"| **{HEADLINE[role]}** |" in report
        assert f"{100 * value:.1f} [" in report, (role, value)
