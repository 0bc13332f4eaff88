"""HEART: Planner → Router → Tool Primitive → Verifier over tools that really execute.

This package owns the loop (Algorithm 1 of the HEART paper), the four roles, ToolFace,
trace events, the runtime backends and the environments. It never imports
``heart_distill`` (nor ``data``, ``train``, ``eval``), not even inside a function
(tests/unit/test_house.py).
"""

import os
from pathlib import Path

__version__ = "0.1.0"

ROLES = ("planner", "router", "primitive", "verifier")
"""The four roles, in the order the loop calls them: every module that lists them imports this."""


def default_cache_dir() -> Path:
    """Where HEART caches what it builds (models, GGUF files, embeddings, indexes):
    ``$HEART_CACHE``, by default ``~/.cache/heart``."""
    return Path(os.environ.get("HEART_CACHE", Path.home() / ".cache" / "heart"))
