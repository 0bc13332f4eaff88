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
from heart.environments.categories import BFCL_CATEGORIES, BFCL_MULTI_TURN_CATEGORIES, BFCL_SINGLE_TURN_CATEGORIES
from heart.environments.splits import SPLITS, split_of
from heart.user_errors import UserError

ENVIRONMENTS = ("bfcl", "agentdojo", "custom")
"""The environments every command can run: two benchmarks, and a user's own tools over a
tasks file (``custom``: ``--tasks FILE --tools SPEC``, :mod:`heart.environments.custom`)."""

class EnvironmentChoiceError(UserError, ValueError):
    """An environment, category, tasks file or tools option that does not fit the others."""


def check_category(env: str, category: str | None) -> None:
    """ValueError unless ``category`` is None or one of ``env``'s categories."""
    if category is None:
        return
    if env != "bfcl":
        raise EnvironmentChoiceError(f"--category applies to bfcl only, not {env!r}")
    if category not in BFCL_CATEGORIES:
        raise EnvironmentChoiceError(f"unknown BFCL category {category!r}: expected one of {', '.join(BFCL_CATEGORIES)}")


def check_custom(env: str, tasks: str | None, tools: str | None) -> None:
    """ValueError unless a custom environment has both ``tasks`` and ``tools``, and only it."""
    if env == "custom" and not (tasks and tools):
        raise EnvironmentChoiceError("--env custom needs --tasks FILE (a tasks file) and --tools SPEC (a Python module or "
                         ".py file of typed functions, or mcp:COMMAND ARGS... / an http(s):// MCP server URL)")
    if env != "custom" and (tasks or tools):
        raise EnvironmentChoiceError(f"--tasks and --tools apply to --env custom only, not {env!r}")


def custom_environment(tasks: str, tools: str) -> Environment:
    """The ``custom`` environment of a tasks file over ``tools``: ``mcp:COMMAND ARGS...`` (a stdio
    MCP server started per episode; ``python`` as its command is this interpreter, so a server
    installed beside the toolkit runs without an activated environment), an ``http(s)://`` MCP
    server URL, or a Python module (dotted name or ``.py`` file) whose public typed functions
    are the tools."""
    import shlex

    from heart.environments.custom import CustomEnvironment, custom_mcp_environment, local_command, python_tools

    if tools.startswith("mcp:"):
        from heart.environments.mcp import StdioServer

        argv = shlex.split(tools[len("mcp:"):])
        if not argv:
            raise EnvironmentChoiceError("--tools mcp: needs the server's command after the colon (mcp:COMMAND ARGS...)")
        command, *args = local_command(argv)
        return custom_mcp_environment(tasks, StdioServer(command, tuple(args)))
    if tools.startswith(("http://", "https://")):
        from heart.environments.mcp import HttpServer

        return custom_mcp_environment(tasks, HttpServer(tools))
    return CustomEnvironment(tasks, python_tools(tools))


def load_environment(name: str, category: str | None = None, tasks: str | None = None, tools: str | None = None,
                     **options) -> Environment:
    """Return the environment called ``name`` (:data:`ENVIRONMENTS`), for BFCL in ``category``
    (:data:`BFCL_CATEGORIES`; multi_turn_base by default), for ``custom`` a tasks file over
    ``tools`` (:func:`custom_environment`)."""
    check_category(name, category)
    check_custom(name, tasks, tools)
    if name == "custom":
        return custom_environment(tasks, tools)
    if name == "bfcl" and category in BFCL_SINGLE_TURN_CATEGORIES:
        from heart.environments.bfcl_ast import BFCLASTEnvironment

        return BFCLASTEnvironment(category, **options)
    if name == "bfcl":
        from heart.environments.bfcl import BFCLEnvironment

        return BFCLEnvironment(category=category or "multi_turn_base", **options)
    if name == "agentdojo":
        from heart.environments.agentdojo import AgentDojoEnvironment

        return AgentDojoEnvironment(**options)
    raise ValueError(f"unknown environment {name!r}: expected one of {', '.join(ENVIRONMENTS)}")


__all__ = [
    "BFCL_CATEGORIES",
    "BFCL_MULTI_TURN_CATEGORIES",
    "BFCL_SINGLE_TURN_CATEGORIES",
    "ENVIRONMENTS",
    "Environment",
    "EnvironmentChoiceError",
    "EnvironmentSession",
    "EpisodeScore",
    "SPLITS",
    "Task",
    "ToolCall",
    "ToolExecutionError",
    "check_category",
    "check_custom",
    "custom_environment",
    "load_environment",
    "split_of",
]
