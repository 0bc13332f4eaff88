"""Where llama.cpp's own output goes: a log file, not the console.

llama.cpp reports everything it does on stderr: a model load dumps its metadata and tensor
list, a base rewritten to another precision lists each of its 272 tensors, each LoRA adapter
loaded says which of its tensors fall back to the CPU buffer, and llama.cpp's converter from
peft adapters to GGUF (``convert_lora_to_gguf.py``) prints another ~270 lines. None of it is
for the person running ``heart``, and it buries what is. So:

- the library's log (llama.cpp's and ggml's, through ``llama_log_set``) is appended to the
  log file, but for its debug messages (hundreds per decoding call); its errors are also
  printed on stderr;
- each converter's stdout and stderr are captured and appended to the log file under a
  header line; a conversion that fails raises with the last lines of its output in the
  message (:func:`heart.runtime.gguf_files.lora_ggufs`).

An MCP server started over stdio writes its stderr (a log line per failed call) to the same
file (:func:`stream`).

The log file is ``$HEART_LOG_FILE`` if set (a pipeline can point all its stages at one file
in its run folder), else ``<$HEART_CACHE>/logs/heart.log`` (:func:`heart.default_cache_dir`,
where the models and GGUF files are cached). Each process says once, on stderr, where its log
goes (``heart pipeline`` says it once for all its stages: their log is ``<run_dir>/heart.log``). ``HEART_VERBOSE=1`` keeps everything on the console instead, debug messages included.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time
from pathlib import Path
from typing import IO

from heart import default_cache_dir

LOG_FILE_ENV = "HEART_LOG_FILE"
VERBOSE_ENV = "HEART_VERBOSE"
NAMED_ENV = "HEART_LOG_NAMED"
"""Set by a parent that has already told the user where the log goes (``heart pipeline``, for
all its stages): a process whose log is that path does not say it again."""
TAIL_LINES = 20
"""Lines of a failed conversion's output its error message quotes."""

GGML_LOG_LEVEL_DEBUG = 1
GGML_LOG_LEVEL_ERROR = 4
GGML_LOG_LEVEL_CONT = 5
"""ggml's log levels that matter here (``enum ggml_log_level`` of ggml.h: NONE 0, DEBUG 1,
INFO 2, WARN 3, ERROR 4, CONT 5; llama-cpp-python's own callback still numbers them the old
way): debug detail (hundreds of lines per decoding call: kept out of the log file, or a long
evaluation would write gigabytes), an error, and the continuation of the previous message
(whose level it takes)."""

_lock = threading.RLock()
_log: tuple[Path, IO[str]] | None = None
_announced: set[Path] = set()
_callback = None
"""The ctypes callback given to ``llama_log_set``: kept here, or it would be collected."""
_to_console = False
_last_level = 0


def verbose() -> bool:
    """``HEART_VERBOSE`` set to 1 (or true/yes/on): llama.cpp's output stays on the console."""
    return os.environ.get(VERBOSE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def log_path() -> Path:
    """``$HEART_LOG_FILE``, else ``<$HEART_CACHE>/logs/heart.log``."""
    named = os.environ.get(LOG_FILE_ENV, "").strip()
    return Path(named).expanduser() if named else Path(default_cache_dir()) / "logs" / "heart.log"


def _log_file() -> IO[str]:
    """The log, opened for appending (once per process and path), announced once on stderr."""
    global _log
    path = log_path()
    with _lock:
        if _log is None or _log[0] != path:
            if _log is not None:
                _log[1].close()
            path.parent.mkdir(parents=True, exist_ok=True)
            _log = (path, open(path, "a", encoding="utf-8", errors="replace", buffering=1))
        if path not in _announced:
            _announced.add(path)
            if os.environ.get(NAMED_ENV) == str(path):
                return _log[1]
            print(f"heart: llama.cpp's output goes to {path} ({VERBOSE_ENV}=1 shows it here)",
                  file=sys.stderr, flush=True)
        return _log[1]


def stream() -> IO[str]:
    """Where a child process's own chatter goes (an MCP server's stderr: its log lines for
    every failed call): the log file, or stderr when :func:`verbose`."""
    return sys.stderr if verbose() else _log_file()


def write(text: str) -> None:
    """Append ``text`` to the log (to stderr when :func:`verbose`)."""
    if verbose():
        sys.stderr.write(text)
        sys.stderr.flush()
        return
    stream = _log_file()
    with _lock:
        stream.write(text)


def _on_log(level: int, text: bytes | None, user_data) -> None:
    """llama.cpp's log callback: one message (or a piece of one) at a ggml log level."""
    global _last_level
    try:
        message = (text or b"").decode("utf-8", errors="replace")
        effective = _last_level if level == GGML_LOG_LEVEL_CONT else level
        _last_level = effective
        if _to_console:
            sys.stderr.write(message)
            return
        if effective == GGML_LOG_LEVEL_DEBUG:
            return
        with _lock:
            if _log is not None:
                _log[1].write(message)
        if effective == GGML_LOG_LEVEL_ERROR:
            sys.stderr.write(message if message.endswith("\n") or level == GGML_LOG_LEVEL_CONT else message + "\n")
    except Exception:  # an exception must not cross back into C
        pass


def route_llama_cpp() -> Path | None:
    """Send llama.cpp's (and ggml's) log to the log file from now on, errors also to stderr;
    with :func:`verbose`, everything to stderr. Returns the log file (None: the console).

    Call it before loading or quantising a model: llama-cpp-python installs its own callback
    when imported, which prints on stderr."""
    global _callback, _to_console
    import llama_cpp

    to_console = verbose()
    path = None if to_console else log_path()
    if path is not None:
        _log_file()  # opened (and announced) here, not in the callback: llama-cpp-python
        # points fds 1 and 2 at /dev/null while it loads a model
    with _lock:
        _to_console = to_console
        if _callback is None:
            _callback = llama_cpp.llama_log_callback(_on_log)
            llama_cpp.llama_log_set(_callback, ctypes.c_void_p(0))
    return path


def record(what: str, output: IO[bytes], returncode: int | None) -> str:
    """Append a finished command's captured ``output`` (a binary file open for reading and
    writing) to the log under a header naming ``what`` ran, and return the last
    :data:`TAIL_LINES` lines of it."""
    output.seek(0)
    text = output.read().decode("utf-8", errors="replace")
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    write(f"== {stamp} {what} (exit status {returncode}) ==\n{text}"
          f"{'' if not text or text.endswith(chr(10)) else chr(10)}")
    return "\n".join(text.rstrip().splitlines()[-TAIL_LINES:])


def where() -> str:
    """Where the whole output went, for an error message."""
    return "the console above" if verbose() else str(log_path())
