"""Progress bars on long work: drawn on a terminal, silent in logs, pipes and CI.

tqdm decides by itself when ``disable=None``: no bar when its stream is not a TTY. Every long
loop of the toolkit (collection, evaluation, embedding, benches) takes its bar from here, so a
log file holds results rather than thousands of carriage-returned bar frames.
"""

from __future__ import annotations

import os
import sys
from typing import Any

LIBRARY_BAR_SWITCHES = ("TQDM_DISABLE", "HF_HUB_DISABLE_PROGRESS_BARS", "HF_DATASETS_DISABLE_PROGRESS_BARS")
"""What silences the bars drawn inside transformers (loading, GGUF conversion, saving), the
hub and datasets: tqdm reads ``TQDM_DISABLE`` as the default of ``disable`` when it is imported;
the others are the libraries' own switches. Bars that pass ``disable`` themselves (ours) still
decide by the TTY."""


def progress_bar(iterable: Any = None, **kwargs: Any):
    """A ``tqdm`` bar, quiet when its stream (stderr unless ``file=``) is not a terminal."""
    from tqdm import tqdm  # imported late: the loop's hot path never needs it

    kwargs.setdefault("disable", None)
    return tqdm(iterable, **kwargs)


def create_bar_lock() -> None:
    """Create tqdm's class lock now, in the calling thread: call it before starting threads
    that draw bars or load ``datasets`` (and so share tqdm's lock).

    tqdm creates the lock lazily without a guard, and ``tqdm.contrib.concurrent.thread_map``
    (which ``datasets.load_from_disk`` runs) creates it when missing and deletes it when done:
    two threads doing that at once lose the lock under each other ("AttributeError: type
    object 'tqdm' has no attribute '_lock'", or a KeyError from bars registered under two
    different locks). Once it exists every tqdm class inherits it and none deletes it.
    """
    from tqdm import tqdm

    tqdm.get_lock()


def quiet_console() -> bool:
    """Whether library chatter stays off the console: stderr is not a terminal and
    ``HEART_VERBOSE`` is not set."""
    from heart.runtime.llamacpp_log import verbose

    return not sys.stderr.isatty() and not verbose()


def quiet_library_bars() -> None:
    """Off a terminal, turn off the progress bars libraries draw unconditionally (a GGUF
    conversion alone writes 272 frames to a log). Set in the environment, so the processes a
    command starts (pipeline stages, ``accelerate launch``) inherit it; call it before those
    libraries are imported. A variable the user set is left as it is; ``HEART_VERBOSE=1``
    keeps the bars."""
    if not quiet_console():
        return
    for name in LIBRARY_BAR_SWITCHES:
        os.environ.setdefault(name, "1")
