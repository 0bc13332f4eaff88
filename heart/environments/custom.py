"""A user's own tools and tasks as an environment: a tasks file, and Python functions or an
MCP server.

    env = CustomEnvironment("tasks.jsonl", python_tools("my_tools.py"))     # typed functions
    env = custom_mcp_environment("tasks.jsonl", StdioServer("uvx", ["mcp-server-time"]))

**The tasks file** (JSONL, one task a line, checked at load: :func:`load_tasks` names the line
and the field of anything wrong)::

    {"id": "weather-1", "request": "What is the weather in Paris and in Rome?",
     "expected_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}},
                        {"name": "get_weather", "arguments": {"city": "Rome"}}]}
    {"id": "notes-2", "request": ["Create a note 'milk'.", "Now list my notes."],
     "expected_calls": [[{"name": "add_note", "arguments": {"text": "milk"}}], [{"name": "list_notes"}]]}

``request`` is one turn (a string) or several (a list); ``expected_calls`` is optional: for a
one-turn task a list of calls, for several turns a list per turn. ``setup`` (optional, for
tools served by a stdio MCP server) is a command that prepares the task's initial state: it
runs from the tasks file's folder (``python`` is this interpreter) with a fresh, empty
directory as its last argument, and the episode's server then starts in that directory::

    {"id": "git-3", "setup": "python make_repo.py", "request": "Show the status of ./project.",
     "expected_calls": [{"name": "git_status", "arguments": {"repo_path": "project"}}]}
 A task with expected calls is
scored by :func:`check_calls`, BFCL's AST-checker rules: per turn, every expected call is
matched by one call the agent made (any order) with the same function, every expected
argument present with an equal value (numbers as numbers, strings without case, spaces and
punctuation), and no other argument; no call beyond the expected ones. A task without them is
not scored (``details.scored: false``): its episodes can only be judged by a teacher's own
Verifier. Tasks are split train / dev / test by id (:mod:`heart.environments.splits`).

**Python tools** (:func:`python_tools`): the public functions of a module (a dotted name or a
``.py`` file), each a tool whose schema comes from its type hints and Google-style docstring
(``transformers.utils.get_json_schema``, as smolagents' ``@tool`` does); a function it cannot
describe is refused at registration, naming the function and why. They run in this process:
state a function keeps lives across episodes.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from heart.environments.base import CatalogEnvironment, EpisodeScore, Task, ToolCall, ToolExecutionError
from heart.environments.calls import EpisodeLog, LoggedSession
from heart.environments.splits import split_of
from heart.toolface import Tool, ToolSpec
from heart.user_errors import UserError

NAME = "custom"
CLARIFY_ANSWER = ("I have no further information: everything needed is in my request. "
                  "Please proceed with what you have.")


class TasksFileError(UserError):
    """A tasks file that cannot be read; the message names the file, the line and the field."""


class ToolRegistrationError(UserError):
    """A function that cannot be a tool; the message names it and says why."""


SETUP_TIMEOUT_S = 120.0
"""Deadline of one task's ``setup`` command."""


# -- the tasks file ----------------------------------------------------------------------------

class _Call(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1)
    arguments: dict[str, Any] = Field(default_factory=dict)


class _TaskLine(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str = Field(min_length=1)
    request: str | list[str]
    expected_calls: list[_Call] | list[list[_Call]] | None = None
    setup: str | None = Field(default=None, min_length=1)

    @field_validator("request")
    @classmethod
    def _turns(cls, value: str | list[str]) -> str | list[str]:
        turns = [value] if isinstance(value, str) else value
        if not turns or any(not t.strip() for t in turns):
            raise ValueError("every turn of the request must be non-empty text")
        return value


def load_tasks(path: str | Path) -> list[Task]:
    """The tasks of a tasks file (see the module docstring); TasksFileError naming the line
    and field of the first problem."""
    path = Path(path)
    if not path.is_file():
        raise TasksFileError(f"tasks file {path} does not exist")
    tasks: dict[str, Task] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as err:
            raise TasksFileError(f"{path}: line {number}: not a JSON object ({err.msg}, column {err.colno})") from None
        try:
            entry = _TaskLine.model_validate(raw)
        except ValidationError as err:
            first = err.errors()[0]
            field = ".".join(str(p) for p in first["loc"] if not str(p).startswith(("list[", "str")))
            raise TasksFileError(f"{path}: line {number}: field {field or '(line)'!r}: {first['msg']}") from None
        turns = [entry.request] if isinstance(entry.request, str) else list(entry.request)
        gold = None
        if entry.expected_calls is not None:
            nested = bool(entry.expected_calls) and isinstance(entry.expected_calls[0], list)
            per_turn = entry.expected_calls if nested else [entry.expected_calls]
            if len(per_turn) != len(turns):
                raise TasksFileError(f"{path}: line {number}: field 'expected_calls': {len(per_turn)} turn(s) of calls for "
                                     f"{len(turns)} turn(s) of request (several turns take a list of calls per turn)")
            gold = [[ToolCall(c.name, c.arguments) for c in calls] for calls in per_turn]
        if entry.id in tasks:
            raise TasksFileError(f"{path}: line {number}: field 'id': {entry.id!r} is the id of an earlier task")
        meta = {}
        if entry.setup is not None:
            argv = shlex.split(entry.setup)
            if not argv:
                raise TasksFileError(f"{path}: line {number}: field 'setup': an empty command")
            meta = {"setup": local_command(argv), "setup_from": str(path.resolve().parent)}
        tasks[entry.id] = Task(task_id=entry.id, env=NAME, turns=turns, gold=gold, meta=meta)
    if not tasks:
        raise TasksFileError(f"{path}: no tasks")
    return list(tasks.values())


def local_command(argv: list[str]) -> list[str]:
    """A command line whose ``python`` is this interpreter: a server or script installed beside
    the toolkit runs without an activated environment."""
    return [sys.executable if argv[0] in ("python", "python3") else argv[0], *argv[1:]]


# -- Python functions as tools -------------------------------------------------------------------

def python_tools(spec: str | Path) -> list[Tool]:
    """The public functions defined in a module (a dotted name, or a ``.py`` file) as tools,
    in definition order; ToolRegistrationError for one that cannot be described."""
    from transformers.utils import get_json_schema

    module = _import(spec)
    functions = [fn for _, fn in inspect.getmembers(module, inspect.isfunction)
                 if fn.__module__ == module.__name__ and not fn.__name__.startswith("_")]
    functions.sort(key=lambda fn: fn.__code__.co_firstlineno)
    if not functions:
        raise ToolRegistrationError(f"{spec}: no public function to make a tool of")
    # the ToolFace category the Planner sees: the module's own name (a file's stem)
    category = Path(spec).stem if str(spec).endswith(".py") else str(spec).rpartition(".")[2]
    tools = []
    for fn in functions:
        unsupported = [p.name for p in inspect.signature(fn).parameters.values()
                       if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY)]
        if unsupported:
            raise ToolRegistrationError(f"{spec}: function {fn.__name__}: parameters {', '.join(unsupported)} are "
                                        "*args, **kwargs or positional-only; a tool takes named arguments only")
        try:
            schema = get_json_schema(fn)["function"]
        except Exception as err:  # transformers' TypeHintParsingException / DocstringParsingException
            raise ToolRegistrationError(f"{spec}: function {fn.__name__} cannot be described as a tool: {err} "
                                        "(every parameter needs a type hint and a line under 'Args:' in "
                                        "its docstring)") from None
        tools.append(Tool(ToolSpec(schema["name"], schema.get("description", ""), schema["parameters"],
                                   category=category), fn))
    return tools


def _import(spec: str | Path):
    path = Path(spec)
    if path.suffix == ".py":
        if not path.is_file():
            raise ToolRegistrationError(f"tools module {path} does not exist")
        name = f"heart_custom_tools_{path.stem}"
        module_spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        module_spec.loader.exec_module(module)
        return module
    try:
        return importlib.import_module(str(spec))
    except ImportError as err:
        raise ToolRegistrationError(f"tools module {spec!r} cannot be imported: {err}") from None


# -- the checker -------------------------------------------------------------------------------

def _normal(value: Any) -> Any:
    """A value as BFCL's AST checker compares it: numbers as floats, strings lower-cased
    without spaces and punctuation, lists and dicts item by item."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        return re.sub(r"[\s,./\-_*^]", "", value).lower()
    if isinstance(value, (list, tuple)):
        return [_normal(v) for v in value]
    if isinstance(value, dict):
        return {k: _normal(v) for k, v in value.items()}
    return value


def _matches(expected: ToolCall, made: ToolCall) -> bool:
    return (expected.name == made.name and set(made.arguments) == set(expected.arguments)
            and all(_normal(made.arguments[k]) == _normal(v) for k, v in expected.arguments.items()))


def check_calls(expected: list[list[ToolCall]], made: list[list[ToolCall]]) -> tuple[bool, str]:
    """(valid, why not) of the calls ``made`` per turn against the ``expected`` ones (the
    module docstring's rules)."""
    for turn, wanted in enumerate(expected):
        calls = list(made[turn]) if turn < len(made) else []
        for call in wanted:
            match = next((i for i, c in enumerate(calls) if _matches(call, c)), None)
            if match is None:
                near = next((c for c in calls if c.name == call.name), None)
                why = f"called with {near.arguments}" if near else "not called"
                return False, f"turn {turn}: expected {call.name}({call.arguments}), {why}"
            calls.pop(match)
        if calls:
            return False, f"turn {turn}: calls beyond the expected ones: {', '.join(c.name for c in calls)}"
    return True, ""


# -- the environment ---------------------------------------------------------------------------

@dataclass
class CustomSession(LoggedSession):
    """One episode: the tools bound to this session's call log, and the checker."""

    task: Task
    tools: list[Tool]
    clarify_answer: str = CLARIFY_ANSWER

    def __post_init__(self) -> None:
        self._log = EpisodeLog(len(self.task.turns))
        self.tools = [Tool(t.spec, self._logged(t)) for t in self.tools]

    def _logged(self, tool: Tool) -> Callable[..., Any]:
        def call(**arguments):
            self._log.record(tool.name, dict(arguments))
            try:
                return tool.fn(**arguments)
            except Exception as err:  # the tool's own error: an ordinary failed call
                raise ToolExecutionError(f"{tool.name}: {type(err).__name__}: {err}") from err

        call.__name__ = tool.name
        return call

    def score(self) -> EpisodeScore:
        if self.task.gold is None:
            return EpisodeScore(0.0, False, {"scored": False, "error_type": "custom:unscored",
                                             "error_message": "the task has no expected calls"})
        valid, why = check_calls(self.task.gold, self.executed_calls())
        details = {"scored": True, "calls": sum(len(turn) for turn in self.executed_calls())}
        if not valid:
            details.update(error_type="custom:calls", error_message=why)
        return EpisodeScore(1.0 if valid else 0.0, valid, details)


class CustomEnvironment(CatalogEnvironment):
    """A tasks file over a set of tools (see the module docstring). Without ``tools`` its
    sessions record calls without running them (the checker of an MCP environment, whose
    server runs the calls: :func:`custom_mcp_environment`)."""

    name = NAME

    def __init__(self, tasks: str | Path, tools: list[Tool] | None = None, specs: list[ToolSpec] | None = None):
        self.tasks_file = str(tasks)
        self._tasks = {t.task_id: t for t in load_tasks(tasks)}
        if tools is not None:
            _refuse_setup(self, "Python functions run in this process, beside every other episode's")
        self._tools = tools
        self._specs = [t.spec for t in tools] if tools is not None else list(specs or [])

    def task_ids(self, split: str | None = None) -> list[str]:
        return [t for t in self._tasks if split is None or split_of(self.name, t) == split]

    def load_task(self, task_id: str) -> Task:
        try:
            return self._tasks[task_id]
        except KeyError:
            raise KeyError(f"no task {task_id!r} in {self.tasks_file}") from None

    def catalog(self) -> list[ToolSpec]:
        return list(self._specs)

    def start(self, task: Task) -> CustomSession:
        if self._tools is not None:
            return CustomSession(task, list(self._tools))
        recorded = [Tool(spec, lambda **arguments: {"status": "recorded"}) for spec in self._specs]
        return CustomSession(task, recorded)


def custom_mcp_environment(tasks: str | Path, server: Any, **options: Any):
    """An MCP server's tools over a tasks file: the server runs the calls (a server per
    episode), the tasks file's checker scores them (:class:`heart.environments.mcp.MCPEnvironment`
    with this environment as its benchmark)."""
    from heart.environments.mcp import MCPEnvironment

    from heart.environments.mcp import StdioServer

    probe = MCPEnvironment(server, name=NAME, **options)
    checker = CustomEnvironment(tasks, specs=probe.catalog())
    if not isinstance(server, StdioServer):
        _refuse_setup(checker, f"the server at {server} is not started by this toolkit")
    setup = run_setup if any(t.meta.get("setup") for t in checker._tasks.values()) else None
    return MCPEnvironment(server, benchmark=checker, name=NAME, episode_setup=setup, **options)


def _refuse_setup(environment: CustomEnvironment, why: str) -> None:
    first = next((t.task_id for t in environment._tasks.values() if t.meta.get("setup")), None)
    if first is not None:
        raise TasksFileError(f"{environment.tasks_file}: task {first!r}: field 'setup' prepares a directory for a "
                             f"stdio MCP server (--tools mcp:COMMAND) to start in; {why}")


def run_setup(task: Task, directory: Path) -> None:
    """Run ``task``'s setup command on the episode's fresh ``directory`` (the module
    docstring); a command that fails or hangs fails the episode's start, naming the task."""
    from heart.environments.mcp import MCPServerError

    argv = task.meta.get("setup")
    if not argv:
        return
    try:
        done = subprocess.run([*argv, str(directory)], cwd=task.meta["setup_from"], capture_output=True, text=True,
                              timeout=SETUP_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise MCPServerError(f"task {task.task_id}: setup {' '.join(argv)!r} did not run: {err}") from None
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise MCPServerError(f"task {task.task_id}: setup {' '.join(argv)!r} exited with {done.returncode}: {tail[0]}")
