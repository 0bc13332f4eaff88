"""The initial state of every git task in git-tasks.jsonl: a small repository at
DIRECTORY/project, built with plain git commands.

    python make_repo.py DIRECTORY

History on ``main``: three commits (README, the app, its tests), a ``develop`` branch one
commit ahead (a new file, so that the working tree's changes carry over a checkout), a tag
``v0.1``. Working tree: ``app.py`` modified (unstaged), ``CHANGELOG.md`` new and staged,
``notes.txt`` untracked. Dates are fixed so every episode sees the same
history and hashes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def git(repo: Path, *args: str, date: str | None = None) -> None:
    env = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
    if date:
        env.update(GIT_AUTHOR_DATE=date, GIT_COMMITTER_DATE=date)
    subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True)


def write(repo: Path, name: str, text: str) -> None:
    (repo / name).write_text(text)


def commit_file(repo: Path, name: str, text: str, message: str, date: str) -> None:
    write(repo, name, text)
    git(repo, "add", name)
    git(repo, "commit", "-m", message, date=date)


def make_repo(directory: Path) -> Path:
    repo = directory / "project"
    repo.mkdir(parents=True)
    git(repo, "init", "--initial-branch", "main")
    git(repo, "config", "user.name", "Ada Example")
    git(repo, "config", "user.email", "ada@example.com")
    commit_file(repo, "README.md", "# project\n\nA tiny calculator.\n", "Add README", "2026-01-05T10:00:00+00:00")
    commit_file(repo, "app.py", "def add(a, b):\n    return a + b\n", "Add the calculator", "2026-01-06T10:00:00+00:00")
    commit_file(repo, "test_app.py", "from app import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n",
                "Test addition", "2026-01-07T10:00:00+00:00")
    git(repo, "tag", "v0.1")
    git(repo, "checkout", "-b", "develop")
    commit_file(repo, "sub.py", "def sub(a, b):\n    return a - b\n", "Add subtraction", "2026-01-08T10:00:00+00:00")
    git(repo, "checkout", "main")
    write(repo, "app.py", "def add(a, b):\n    \"\"\"The sum of a and b.\"\"\"\n    return a + b\n")
    write(repo, "CHANGELOG.md", "# Changelog\n\n- 0.1: addition\n")
    git(repo, "add", "CHANGELOG.md")
    write(repo, "notes.txt", "ideas: multiplication\n")
    return repo


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: make_repo.py DIRECTORY")
    make_repo(Path(sys.argv[1]))
