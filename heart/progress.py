"""Progress bars on long work: drawn on a terminal, silent in logs, pipes and CI.

tqdm decides by itself when ``disable=None``: no bar when its stream is not a TTY. Every long
loop of the toolkit (collection, evaluation, embedding, benches) takes its bar from here, so a
log file holds results rather than thousands of carriage-returned bar frames.
"""

from __future__ import annotations

from typing import Any


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
