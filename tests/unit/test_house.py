"""The house's layout: what runs at inference (``heart``) stands alone, and what installs is
``heart`` and ``heart_distill`` only.

- ``heart/`` imports nothing from ``heart_distill``, ``data``, ``train`` or ``eval``: not at
  module level, not inside a function, not through ``importlib.import_module``;
- the wheel holds ``heart`` (with its data files) and ``heart_distill`` (with
  ``heart_distill.data``, ``.train`` and its chat templates, ``.eval``) and no top-level
  ``data``, ``train`` or ``eval`` package, and setuptools builds it without a warning;
- every package folder of the repository is listed in pyproject's
  ``[tool.setuptools] packages`` under its installed name, so a new subpackage cannot be left
  out of the wheel.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TRAINING_SIDE = {"heart_distill", "data", "train", "eval"}
"""Top-level names ``heart`` must never import."""
SOURCE_FOLDERS = ("heart", "heart_distill", "data", "train", "eval")


def imported_modules(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import anywhere in ``tree``: statements at any
    depth, and string arguments of ``importlib.import_module`` / ``__import__``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in ("import_module", "__import__"):
                found.append((node.lineno, node.args[0].value))
    return found


def test_the_import_finder_sees_every_form():
    source = ("import data.build\nfrom eval import roles\n"
              "def f():\n    from heart_distill.data import teachers\n    import train as t\n"
              "    importlib.import_module('heart_distill.eval.e2e')\n    __import__('eval')\n"
              "from . import sibling\n")
    names = [name.split(".")[0] for _, name in imported_modules(ast.parse(source))]
    assert names == ["data", "eval", "heart_distill", "train", "heart_distill", "eval"]


def test_heart_imports_nothing_from_the_training_side():
    offences = []
    files = sorted((REPO / "heart").rglob("*.py"))
    assert len(files) > 30
    for path in files:
        for line, name in imported_modules(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if name.split(".")[0] in TRAINING_SIDE:
                offences.append(f"{path.relative_to(REPO)}:{line} imports {name}")
    assert not offences, "heart/ runs at inference and must not import the training side:\n" + "\n".join(offences)


def _setuptools() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]


def installed_name(folder: Path) -> str:
    """The package name a repository folder installs as (``[tool.setuptools.package-dir]``)."""
    relative = folder.relative_to(REPO).as_posix()
    mapped = {path: name for name, path in _setuptools().get("package-dir", {}).items() if name}
    for path, name in sorted(mapped.items(), key=lambda item: -len(item[0])):
        if relative == path or relative.startswith(path + "/"):
            return name + relative[len(path):].replace("/", ".")
    return relative.replace("/", ".")


def test_every_package_folder_is_listed_in_pyproject():
    packages = set(_setuptools()["packages"])
    folders = sorted({init.parent for top in SOURCE_FOLDERS for init in (REPO / top).rglob("__init__.py")
                      if "__pycache__" not in init.parts})
    wanted = {installed_name(folder): folder.relative_to(REPO).as_posix() for folder in folders}
    missing = {name: folder for name, folder in wanted.items() if name not in packages}
    assert not missing, f"package folders missing from pyproject's [tool.setuptools] packages: {missing}"
    folders = {installed_name(d) for top in SOURCE_FOLDERS for d in [REPO / top, *(REPO / top).rglob("*")]
               if d.is_dir() and "__pycache__" not in d.parts}
    stale = sorted(packages - folders)  # a data folder (train/templates) may be listed; a missing one may not
    assert not stale, f"pyproject lists packages with no folder in the repository: {stale}"


def test_installed_names_follow_the_package_dir_mapping():
    assert installed_name(REPO / "data") == "heart_distill.data"
    assert installed_name(REPO / "train") == "heart_distill.train"
    assert installed_name(REPO / "heart" / "runtime") == "heart.runtime"
    assert installed_name(REPO / "heart_distill") == "heart_distill"


@pytest.fixture(scope="module")
def wheel_build(tmp_path_factory) -> tuple[set[str], str]:
    """The file list of the wheel pip builds from a copy of the sources (a copy, so that the
    build/ and egg-info folders setuptools writes never land in the working tree), and the
    build's output (``-v``: pip shows the backend's warnings only then). Building the wheel
    and installing with ``pip install --target`` cost the same here (~3.5 s each on 2 cores);
    the wheel's list is what --target would unpack."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    for name in SOURCE_FOLDERS:
        shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation",
                           "-w", str(tmp / "dist"), str(source)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.stdout + done.stderr)[-2000:]
    (wheel,) = (tmp / "dist").glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        return set(archive.namelist()), done.stdout + done.stderr


@pytest.fixture(scope="module")
def wheel_files(wheel_build) -> set[str]:
    return wheel_build[0]


def test_setuptools_builds_the_wheel_without_a_warning(wheel_build):
    """A data folder Python could import as a namespace package (heart/intercepts,
    train/templates) must be listed in ``packages``, or setuptools prints a "Package would be
    ignored" box on every ``pip install``."""
    warnings = [line.strip() for line in wheel_build[1].splitlines()
                if "Warning:" in line or "would be ignored" in line]
    assert not warnings, "setuptools warns while building the wheel:\n" + "\n".join(warnings)


def test_the_wheel_ships_the_data_files(wheel_files):
    for name in ("heart/result_shapes.json", "heart/intercepts/default.yaml"):
        assert name in wheel_files, name


def test_the_wheel_installs_no_top_level_data_train_or_eval(wheel_files):
    tops = {name.split("/")[0] for name in wheel_files if not name.split("/")[0].endswith(".dist-info")}
    assert tops == {"heart", "heart_distill"}, tops


def test_the_wheel_holds_every_part_under_its_installed_name(wheel_files):
    for module in ("heart/__init__.py", "heart/loop.py", "heart/runtime/scripted.py",
                   "heart/environments/bfcl_ast.py", "heart_distill/__init__.py", "heart_distill/cli.py",
                   "heart_distill/data/__init__.py", "heart_distill/data/collect.py",
                   "heart_distill/train/__init__.py", "heart_distill/train/sft.py",
                   "heart_distill/eval/__init__.py", "heart_distill/eval/e2e.py"):
        assert module in wheel_files, module
    templates = sorted(p.name for p in (REPO / "train" / "templates").glob("*.jinja"))
    assert templates
    for name in templates:
        assert f"heart_distill/train/templates/{name}" in wheel_files, name
    for folder in ("heart", "heart_distill", "data", "train", "eval"):
        for path in (REPO / folder).rglob("*.py"):
            if "__pycache__" in path.parts:
                continue
            installed = installed_name(path.parent).replace(".", "/") + "/" + path.name
            assert installed in wheel_files, f"{path.relative_to(REPO)} is not in the wheel (as {installed})"


def test_the_parser_builds_without_importing_data_collection_or_eval():
    parts = ("heart_distill.data", "heart_distill.eval", "heart_distill.train", "data", "eval", "train")
    code = ("import sys, heart_distill.cli as cli; cli.build_parser(); "
            f"print(sorted(m for m in sys.modules if m.split('.')[0] in {parts} or '.'.join(m.split('.')[:2]) in {parts}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]", out.stdout


def test_progress_bars_come_from_one_home_and_are_silent_off_a_terminal():
    import io

    from heart.progress import progress_bar

    stream = io.StringIO()  # not a TTY, like a log file or CI
    assert list(progress_bar(range(3), file=stream, desc="work")) == [0, 1, 2]
    assert stream.getvalue() == ""
    for folder in ("heart", "heart_distill", "data", "train", "eval", "bench"):
        for path in (REPO / folder).rglob("*.py"):
            if path == REPO / "heart" / "progress.py" or "__pycache__" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                assert not any(n.split(".")[0] == "tqdm" for n in names), \
                    f"{path.relative_to(REPO)} imports tqdm: take the bar from heart.progress"
