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
