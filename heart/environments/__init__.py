"""Environments whose tools really execute: BFCL v4 multi-turn and AgentDojo; and BFCL's
single-turn AST categories (:mod:`heart.environments.bfcl_ast`), whose calls are recorded and
compared by bfcl's AST checker rather than executed.

Use :func:`load_environment` to get one by name; each module is imported lazily so that a
user of one benchmark does not pay for importing the other.
"""

from heart.environments.base import (
    Environment,
    EnvironmentSession,
    EpisodeScore,
    Task,
    ToolCall,
    ToolExecutionError,
)
from heart.environments.splits import SPLITS, split_of


def load_environment(name: str, **options) -> Environment:
    """Return the environment called ``name`` ("bfcl" or "agentdojo")."""
    if name == "bfcl":
        from heart.environments.bfcl import BFCLEnvironment

        return BFCLEnvironment(**options)
    if name == "agentdojo":
        from heart.environments.agentdojo import AgentDojoEnvironment

        return AgentDojoEnvironment(**options)
    raise ValueError(f"unknown environment {name!r}: expected 'bfcl' or 'agentdojo'")


__all__ = [
    "Environment",
    "EnvironmentSession",
    "EpisodeScore",
    "SPLITS",
    "Task",
    "ToolCall",
    "ToolExecutionError",
    "load_environment",
    "split_of",
]
