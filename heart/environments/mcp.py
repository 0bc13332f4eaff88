"""Any MCP server as a HEART environment: its tools in ToolFace, called by the Primitives.

An :class:`MCPEnvironment` reaches an MCP server — a process it starts over stdio
(:class:`StdioServer`) or a streamable-HTTP endpoint (:class:`HttpServer`) — through the
official MCP Python SDK's ``ClientSession``. Each session opens its own connection (over
stdio: its own server process, so episodes never share tool state), lists the server's tools
and turns each into a :class:`~heart.toolface.Tool`: ToolFace indexes its name, description
and ``inputSchema``; the Primitive binds arguments against that schema and its call goes to
the server's ``tools/call``.

Results become what a local tool returns: ``structuredContent`` when the server gives it,
otherwise the text content (parsed as JSON when it is JSON). A tool result with ``isError``
raises :class:`~heart.environments.base.ToolExecutionError` (the tool's own failure); a server
that dies, hangs past ``call_timeout_s``, or answers with something that is not a tool result
raises :class:`MCPServerError` (a ToolExecutionError too). Either way the Primitive's envelope
is a typed FAILURE (RUNTIME_ERROR) within the timeout, never a hang: every request to the
server runs under a deadline, and a connection that broke fails later calls at once.

Tasks and scoring come from a benchmark when one is given: ``MCPEnvironment(server,
benchmark=BFCLEnvironment())`` runs BFCL's tasks against the MCP server's tools, and at the
end the calls that went through MCP are replayed, in order, on a fresh session of the
benchmark and judged by the benchmark's own checker (BFCL's ``multi_turn_checker`` re-executes
them next to the gold calls anyway). What the benchmark's train split teaches ToolFace
(companions, query log, usage prior) comes from the benchmark (``toolface_source``). Without
a benchmark, :meth:`MCPEnvironment.request` makes one-turn tasks from free text; they run
but are not scored.

    from heart.environments.mcp import MCPEnvironment, StdioServer
    env = MCPEnvironment(lambda task: StdioServer("python", ("server.py", "--task", task.task_id)),
                         benchmark=BFCLEnvironment(), task_ids=["multi_turn_base_1"])
    run_episode(env, env.load_task("multi_turn_base_1"), backend)
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import json
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence, TextIO, Union

from heart.environments.base import (
    Environment,
    EnvironmentSession,
    EpisodeScore,
    Task,
    ToolDocuments,
    ToolExecutionError,
)
from heart.environments.calls import EpisodeLog, LoggedSession, jsonable
from heart.toolface import Tool, ToolSpec

CLARIFY_ANSWER = "I have no further information: please proceed with what you have."
"""What the user of an MCP environment without a benchmark answers a clarification."""

DEFAULT_CALL_TIMEOUT_S = 20.0
"""Deadline of one ``tools/call``: below the Router's default step timeout (30 s), so a hung
server ends in this module's typed failure, not in an abandoned tool call."""
DEFAULT_CONNECT_TIMEOUT_S = 60.0
"""Deadline for starting a server and finishing the MCP handshake (initialize, tools/list)."""
CLOSE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class StdioServer:
    """An MCP server this environment starts as a process and talks to over stdin/stdout."""

    command: str
    args: tuple[str, ...] = ()
    env: Mapping[str, str] | None = field(default=None, compare=False)
    """Extra environment variables for the server process."""
    cwd: str | None = None

    def __str__(self) -> str:
        return " ".join([self.command, *self.args])


@dataclass(frozen=True)
class HttpServer:
    """An MCP server already listening on a streamable-HTTP endpoint (``http://host:port/mcp``)."""

    url: str

    def __str__(self) -> str:
        return self.url


ServerSpec = Union[StdioServer, HttpServer]


class MCPServerError(ToolExecutionError):
    """The MCP server failed, not the tool: it could not be started or reached, it exited, it
    did not answer within the deadline, or its answer was not a valid MCP result."""


def _first_line(err: BaseException) -> str:
    """``Type: first line of the message`` of the innermost first error of a group."""
    while isinstance(err, BaseExceptionGroup) and err.exceptions:
        err = err.exceptions[0]
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0]}" if text else type(err).__name__


class MCPClient:
    """One connection to an MCP server, usable from ordinary (threaded) code.

    The SDK is asynchronous; this runs its ``ClientSession`` on an event loop in a thread of
    its own (an anyio blocking portal) and gives every request a deadline. Thread-safe:
    concurrent calls share the session, as MCP allows.
    """

    def __init__(self, server: ServerSpec, *, connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
                 call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S, errlog: TextIO | None = None):
        import anyio.from_thread

        self.server = server
        self.call_timeout_s = call_timeout_s
        self.errlog = errlog
        self.tools: list[Any] = []
        """The server's tools (``mcp.types.Tool``), as ``tools/list`` gave them at connection."""
        self.server_name = ""
        self._broken: str | None = None
        self._session = None
        self._stop = None
        self._ready = threading.Event()
        self._closed = False
        self._portal_cm = anyio.from_thread.start_blocking_portal(name=f"mcp-client {server}")
        self._portal = self._portal_cm.__enter__()
        self._runner = self._portal.start_task_soon(self._run, connect_timeout_s)
        if not self._ready.wait(connect_timeout_s + 5.0) or self._session is None:
            reason = self._broken or f"no MCP handshake within {connect_timeout_s:g}s"
            self.close()
            raise MCPServerError(f"cannot connect to the MCP server {server}: {reason}")

    # -- the event-loop side ------------------------------------------------------------
    def _transport(self):
        if isinstance(self.server, HttpServer):
            from mcp.client.streamable_http import streamable_http_client

            return streamable_http_client(self.server.url)
        from mcp import StdioServerParameters, stdio_client

        params = StdioServerParameters(command=self.server.command, args=list(self.server.args),
                                       env=dict(self.server.env) if self.server.env else None,
                                       cwd=self.server.cwd)
        from heart.runtime import llamacpp_log

        # the server's stderr (a log line per failed call) goes to heart's log, not the console
        return stdio_client(params, errlog=self.errlog or llamacpp_log.stream())

    async def _run(self, connect_timeout_s: float) -> None:
        """Owns the connection: open it, list the tools, then wait for close(). The
        handshake runs under a deadline that is lifted once the tools are listed."""
        import math

        import anyio
        from mcp import ClientSession

        self._stop = anyio.Event()
        try:
            with anyio.CancelScope(deadline=anyio.current_time() + connect_timeout_s) as scope:
                # No session-wide read timeout: it would bound the handshake too (a server may
                # take seconds to import); tools/call gets its own deadline.
                async with self._transport() as (read, write), ClientSession(read, write) as session:
                    info = await session.initialize()
                    self.server_name = info.server_info.name if info.server_info else ""
                    self.tools = await self._list_tools(session)
                    scope.deadline = math.inf
                    self._session = session
                    self._ready.set()
                    await self._stop.wait()
            if scope.cancelled_caught and not self._ready.is_set():
                self._broken = f"no MCP handshake within {connect_timeout_s:g}s"
        except Exception as err:  # noqa: BLE001 — reported to the caller, never raised in the loop
            if not self._ready.is_set():
                self._broken = _first_line(err)
            else:
                self._broken = f"the connection ended: {_first_line(err)}"
        finally:
            self._broken = self._broken or "the connection is closed"
            self._ready.set()

    @staticmethod
    async def _list_tools(session) -> list[Any]:
        tools, cursor = [], None
        for _ in range(1000):  # a paginator that never ends cannot hang the connection
            from mcp.types import PaginatedRequestParams

            page = await session.list_tools(params=PaginatedRequestParams(cursor=cursor) if cursor else None)
            tools += page.tools
            cursor = page.next_cursor
            if not cursor:
                break
        return tools

    async def _call(self, name: str, arguments: dict[str, Any], timeout_s: float):
        import anyio

        with anyio.fail_after(timeout_s):  # one deadline, cancelling the request when it passes
            return await self._session.call_tool(name, arguments)

    # -- the caller's side --------------------------------------------------------------
    def call_tool(self, name: str, arguments: dict[str, Any], timeout_s: float | None = None) -> Any:
        """Call a tool; its result as plain JSON data (see :func:`tool_result`). Raises
        ToolExecutionError for the tool's own error, MCPServerError for the server's."""
        from mcp.shared.exceptions import MCPError
        from mcp.types import CONNECTION_CLOSED
        from pydantic import ValidationError

        timeout_s = timeout_s or self.call_timeout_s
        where = f"the MCP server {self.server}"
        if self._closed or self._session is None or self._broken:
            raise MCPServerError(f"{where} is not connected: {self._broken or 'the client is closed'}")
        try:
            future = self._portal.start_task_soon(self._call, name, arguments, timeout_s)
        except RuntimeError as err:  # the portal (event loop) has stopped
            raise MCPServerError(f"{where} is not connected: {_first_line(err)}") from None
        try:
            result = future.result(timeout=timeout_s + 5.0)
        except (TimeoutError, concurrent.futures.TimeoutError):
            future.cancel()
            raise MCPServerError(f"{where} did not answer tools/call {name!r} within {timeout_s:g}s") from None
        except concurrent.futures.CancelledError:
            raise MCPServerError(f"tools/call {name!r} was cancelled: the MCP client is closing") from None
        except MCPError as err:
            if err.code == CONNECTION_CLOSED:
                self._broken = "it closed the connection (the process exited or broke the transport)"
                raise MCPServerError(f"{where} closed the connection during tools/call {name!r}: "
                                     "the process exited or broke the transport") from None
            raise MCPServerError(f"{where} refused tools/call {name!r}: error {err.code}: {err.message}") from None
        except ValidationError as err:
            raise MCPServerError(f"{where} answered tools/call {name!r} with a malformed result: "
                                 f"{_first_line(err)}") from None
        except Exception as err:  # noqa: BLE001 — a transport or protocol failure, as data
            raise MCPServerError(f"tools/call {name!r} to {where} failed: {_first_line(err)}") from None
        return tool_result(name, result)

    def close(self) -> None:
        """Close the session (a stdio server process is stopped); bounded, idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._stop is not None and not self._runner.done():
                self._portal.call(self._stop.set)
                with contextlib.suppress(Exception):
                    self._runner.result(timeout=CLOSE_TIMEOUT_S)
            with contextlib.suppress(RuntimeError):
                self._portal.call(self._portal.stop, True)  # cancel whatever is left
        finally:
            with contextlib.suppress(Exception):
                self._portal_cm.__exit__(None, None, None)

    def __enter__(self) -> "MCPClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def tool_spec(tool: Any, category: str = "") -> ToolSpec:
    """An MCP tool (``mcp.types.Tool``) as a ToolSpec: its name, its description (else its
    title), its ``inputSchema`` as the parameters; the category is the tool's
    ``_meta.category`` when it gives one, else ``category`` (the server's name)."""
    schema = dict(tool.input_schema or {})
    schema.setdefault("type", "object")
    schema.setdefault("properties", {})
    meta = tool.meta or {}
    return ToolSpec(tool.name, tool.description or tool.title or "", schema,
                    category=str(meta.get("category") or category))


def tool_result(name: str, result: Any) -> Any:
    """A ``CallToolResult`` as plain JSON data: ``structuredContent`` when given, else the
    content blocks (a text block parsed as JSON when it is JSON; several blocks as a list).
    ``isError`` raises ToolExecutionError with the server's text; anything that is not a
    tool result raises MCPServerError."""
    from mcp.types import CallToolResult

    if not isinstance(result, CallToolResult):
        raise MCPServerError(f"tools/call {name!r} answered with {type(result).__name__}, not a tool result")
    values = [_content_value(block) for block in result.content or []]
    if result.is_error:
        text = "; ".join(v if isinstance(v, str) else json.dumps(v, default=str) for v in values)
        raise ToolExecutionError(text or f"{name} reported an error without a message")
    if result.structured_content is not None:
        return jsonable(result.structured_content)
    if not values:
        return None
    return values[0] if len(values) == 1 else values


def _content_value(block: Any) -> Any:
    if getattr(block, "type", None) == "text":
        try:
            return json.loads(block.text)
        except (json.JSONDecodeError, TypeError):
            return block.text
    row = block.model_dump(mode="json", exclude_none=True) if hasattr(block, "model_dump") else repr(block)
    if isinstance(row, dict) and isinstance(row.get("data"), str):  # image / audio: not in a prompt
        row["data"] = f"<{len(row['data'])} base64 characters>"
    return row


class MCPSession(LoggedSession):
    """One episode over one MCP connection: the server's tools, the call log, the score."""

    clarify_answer = CLARIFY_ANSWER

    def __init__(self, env: "MCPEnvironment", task: Task, client: MCPClient):
        self.env = env
        self.task = task
        self.client = client
        self._log = EpisodeLog(len(task.turns))
        self.infrastructure_failure: str | None = None
        """Why this session's tool calls can no longer be trusted (the server died, hung past
        the deadline, or answered with something that is not a tool result), once one did."""
        self._shadow: EnvironmentSession | None = None
        self.workdir: tempfile.TemporaryDirectory | None = None
        """The episode's own directory, the server's working directory (``episode_setup``)."""
        if env.benchmark is not None:
            # A fresh session of the benchmark, untouched until scoring: the user who answers
            # clarifications, and the state the calls are replayed on for the checker.
            self._shadow = env.benchmark.start(env.benchmark_task(task))
        category = client.server_name or env.name
        self.tools: list[Tool] = [Tool(tool_spec(t, category), self._bind(t.name)) for t in client.tools]

    def _bind(self, name: str):
        def call(**arguments):
            self._log.record(name, arguments)
            try:
                return self.client.call_tool(name, arguments)
            except MCPServerError as err:
                # not the tool's failure: the episode can no longer be trusted (run_episode
                # records it as errored); a tool's own isError is an ordinary failure
                self.infrastructure_failure = self.infrastructure_failure or f"MCP server: {err}"
                raise

        call.__name__ = name
        return call

    def clarify(self, question: str) -> str:
        return self._shadow.clarify(question) if self._shadow is not None else self.clarify_answer

    def score(self) -> EpisodeScore:
        """The benchmark's checker on the calls that went through MCP, replayed in order on a
        fresh benchmark session; an environment without a benchmark does not score."""
        if self._shadow is None:
            return EpisodeScore(0.0, False, {"error_type": "mcp:unscored",
                                             "error_message": "this MCP environment has no benchmark checker"})
        tools = {tool.name: tool for tool in self._shadow.tools}
        unknown: list[str] = []
        for turn in range(self._log.turns_started):
            self._shadow.start_turn(turn)
            for call in self._log.calls[turn]:
                tool = tools.get(call.name)
                if tool is None:
                    unknown.append(call.name)
                    continue
                with contextlib.suppress(Exception):  # an error is part of the record, as it was over MCP
                    tool.fn(**call.arguments)
            if self._log.responses[turn] is not None:
                self._shadow.finish_turn(turn, self._log.responses[turn])
        verdict = self._shadow.score()
        details = {**verdict.details, "scored_by": f"{self.env.benchmark.name} checker (MCP calls replayed)"}
        if unknown:
            details["calls_the_benchmark_lacks"] = sorted(set(unknown))
        return EpisodeScore(verdict.score, verdict.success, details)

    def close(self) -> None:
        try:
            self.client.close()
        finally:
            if self.workdir is not None:
                self.workdir.cleanup()


class MCPEnvironment:
    """The tools of an MCP server as an environment (see the module docstring).

    ``server`` is a :class:`StdioServer` or :class:`HttpServer`, or a function of the task
    giving one (a server started in the task's initial state). ``benchmark`` supplies tasks,
    splits, the clarifying user and the checker; ``task_ids`` limits its tasks to these.
    ``episode_setup(task, directory)``, when given, prepares a fresh directory for each
    episode, in which a stdio server then starts (its working directory), removed when the
    session closes.
    """

    def __init__(self, server: ServerSpec | Callable[[Task], ServerSpec], *,
                 benchmark: Environment | None = None, task_ids: Sequence[str] | None = None,
                 name: str = "mcp", call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
                 connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S, errlog: TextIO | None = None,
                 episode_setup: Callable[[Task, Path], None] | None = None):
        self.name = name
        self.episode_setup = episode_setup
        self.server = server
        self.benchmark = benchmark
        self.call_timeout_s = call_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.errlog = errlog
        self._only = list(task_ids) if task_ids is not None else None
        self._requests: dict[str, Task] = {}
        self._catalog: list[ToolSpec] | None = None
        self._lock = threading.Lock()

    @property
    def toolface_source(self) -> Environment:
        """The environment whose train-split gold teaches ToolFace (the benchmark's, when its
        tools are the server's); :func:`heart.catalog.session_toolface` reads it."""
        return self.benchmark if self.benchmark is not None else self

    def documents(self, session: "MCPSession | None") -> list[ToolDocuments]:
        """What the server listed over ``session``'s own connection (not the session's tool
        list); before a session, the server's listing read on a miss."""
        if session is not None:
            server = session.client.server_name or self.name
            return [ToolDocuments("mcp", f"server {server}", [tool_spec(t) for t in session.client.tools])]
        return [ToolDocuments("mcp", f"server of {self.name}", load=self.catalog)]

    def server_for(self, task: Task | None) -> ServerSpec:
        if callable(self.server) and not isinstance(self.server, (StdioServer, HttpServer)):
            if task is None:
                raise ValueError("this MCP environment starts a server per task: give a task")
            return self.server(task)
        return self.server

    def connect(self, task: Task | None = None, cwd: str | None = None) -> MCPClient:
        """A connection to the server for ``task``; a stdio server started in ``cwd`` when given."""
        server = self.server_for(task)
        if cwd is not None:
            if not isinstance(server, StdioServer):
                raise ValueError(f"an episode's working directory applies to a server this environment starts, "
                                 f"not to {server}")
            server = dataclasses.replace(server, cwd=cwd)
        return MCPClient(server, connect_timeout_s=self.connect_timeout_s,
                         call_timeout_s=self.call_timeout_s, errlog=self.errlog)

    # -- tasks ---------------------------------------------------------------------------
    def task_ids(self, split: str | None = None) -> list[str]:
        ids: list[str] = []
        if self.benchmark is not None:
            ids = self.benchmark.task_ids(split)
            if self._only is not None:
                keep = set(self._only)
                ids = [task_id for task_id in ids if task_id in keep]
        if split is None:
            ids += list(self._requests)
        return ids

    def load_task(self, task_id: str) -> Task:
        if task_id in self._requests:
            return self._requests[task_id]
        if self.benchmark is None or (self._only is not None and task_id not in self._only):
            raise KeyError(f"no task with id {task_id!r} in the MCP environment {self.name!r}")
        return dataclasses.replace(self.benchmark.load_task(task_id), env=self.name)

    def benchmark_task(self, task: Task) -> Task:
        return dataclasses.replace(task, env=self.benchmark.name) if self.benchmark is not None else task

    def request(self, text: str, task_id: str | None = None) -> Task:
        """A one-turn task asking ``text`` (no gold, not scored)."""
        with self._lock:
            task_id = task_id or f"request-{len(self._requests)}"
            task = Task(task_id=task_id, env=self.name, turns=[text])
            self._requests[task_id] = task
        return task

    # -- tools ---------------------------------------------------------------------------
    def catalog(self) -> list[ToolSpec]:
        """The server's tools (listed once, from a server for the first task when the
        server is per task)."""
        with self._lock:
            if self._catalog is None:
                first = None
                if not isinstance(self.server, (StdioServer, HttpServer)):
                    ids = self.task_ids()
                    if not ids:
                        raise ValueError("this MCP environment has no task to start a server for")
                    first = self.load_task(ids[0])
                with self.connect(first) as client:
                    category = client.server_name or self.name
                    self._catalog = [tool_spec(t, category) for t in client.tools]
            return list(self._catalog)

    def start(self, task: Task) -> MCPSession:
        with contextlib.ExitStack() as undo:  # whatever started is stopped if a later step fails
            workdir = None
            if self.episode_setup is not None:
                # a fresh directory per episode, prepared before the server starts in it: tools
                # that work on files (a git repository) see the task's initial state, never
                # another episode's changes
                workdir = tempfile.TemporaryDirectory(prefix="heart-episode-")
                undo.callback(workdir.cleanup)
                self.episode_setup(task, Path(workdir.name))
            client = self.connect(task, cwd=workdir.name if workdir else None)
            undo.callback(client.close)
            session = MCPSession(self, task, client)
            session.workdir = workdir
            undo.pop_all()  # the session owns them now: its close() stops both
        return session
