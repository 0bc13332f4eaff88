"""Bench results say what produced them, and bench scripts leave tracked files alone.

Every curated result under bench/results/ carries its command, commit, date and machine (a
``stamp`` in JSON, a ``# key: value`` header over text); every bench script's default output
is under runs/ (not tracked), written through heart_distill.eval.provenance; no bench script
imports a private name of heart/ or heart_distill/.
"""

from __future__ import annotations

import ast
import importlib
import json
import re
import shutil
import subprocess
from datetime import datetime
from pathlib import Path

import pytest

from heart_distill.eval import provenance

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"
RESULTS = BENCH / "results"
SCRIPTS = sorted(BENCH.glob("*.py"))
RESULT_FILES = sorted(p for p in RESULTS.iterdir() if p.is_file()) if RESULTS.is_dir() else []
GIT = bool(shutil.which("git")) and (REPO / ".git").exists()


def test_there_are_scripts_and_curated_results():
    assert len(SCRIPTS) >= 11
    assert RESULT_FILES, "bench/results/ holds no curated result"


def stamps_of(path: Path) -> list[dict]:
    """The stamps a result file carries, read here without the project's own reader."""
    if path.suffix == ".json":
        data = json.loads(path.read_text())
        if "stamp" in data:
            return [data["stamp"]]
        assert isinstance(data.get("runs"), list) and data["runs"], f"{path.name}: neither a stamp nor runs"
        assert all("stamp" in run for run in data["runs"]), f"{path.name}: a run without its stamp"
        return [run["stamp"] for run in data["runs"]]
    lines = path.read_text().splitlines()
    assert lines and lines[0].startswith("# command: "), f"{path.name}: no stamp header on top"
    stamps = []
    for i, line in enumerate(lines):
        if line.startswith("# command: "):  # a header: consecutive "# key: value" lines
            header = {}
            for row in lines[i:]:
                key, sep, value = row[2:].partition(": ")
                if not (row.startswith("# ") and sep and key.isidentifier()) or (key == "command" and header):
                    break
                header[key] = json.loads(value) if key in ("dirty", "machine", "versions") else value
            stamps.append(header)
    return stamps


def shallow() -> bool:
    out = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--is-shallow-repository"], capture_output=True,
                         text=True)
    return out.stdout.strip() != "false"


@pytest.mark.parametrize("path", RESULT_FILES, ids=lambda p: p.name)
def test_every_curated_result_carries_command_commit_date_and_machine(path):
    stamps = stamps_of(path)
    assert stamps
    assert provenance.read_stamps(path) == stamps  # the project's reader agrees
    for stamp in stamps:
        assert isinstance(stamp["command"], str) and stamp["command"].split()[0] in ("python", "heart", "nice")
        assert re.fullmatch(r"[0-9a-f]{40}", stamp["commit"]), stamp["commit"]
        if GIT and not shallow():
            known = subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", stamp["commit"] + "^{commit}"])
            assert known.returncode == 0, f"{path.name}: commit {stamp['commit']} is not in this repository"
        assert datetime.fromisoformat(stamp["date"]).utcoffset() is not None, "date without its time zone"
        machine = stamp["machine"]
        assert isinstance(machine["cores"], int) and machine["cores"] > 0
        assert machine["cpu_model"] and machine["platform"]  # "not recorded" where it was not


def test_repeats_are_one_file_or_named_by_what_differs():
    assert not [p.name for p in RESULT_FILES if re.search(r"_run\d+\.", p.name)]
    assert not [p.name for p in BENCH.iterdir() if p.suffix in (".json", ".txt")], "results belong in bench/results/"


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_default_output_is_under_runs_not_a_tracked_file(script):
    module = importlib.import_module(f"bench.{script.stem}")
    args = module.build_parser().parse_args([])
    out = Path(args.out).resolve()
    assert out.is_relative_to(REPO / "runs" / "bench"), f"{script.name} writes {out} by default"
    if GIT:
        ignored = subprocess.run(["git", "-C", str(REPO), "check-ignore", "-q", str(out)])
        assert ignored.returncode == 0, f"{out} is not ignored by git"
        tracked = subprocess.run(["git", "-C", str(REPO), "ls-files", "--error-unmatch", str(out)],
                                 capture_output=True)
        assert tracked.returncode != 0, f"{out} is tracked"


def imports_of(script: Path) -> list[tuple[str, str]]:
    """(module, name) of every ``from module import name`` in the script, nested ones too."""
    tree = ast.parse(script.read_text(), filename=str(script))
    return [(node.module or "", alias.name) for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
            for alias in node.names]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_bench_imports_no_private_name_of_the_project(script):
    private = [f"{module}.{name}" for module, name in imports_of(script)
               if module.split(".")[0] in ("heart", "heart_distill") and name.startswith("_")]
    assert not private, f"{script.name} imports private names: {private}"


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_bench_writes_through_the_provenance_stamp(script):
    names = {name for module, name in imports_of(script) if module == "heart_distill.eval.provenance"}
    assert "stamp" in names and names & {"write_stamped_json", "stamped_stdout"}, script.name


def test_stamp_json_and_text_round_trip(tmp_path, capsys):
    stamp = provenance.stamp(["--calls", "2", "a b"], BENCH / "runtime.py")
    assert list(stamp) == list(provenance.STAMP_KEYS)
    assert stamp["command"] == "python bench/runtime.py --calls 2 'a b'"
    assert datetime.fromisoformat(stamp["date"]).utcoffset().total_seconds() == 0
    assert set(stamp["machine"]) == {"cores", "cpu_model", "platform"}
    if stamp["commit"] is not None:
        assert re.fullmatch(r"[0-9a-f]{40}", stamp["commit"]) and isinstance(stamp["dirty"], bool)

    path = provenance.write_stamped_json(tmp_path / "deep" / "r.json", {"x": 1, "stamp": "old"}, stamp)
    data = json.loads(path.read_text())
    assert list(data) == ["stamp", "x"] and data["stamp"] == stamp
    assert provenance.read_stamps(path) == [stamp]

    with provenance.stamped_stdout(tmp_path / "t" / "r.txt", stamp):
        print("| a | b |\n# not: a stamp")
    assert "| a | b |" in capsys.readouterr().out  # still printed
    text = (tmp_path / "t" / "r.txt").read_text()
    assert text.startswith("# command: python bench/runtime.py") and text.endswith("| a | b |\n# not: a stamp\n")
    assert provenance.read_stamps(tmp_path / "t" / "r.txt") == [stamp] == stamps_of(tmp_path / "t" / "r.txt")


def test_a_results_own_folder_does_not_make_its_stamp_dirty(tmp_path, monkeypatch):
    """A benchmark that rewrites its committed ledger chunk by chunk stamps its commit clean;
    a change anywhere else still reads dirty."""
    from heart_distill.eval import provenance

    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "report.md").write_text("n = 1\n")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    monkeypatch.setattr(provenance, "REPO", tmp_path)
    (tmp_path / "results" / "report.md").write_text("n = 2\n")
    assert provenance.git_commit().endswith("+dirty")
    assert not provenance.git_commit([tmp_path / "results"]).endswith("+dirty")
    (tmp_path / "code.py").write_text("x = 2\n")
    assert provenance.git_commit([tmp_path / "results"]).endswith("+dirty")
