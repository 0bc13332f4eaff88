"""The documents speak to users: a short README, no narration of how the project was made,
and every command a user copies from a code block runs as written.

- README.md is at most 250 lines and keeps the two commands (``bash scripts/main.sh``,
  ``bash scripts/test.sh``);
- no document, recipe, or comment or string of the code says "session 3", "issue 8",
  "until recently", "today" and the like: a reader has none of that history;
- every command line in README's and the guides' ```bash / ```sh blocks is checked:
  ``heart ...`` parses with the CLI's own argparse parsers (built in-process; the sub-commands
  that forward their arguments to another parser are parsed by that parser),
  ``bash scripts/X.sh`` names a script that passes ``bash -n``, ``python -m M`` names an
  importable module (and parses with M's parser for the project's entry points),
  ``python bench/X.py`` names an existing bench script whose parser accepts the arguments,
  ``accelerate launch ... -m heart_distill.train.sft --recipe R`` parses with accelerate's own
  launch parser and names existing files, ``ray start|stop|status ...`` parses with Ray's own
  command line, ``vllm serve BASE ...`` uses only known ``vllm serve`` options and maps each
  ``--lora-modules`` entry to a role, ``pip install '...[EXTRA]'`` names an extra of pyproject;
- relative links in README.md and docs/ point at files that exist.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import io
import re
import shlex
import subprocess
import tokenize
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
GUIDES = sorted((REPO / "docs").rglob("*.md"))
CODE_FOLDERS = ("heart", "heart_distill", "data", "train", "eval", "bench", "scripts")

NARRATION = [re.compile(p, re.IGNORECASE) for p in (
    r"\bsessions? \d+",
    r"\bissues? #?\d+",
    r"\bthis issue\b",
    r"until recently",
    r"\btoday(?:['’]?s)?\b",
    r"\bwork periods?\b",
)]
"""Phrases that narrate the project's making rather than say what is true of it."""


# -- (a) the README is short and keeps the two commands ----------------------------------

def test_readme_is_at_most_250_lines():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; move detail into docs/"


def test_readme_keeps_the_two_commands():
    commands = [line for _, line in commands_of(README)]
    assert "bash scripts/main.sh" in commands
    assert "bash scripts/test.sh" in commands


# -- (b) no narration ---------------------------------------------------------------------

def scanned_files() -> list[Path]:
    files = [README, *GUIDES, *(p for p in (REPO / "recipes").rglob("*") if p.is_file())]
    for folder in CODE_FOLDERS:
        files += [p for p in (REPO / folder).rglob("*") if p.suffix in (".py", ".sh") and p.is_file()
                  and "__pycache__" not in p.parts]
    return sorted(set(files) - {Path(__file__).resolve()})


def prose_of(path: Path) -> list[tuple[int, str]]:
    """(line, text) of what a reader reads: a Python file's comments and strings (names are code,
    not prose), any other file whole."""
    text = path.read_text(encoding="utf-8", errors="replace")
    if path.suffix != ".py":
        return list(enumerate(text.splitlines(), 1))
    kinds = {tokenize.COMMENT, tokenize.STRING, getattr(tokenize, "FSTRING_MIDDLE", tokenize.STRING)}
    try:
        return [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(text).readline)
                if tok.type in kinds]
    except (tokenize.TokenError, SyntaxError):  # a file mid-edit: read it whole
        return list(enumerate(text.splitlines(), 1))


def test_the_scan_covers_docs_recipes_and_code():
    names = {p.relative_to(REPO).as_posix() for p in scanned_files()}
    assert "README.md" in names and "recipes/smollm2-135m/pipeline.yaml" in names
    assert any(n.startswith("docs/") for n in names) and any(n.startswith("heart/") for n in names)
    assert "tests/unit/test_docs.py" not in names


def test_no_file_narrates_the_projects_making():
    found = []
    for path in scanned_files():
        for line, text in prose_of(path):
            for pattern in NARRATION:
                for match in pattern.finditer(text):
                    found.append(f"{path.relative_to(REPO)}:{line}: {match.group(0)!r}")
    assert not found, "say why, in the present tense, instead of:\n" + "\n".join(found)


# -- (c) every command in a code block runs as written ------------------------------------

FENCE = re.compile(r"^```(\w*)\s*$")
SEPARATORS = {"&&", "||", ";", "|", "&"}


def commands_of(path: Path) -> list[tuple[int, str]]:
    """(line, command) of every command in the file's ```bash / ```sh blocks: continuation
    lines joined, comments dropped, `a && b` split into two."""
    commands, language, pending, start = [], None, "", 0
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        fence = FENCE.match(line.strip())
        if fence:
            language = None if language is not None else fence.group(1)
            continue
        if language not in ("bash", "sh"):
            continue
        if not pending:
            start = number
        line = re.sub(r"(^|\s)#.*$", "", line).rstrip()  # bash: '#' starts a comment only at a word's start
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        joined = (pending + line).strip()
        pending = ""
        if not joined:
            continue
        words, part = shlex.split(joined), []
        for word in [*words, ";"]:
            if word in SEPARATORS:
                if part:
                    commands.append((start, shlex.join(part)))
                part = []
            else:
                part.append(word)
    return commands


def documents_with_commands() -> list[Path]:
    return [README, *(g for g in GUIDES if commands_of(g))]


class Parsed(Exception):
    """Raised by the patched parse_args once a parser accepted its arguments."""


def parse_with(main, argv: list[str], monkeypatch) -> argparse.Namespace:
    """Run ``main(argv)`` only as far as its argparse parser: the parser's errors surface as
    SystemExit, and nothing after parsing runs."""
    original = argparse.ArgumentParser.parse_args

    def parse_args(self, args=None, namespace=None):
        raise Parsed(original(self, args, namespace))

    with monkeypatch.context() as patch:
        patch.setattr(argparse.ArgumentParser, "parse_args", parse_args)
        try:
            main(argv)
        except Parsed as done:
            return done.args[0]
    raise AssertionError(f"{main.__module__}.{main.__name__} returned without parsing its arguments")


def assert_file(path: str, what: str) -> None:
    assert (REPO / path).is_file(), f"{what} {path} does not exist"


def check_heart(words: list[str], monkeypatch) -> None:
    from heart_distill import cli

    args = cli.build_parser().parse_args(words)
    if getattr(args, "recipe", None) is not None:
        assert_file(str(args.recipe), f"heart {args.command} --recipe")
    rest = getattr(args, "rest", None)
    if args.command == "eval":
        module = importlib.import_module(f"heart_distill.eval.{'roles' if args.action == 'roles' else 'e2e'}")
        parse_with(lambda argv: module.main(argv, ["eval", args.action, *argv]), rest, monkeypatch)
    elif args.command == "report":
        from heart_distill.eval import report

        parse_with(lambda argv: report.main(argv, ["report", *argv]), rest, monkeypatch)
    elif args.command == "datasets":
        if args.action == "lint":
            parse_with(cli.cmd_datasets_lint, rest, monkeypatch)
        else:
            from heart_distill.data import build

            parse_with(build.main, rest, monkeypatch)
    elif args.command == "check":
        from heart.runtime import parity

        parse_with(parity.main, rest, monkeypatch)


PARSED_MODULES = {"heart_distill.eval.heldout", "heart_distill.train.sft", "heart_distill.train.launch",
                  "heart_distill.data.build"}
"""Entry points run as ``python -m``: their parsers are checked too (each parses first)."""


def check_module(module: str, argv: list[str], monkeypatch) -> None:
    assert importlib.util.find_spec(module) is not None, f"python -m {module}: no such module"
    if module in PARSED_MODULES:
        args = parse_with(importlib.import_module(module).main, argv, monkeypatch)
        recipes = getattr(args, "recipe", None) or []
        for recipe in [recipes] if isinstance(recipes, str) else recipes:
            assert_file(recipe, f"python -m {module} --recipe")


def check_bench(script: str, argv: list[str]) -> None:
    assert_file(script, "bench script")
    module = importlib.import_module(Path(script).with_suffix("").as_posix().replace("/", "."))
    if hasattr(module, "build_parser"):
        module.build_parser().parse_args(argv)


def check_accelerate(words: list[str], monkeypatch) -> None:
    from accelerate.commands.launch import launch_command_parser

    assert words[:2] == ["accelerate", "launch"], "only `accelerate launch` is checked"
    assert "-m" in words, "accelerate launch without -m MODULE"
    launch_command_parser().parse_args(words[2:])  # accelerate's own options (multi-node ones too)
    at = words.index("-m")
    if "--config_file" in words[:at]:
        assert_file(words[words.index("--config_file") + 1], "accelerate --config_file")
    check_module(words[at + 1], words[at + 2:], monkeypatch)


def check_ray(words: list[str]) -> None:
    """``ray start --head ...`` and kin, parsed by Ray's own (click) command line."""
    import click
    from ray.scripts.scripts import cli

    assert len(words) > 1, "ray without a sub-command"
    command = cli.get_command(None, words[1])
    assert command is not None, f"ray has no sub-command {words[1]!r}"
    try:
        command.make_context(f"ray {words[1]}", list(words[2:]))
    except click.ClickException as err:
        raise AssertionError(f"ray {words[1]}: {err.format_message()}") from None


VLLM_SERVE_OPTIONS = frozenset({
    "--host", "--port", "--served-model-name", "--dtype", "--max-model-len", "--gpu-memory-utilization",
    "--max-num-seqs", "--seed", "--enforce-eager", "--load-format", "--tokenizer", "--generation-config",
    "--tensor-parallel-size", "--data-parallel-size", "--data-parallel-size-local", "--data-parallel-address",
    "--data-parallel-rpc-port", "--data-parallel-start-rank", "--headless", "--api-server-count",
    "--enable-lora", "--max-loras", "--max-lora-rank", "--max-cpu-loras", "--lora-modules",
})
"""The ``vllm serve`` options the guides use, as vLLM's engine and server arguments name them
(vLLM is not installed beside the toolkit: it lives in .venv-vllm or on the GPU machine)."""


def check_vllm(words: list[str]) -> None:
    """``vllm serve MODEL [--option value ...]``: known options only; ``--lora-modules`` maps
    roles to adapter folders; ``--max-loras`` / ``--max-lora-rank`` are counts."""
    from heart import ROLES

    assert words[1:2] == ["serve"] and len(words) > 2 and not words[2].startswith("-"), \
        "only `vllm serve MODEL ...` is checked"
    option = None
    for word in words[3:]:
        if word.startswith("--"):
            option, _, value = word.partition("=")
            assert option in VLLM_SERVE_OPTIONS, f"vllm serve: unknown option {option}"
            if not value:
                continue
            word = value
        if option == "--lora-modules":
            role, sep, path = word.partition("=")
            assert sep and path and role in ROLES, f"vllm serve --lora-modules: {word!r} is not ROLE=PATH"
        elif option in ("--max-loras", "--max-lora-rank", "--port", "--data-parallel-size", "--tensor-parallel-size"):
            assert word.isdigit() and int(word) > 0, f"vllm serve {option}: {word!r} is not a positive count"


def check_pip(words: list[str]) -> None:
    """``pip install ... '.[ray]'`` / ``'heart-distill[ray]'``: the extras exist in pyproject."""
    import tomllib

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for word in words[2:]:
        match = re.fullmatch(r"(?:\.|heart-distill)\[([\w,-]+)\]", word)
        if match:
            unknown = set(match.group(1).split(",")) - set(extras)
            assert not unknown, f"pip install {word}: pyproject has no extra {sorted(unknown)}"


def check_command(words: list[str], monkeypatch) -> None:
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):  # VAR=value before a command
        words = words[1:]
    if words[:1] == ["nice"]:
        words = words[3:] if words[1:2] == ["-n"] else words[1:]
    if not words:
        return
    head = Path(words[0]).name
    if head == "heart":
        check_heart(words[1:], monkeypatch)
    elif head == "bash" and len(words) > 1 and words[1].endswith(".sh"):
        assert_file(words[1], "script")
        syntax = subprocess.run(["bash", "-n", str(REPO / words[1])], capture_output=True, text=True)
        assert syntax.returncode == 0, f"bash -n {words[1]}: {syntax.stderr}"
    elif head in ("python", "python3") and len(words) > 1:
        if words[1] == "-m":
            check_module(words[2], words[3:], monkeypatch)
        elif words[1].endswith(".py"):
            if words[1].startswith("bench/"):
                check_bench(words[1], words[2:])
            else:
                assert_file(words[1], "python script")
    elif head == "accelerate":
        check_accelerate(words, monkeypatch)
    elif head == "ray":
        check_ray(words)
    elif head == "vllm":
        check_vllm(words)
    elif head == "pip" and words[1:2] == ["install"]:
        check_pip(words)


@pytest.mark.parametrize("document", documents_with_commands(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_command_in_a_code_block_runs_as_written(document, monkeypatch):
    commands = commands_of(document)
    assert commands
    failures = []
    for line, command in commands:
        try:
            check_command(shlex.split(command), monkeypatch)
        except SystemExit:  # argparse refused the arguments (its message is on stderr)
            failures.append(f"{document.name}:{line}: `{command}`: the parser refused it")
        except (AssertionError, ImportError) as err:
            failures.append(f"{document.name}:{line}: `{command}`: {err}")
    assert not failures, "\n".join(failures)


def test_a_wrong_command_is_caught(monkeypatch):
    with pytest.raises(SystemExit):
        check_command(["heart", "pipeline", "--recipes", "x"], monkeypatch)
    with pytest.raises(SystemExit):
        check_command(["heart", "eval", "roles", "--out", "x"], monkeypatch)  # --data is required
    with pytest.raises(AssertionError):
        check_command(["bash", "scripts/no_such.sh"], monkeypatch)
    with pytest.raises(AssertionError):
        check_command(["python", "-m", "heart_distill.no_such_module"], monkeypatch)
    with pytest.raises(AssertionError):
        check_command(["ray", "start", "--hed"], monkeypatch)
    with pytest.raises(AssertionError):
        check_command(["vllm", "serve", "Qwen/Qwen3-8B", "--enable-lora", "--lora-modules", "planer=a"], monkeypatch)
    with pytest.raises(AssertionError):
        check_command(["vllm", "serve", "Qwen/Qwen3-8B", "--max-lora-rnk", "16"], monkeypatch)
    with pytest.raises(AssertionError):
        check_command(["pip", "install", "-e", ".[raay]"], monkeypatch)
    with pytest.raises(SystemExit):  # accelerate's parser refuses an unknown option
        check_command(["accelerate", "launch", "--nodes", "2", "-m", "heart_distill.train.sft"], monkeypatch)


# -- links ---------------------------------------------------------------------------------

LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")


@pytest.mark.parametrize("document", [README, *GUIDES], ids=lambda p: p.relative_to(REPO).as_posix())
def test_relative_links_point_at_existing_files(document):
    missing = []
    for target in LINK.findall(document.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target):
            continue  # http:, https:, mailto:
        path = (document.parent / target).resolve()
        results_to_come = path.is_relative_to(REPO / "docs" / "results")  # filled by the benchmark's run
        if not path.exists() and not results_to_come:
            missing.append(target)
    assert not missing, f"{document.relative_to(REPO)} links to missing files: {missing}"
