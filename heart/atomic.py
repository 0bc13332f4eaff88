"""Atomic publishing: a file or folder appears under its final name only once it is complete.

Every writer here works under a temporary name beside the target (same folder, so the
final rename never crosses a file system) and renames it into place:

* :func:`publishing` (and :func:`publish_text` / :func:`publish_bytes` on top of it): one
  file, written under a name unique to the process, the thread *and* the call (a pid-only
  name let two threads on a cold cache clobber one temp file), then ``os.replace``\\ d over
  the target. An error while writing removes the temp file and leaves the target as it was.
* :func:`publish_files`: files another step staged (a trainer's output folder) moved into a
  folder so that its completion marker (a manifest) is removed first and lands last.
* :func:`staged_dir`: a whole folder built beside its target and swapped in with one atomic
  ``renameat2(RENAME_EXCHANGE)`` (Linux), so a crash or SIGKILL at any moment leaves either
  the previous folder or the new one, whole. Hold :func:`locked` around it: builds of one
  folder then never interleave, and leftovers of killed builds are cleaned up safely.

No fsync: what matters here is that a reader never sees a half-written file under the final
name, which the rename alone guarantees (none of the writers needed durability across a
power loss).
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import secrets
import shutil
import threading
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator

STAGING_TAG = ".staging-"
"""Infix of a folder being built beside its target (``.<name>.staging-<pid>-<hex>``)."""
OLD_TAG = ".old-"
"""Infix of a previous folder moved aside by the two-rename fallback of :func:`swap_in`."""


def temp_path(path: str | os.PathLike) -> Path:
    """A temp name beside ``path`` that no other process, thread or call uses: writers on a
    cold cache may race on the same key, and each must replace the target with its own
    complete file."""
    path = Path(path)
    return path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.{uuid.uuid4().hex}.tmp")


@contextmanager
def publishing(path: str | os.PathLike, keep_name: bool = False) -> Iterator[Path]:
    """Yield a temp path to write ``path``'s new content to; when the block ends normally it
    replaces ``path`` in one rename, when it raises the temp file is removed.

    ``keep_name``: the temp file has ``path``'s own name, inside a fresh folder beside it
    (for writers that derive something from the file name, such as llama.cpp's converter).
    """
    path = Path(path)
    folder = Path(temp_path(path)) if keep_name else None
    if folder is not None:
        folder.mkdir()
    tmp = folder / path.name if folder is not None else temp_path(path)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


def publish_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (see :func:`publishing`)."""
    with publishing(path) as tmp:
        tmp.write_bytes(data)


def publish_text(path: str | os.PathLike, text: str, encoding: str = "utf-8") -> None:
    """Write ``text`` to ``path`` atomically (see :func:`publishing`)."""
    with publishing(path) as tmp:
        tmp.write_text(text, encoding=encoding)


def publish_files(staged: str | os.PathLike, out: str | os.PathLike, names: Iterable[str], marker: str) -> None:
    """Move ``names`` and then ``marker`` from the folder ``staged`` into ``out`` (same file system).

    ``marker`` is the file whose presence says the folder is complete (a manifest): any old
    one is removed before the first file is replaced and the new one lands last, so a folder
    holding a marker always holds the files that marker describes.
    """
    staged, out = Path(staged), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / marker).unlink(missing_ok=True)
    for name in (*names, marker):
        os.replace(staged / name, out / name)


@contextmanager
def locked(path: str | os.PathLike) -> Iterator[None]:
    """Hold an exclusive lock on ``.<name>.lock`` beside ``path`` (across processes)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(f".{path.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@contextmanager
def staged_dir(final: str | os.PathLike) -> Iterator[Path]:
    """Yield an empty folder beside ``final`` to build it in; when the block ends normally
    the folder replaces ``final`` whole (:func:`swap_in`), when it raises it is removed.

    The caller holds :func:`locked` (``final``): leftovers of killed builds beside ``final``
    are cleaned up first (:func:`recover`), which is only safe while no other build runs.
    """
    final = Path(final).absolute()
    final.parent.mkdir(parents=True, exist_ok=True)
    recover(final)
    staging = final.with_name(f".{final.name}{STAGING_TAG}{os.getpid()}-{secrets.token_hex(4)}")
    staging.mkdir()
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    swap_in(staging, final)


def swap_in(staging: Path, final: Path) -> None:
    """Make ``staging`` the new ``final``: one atomic step where Linux allows it."""
    if not final.exists():
        os.rename(staging, final)
        return
    if exchange(staging, final):  # staging now holds the previous folder
        shutil.rmtree(staging, ignore_errors=True)
        return
    # Fallback (no renameat2): two renames. A kill between them leaves the previous folder
    # under an .old- name, which the next build restores (see recover).
    old = final.with_name(f".{final.name}{OLD_TAG}{os.getpid()}-{secrets.token_hex(4)}")
    os.rename(final, old)
    os.rename(staging, final)
    shutil.rmtree(old, ignore_errors=True)


def exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux ``renameat2(RENAME_EXCHANGE)``); False if unsupported."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    return renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0


def recover(final: Path) -> None:
    """Remove staging folders of killed builds of ``final``; restore a previous folder a kill
    left under its .old- name (only possible in :func:`swap_in`'s two-rename fallback)."""
    for entry in final.parent.glob(f".{final.name}{OLD_TAG}*"):
        if not final.exists():
            os.rename(entry, final)
        else:
            shutil.rmtree(entry, ignore_errors=True)
    for entry in final.parent.glob(f".{final.name}{STAGING_TAG}*"):
        shutil.rmtree(entry, ignore_errors=True)
