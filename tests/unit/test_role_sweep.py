"""bench/role_sweep.py: variants parse or fail clearly, and a killed sweep resumes without
training a variant it already evaluated."""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "role_sweep.py"


@pytest.fixture(scope="module")
def sweep():
    spec = importlib.util.spec_from_file_location("role_sweep", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_variant_is_a_name_and_recipe_overrides(sweep):
    assert sweep.parse_variant("ep2:sft.epochs=2,sft.learning_rate=1e-3") == (
        "ep2", ["sft.epochs=2", "sft.learning_rate=1e-3"])
    assert sweep.parse_variant("base:") == ("base", [])
    for bad in ("ep2:epochs=2", ":sft.epochs=2", "a b:sft.epochs=2", "ep2:sft.epochs"):
        with pytest.raises(argparse.ArgumentTypeError, match="variant"):
            sweep.parse_variant(bad)


def test_a_variant_evaluated_before_is_read_back_not_run_again(sweep, tmp_path, monkeypatch):
    (tmp_path / "data" / "planner").mkdir(parents=True)
    ran: list[list[str]] = []

    def fake_run(command):  # training and evaluation, as far as the sweep can tell
        ran.append(command)
        if command[:3] == ["heart", "eval", "roles"]:
            out = Path(command[command.index("--out") + 1])
            out.mkdir(parents=True, exist_ok=True)
            figure = {"value": 0.5, "low": 0.25, "high": 0.75, "n": 8}
            (out / "roles.json").write_text(json.dumps({"figures": {"planner": {"tool_sequence_em": figure}}}))

    monkeypatch.setattr(sweep, "run", fake_run)
    argv = ["--datasets", str(tmp_path / "data"), "--role", "planner", "--work", str(tmp_path / "work"),
            "--variant", "ep2:sft.epochs=2", "--out", str(tmp_path / "sweep.json")]
    assert sweep.main(argv) == 0
    assert [c[:2] for c in ran] == [["heart", "train"], ["heart", "eval"]]
    assert "--split" in ran[1] and ran[1][ran[1].index("--split") + 1] == "validation"
    assert sweep.main(argv) == 0 and len(ran) == 2  # read back
    result = json.loads((tmp_path / "sweep.json").read_text())
    entry = result["roles"]["planner"]
    assert entry["best"] == "ep2" and entry["variants"][0]["primary_figure"]["value"] == 0.5
    assert entry["stamp"]["command"].startswith("python bench/role_sweep.py")
    # other overrides under the same name are a new variant: trained again
    assert sweep.main([*argv[:-4], "--variant", "ep2:sft.epochs=3", *argv[-2:]]) == 0 and len(ran) == 4


def test_a_variant_trained_before_is_evaluated_only(sweep, tmp_path, monkeypatch):
    (tmp_path / "data" / "planner").mkdir(parents=True)
    ran: list[list[str]] = []

    def fake_run(command):
        ran.append(command)
        out = Path(command[command.index("--out") + 1])
        out.mkdir(parents=True, exist_ok=True)
        figure = {"value": 0.25, "low": 0.0, "high": 0.5, "n": 8}
        (out / "roles.json").write_text(json.dumps({"figures": {"planner": {"tool_sequence_em": figure}}}))

    monkeypatch.setattr(sweep, "run", fake_run)
    base = ["--datasets", str(tmp_path / "data"), "--work", str(tmp_path / "work"), "--out", str(tmp_path / "s.json"),
            "--variant", "bench:sft.learning_rate=1e-3"]
    assert sweep.main([*base, "--trained", f"bench={tmp_path / 'adapters'}"]) == 0
    assert len(ran) == 1 and ran[0][ran[0].index("--adapters") + 1] == str(tmp_path / "adapters")
    assert sweep.main([*base, "--trained", "other=x"]) == 2
