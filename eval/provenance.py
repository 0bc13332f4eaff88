"""What produced an evaluation: the command, package versions, the code's commit, datasets.

Every result file carries this block so that a report can print exactly how to reproduce
each figure. Bench results carry :func:`stamp` (the same, plus the date and the machine):
inside the JSON (:func:`write_stamped_json`) or as a ``# key: value`` header over text
(:func:`stamped_stdout`); :func:`read_stamps` reads either back.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import io
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator, Sequence

REPO = Path(__file__).resolve().parent.parent
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


def git_commit(outside: Sequence[str | Path] = ()) -> str | None:
    """HEAD, with ``+dirty`` where tracked files differ from it; files under ``outside`` (a
    result's own folder, which a run of several chunks rewrites as it goes) do not count."""
    root = REPO
    inside = [Path(p).resolve() for p in outside if Path(p).resolve().is_relative_to(root)]
    excluded = [f":(exclude){p.relative_to(root)}" for p in inside]
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10)
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no",
                                *(["--", ".", *excluded] if excluded else [])],
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


NOT_RECORDED = "not recorded"
STAMP_KEYS = ("command", "commit", "dirty", "date", "machine", "versions")
"""What :func:`stamp` returns, in this order."""
_TEXT_KEYS = {"command", "commit", "date", "note", "recovered"}
"""Header keys whose values are plain text (the others are JSON)."""


def usable_cores() -> int:
    """The cores this process may run on: its affinity where the OS has one, else all of them."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def machine() -> dict[str, Any]:
    """This machine: the CPU cores this process may run on (a run pinned with ``taskset`` says so),
    CPU model (``not recorded`` where the OS does not say) and platform."""
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {"cores": usable_cores(), "cpu_model": model or platform.processor() or NOT_RECORDED,
            "platform": platform.platform()}


def stamp(argv: Sequence[str] | None = None, script: str | Path | None = None,
          outside: Sequence[str | Path] = ()) -> dict[str, Any]:
    """The stamp a bench result carries: ``{command, commit, dirty, date, machine, versions}``.

    ``command`` is ``python <script> <argv>`` with the script's path relative to the repository
    (``script`` defaults to ``sys.argv[0]``, ``argv`` to ``sys.argv[1:]``); ``commit`` the
    checkout's HEAD and ``dirty`` whether tracked files differ from it (both None outside git);
    ``date`` UTC ISO 8601 to the second. Changes under ``outside`` (the result's own folder)
    do not make it dirty.
    """
    path = Path(script if script is not None else sys.argv[0]).resolve()
    with contextlib.suppress(ValueError):
        path = path.relative_to(REPO)
    args = list(sys.argv[1:] if argv is None else argv)
    commit = git_commit(outside)
    return {"command": shlex.join(["python", str(path), *map(str, args)]),
            "commit": commit.removesuffix("+dirty") if commit else None,
            "dirty": commit.endswith("+dirty") if commit else None,
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "machine": machine(), "versions": versions()}


def write_stamped_json(path: str | Path, result: dict[str, Any], stamp: dict[str, Any], indent: int = 1) -> Path:
    """``result`` as JSON at ``path`` (folders made) with ``stamp`` as its first key, ``"stamp"``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"stamp": stamp, **{k: v for k, v in result.items() if k != "stamp"}}
    path.write_text(json.dumps(body, indent=indent) + "\n")
    return path


def stamp_header(stamp: dict[str, Any]) -> str:
    """The stamp as ``# key: value`` lines (text as is, the rest as JSON): a text result's header."""
    lines = []
    for key, value in stamp.items():
        plain = key in _TEXT_KEYS and isinstance(value, str) and "\n" not in value and not value.startswith('"')
        lines.append(f"# {key}: {value if plain else json.dumps(value)}")
    return "\n".join(lines) + "\n"


class _Tee(io.TextIOBase):
    def __init__(self, *streams: Any):
        self.streams = streams

    def write(self, text: str) -> int:
        for stream in self.streams:
            stream.write(text)
        return len(text)

    def flush(self) -> None:
        for stream in self.streams:
            stream.flush()

    def isatty(self) -> bool:
        return self.streams[0].isatty()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.streams[0], "encoding", None) or "utf-8"


def add_printed_out_argument(parser, default: Path) -> None:
    """``--out`` of a bench script whose result is what it prints (see :func:`stamped_stdout`)."""
    parser.add_argument("--out", type=Path, default=default,
                        help="what is printed, under the run's provenance stamp (default: %(default)s)")


@contextlib.contextmanager
def stamped_stdout(path: str | Path, stamp: dict[str, Any]) -> Iterator[Path]:
    """Everything printed inside still goes to stdout and is also written to ``path`` (folders
    made) under :func:`stamp_header`, when the block ends (also when it raises: what it printed)."""
    path = Path(path)
    captured = io.StringIO()
    try:
        with contextlib.redirect_stdout(_Tee(sys.stdout, captured)):
            yield path
    finally:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(stamp_header(stamp) + "\n" + captured.getvalue())


def read_stamps(path: str | Path) -> list[dict[str, Any]]:
    """Every stamp a result file carries: a JSON file's ``stamp``, or each of its ``runs``' stamps
    (one file holding repeats); a text file's headers (each ``# command:`` line opens one)."""
    path = Path(path)
    text = path.read_text()
    if path.suffix == ".json":
        data = json.loads(text)
        if isinstance(data, dict) and "stamp" in data:
            return [data["stamp"]]
        runs = data.get("runs") if isinstance(data, dict) else None
        return [run["stamp"] for run in runs if isinstance(run, dict) and "stamp" in run] if runs else []
    stamps: list[dict[str, Any]] = []
    in_header = False
    for line in text.splitlines():
        key, sep, value = line[2:].partition(": ") if line.startswith("# ") else ("", "", "")
        if sep and key == "command":
            stamps.append({})
            in_header = True
        elif not (sep and in_header and key.isidentifier()):
            in_header = False
            continue
        if key in _TEXT_KEYS and not value.startswith('"'):
            stamps[-1][key] = value
        else:
            try:
                stamps[-1][key] = json.loads(value)
            except ValueError:
                stamps[-1][key] = value
    return stamps


def dataset_fingerprint(folder: str | Path) -> str:
    """sha256 over a dataset folder's arrow files: the fingerprint adapter manifests record."""
    from heart_distill.train.role_data import dataset_fingerprint as fingerprint

    return fingerprint(Path(folder))
