"""What produced an evaluation: the command, package versions, the code's commit, datasets.

Every result file carries this block so that a report can print exactly how to reproduce
each figure.
"""

from __future__ import annotations

import importlib.metadata
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

PACKAGES = ("heart-distill", "torch", "transformers", "peft", "trl", "datasets", "xgrammar",
            "bfcl-eval", "agentdojo", "numpy")


def versions() -> dict[str, str]:
    found = {}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = "not installed"
    found["python"] = sys.version.split()[0]
    return found


def git_commit() -> str | None:
    root = Path(__file__).resolve().parent.parent
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10)
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def provenance(argv: list[str] | None) -> dict[str, Any]:
    command = "heart " + shlex.join(argv) if argv is not None else shlex.join(sys.argv)
    return {"command": command, "versions": versions(), "commit": git_commit(),
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def dataset_fingerprint(folder: str | Path) -> str:
    """sha256 over a dataset folder's arrow files: the fingerprint adapter manifests record."""
    from train.role_data import dataset_fingerprint as fingerprint

    return fingerprint(Path(folder))
