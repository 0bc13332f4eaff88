"""The heart eval / heart report commands: wiring and clear errors on bad input."""

from __future__ import annotations

import subprocess
import sys

import pytest

from heart_distill.cli import main


def test_heart_cli_does_not_import_eval_at_module_level():
    code = ("import sys, heart_distill.cli; "
            "print(any(m == 'heart_distill.eval' or m.startswith('heart_distill.eval.') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_eval_roles_names_a_missing_dataset(tmp_path, capsys):
    assert main(["eval", "roles", "--data", str(tmp_path / "nope"), "--out", str(tmp_path / "o")]) == 2
    assert "no planner dataset" in capsys.readouterr().err


def test_eval_roles_rejects_unknown_roles_and_bad_limits(tmp_path, capsys):
    assert main(["eval", "roles", "--data", str(tmp_path), "--only", "planner,critic", "--out", str(tmp_path)]) == 2
    assert "critic" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:  # argparse refuses it (heart.argtypes.positive_int)
        main(["eval", "roles", "--data", str(tmp_path), "--limit", "0", "--out", str(tmp_path)])
    assert exit_.value.code == 2
    assert "argument --limit: must be > 0, got 0" in capsys.readouterr().err


def test_eval_e2e_rejects_a_bad_roles_spec(tmp_path, capsys):
    assert main(["eval", "e2e", "--env", "bfcl", "--roles", str(tmp_path / "missing"), "--out", str(tmp_path)]) == 2
    assert "adapters folder" in capsys.readouterr().err
    assert main(["eval", "e2e", "--env", "bfcl", "--roles", "teacher:nonsense", "--out", str(tmp_path)]) == 2
    assert "unknown teacher" in capsys.readouterr().err


def test_report_without_results_is_an_error(tmp_path, capsys):
    assert main(["report", str(tmp_path), "--out", str(tmp_path / "r")]) == 2
    assert "no roles.json or e2e.json" in capsys.readouterr().err


def test_eval_e2e_refuses_policy_files_that_do_not_fit_before_writing_anything(tmp_path, capsys):
    common = ["eval", "e2e", "--env", "bfcl", "--category", "simple", "--roles", "teacher:gold",
              "--out", str(tmp_path / "out")]
    assert main([*common, "--middleware", str(tmp_path / "nope.yaml")]) == 2
    assert "nope.yaml" in capsys.readouterr().err
    (tmp_path / "shapes.json").write_text("{}")
    assert main([*common, "--validation", str(tmp_path / "shapes.json")]) == 2
    assert "not a result-shapes file" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
