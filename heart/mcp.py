"""``heart mcp serve``: HEART's primitives for outside agents, as an MCP server.

One environment (BFCL or AgentDojo) and one backend (the gold teacher, an embedded or local
model, or an OpenAI-compatible server), served with the official MCP Python SDK's
``MCPServer`` over stdio (the default) or streamable HTTP (``http://127.0.0.1:8765/mcp``).
Three tools, each with a JSON schema:

- ``toolface_search`` — a query → the tools ToolFace would show the Planner (name, one-line
  description, category, score): over the environment's whole catalog (registered under
  registry provenance, as an episode's ToolFace is), or over one task's own tools with what
  the train split teaches ToolFace (:func:`heart.catalog.session_toolface`).
- ``call_primitive`` — a tool name, with a natural-language request and/or arguments → the
  Tool Primitive's envelope (SUCCESS with its result, or FAILURE with a typed
  ``failure_type``). It runs against a live session of the task, kept between calls (its
  state carries over; ``reset`` starts afresh). A request is resolved into arguments by the
  backend's Primitive role (the given arguments are its resolved bindings); arguments alone
  are bound and executed as the Primitive's deterministic part does (:mod:`heart.primitives`).
  Both go as the loop's do: through the tool-boundary middleware the server was started with
  (``--middleware``, or a ``--harness``'s; prerequisite intercepts look at the successful
  calls of the same ``turn``), with the Primitive's system prompt as the loop would send it
  (``--short-prompt``, a harness's prompt edits: :func:`heart.loop.system_prompt`), and only
  over tools registered under registry provenance (:mod:`heart.provenance`), whose documents
  are hashed again before they run.
- ``solve`` — a task id → every user turn of the task through the HEART loop (Planner,
  Router, Primitives, Verifier), scored by the benchmark's own checker, with the turn answers
  and the trace of role calls; or a free ``request`` in a task's environment (its tools and
  initial state; one turn, not scored).

Malformed input (an unknown task or tool, a missing request, arguments that are not an
object, a value out of range) is answered with an MCP tool error naming the problem; the
server keeps serving. Like ``heart serve`` it has no authentication: HTTP binds 127.0.0.1
unless told otherwise.

    heart mcp serve --env bfcl --model gold                       # stdio, for an MCP client
    heart mcp serve --env bfcl --model smollm2-135m --transport http --port 8765
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import sys
import threading
import traceback
from dataclasses import asdict
from typing import Annotated, Any, Callable

from pydantic import Field

from heart import ROLES
from heart.environments.base import Environment, EnvironmentSession, Task
from heart.loop import LoopConfig, system_prompt
from heart.middleware import TurnCalls, load_middleware
from heart.primitives import (
    SCHEMA_RESOLUTION,
    Envelope,
    contained_tool_calls,
    execute_with_retry,
    failure,
)
from heart.runtime.base import Backend, SamplingConfig
from heart.toolface import Tool, ToolFace

SERVER_NAME = "heart"
MAX_SESSIONS = 64
"""Live ``call_primitive`` sessions kept (least recently used dropped first)."""
MAX_K = 50
PRIMITIVE_TIMEOUT_S = 30.0
"""Default deadline of one ``call_primitive`` execution (the Router's default step timeout)."""


class MCPInputError(ValueError):
    """What the caller asked cannot be served (unknown task or tool, missing input)."""


class MemoryTrace:
    """A trace writer that keeps one episode's role calls in memory (and passes them on to
    an optional file trace)."""

    def __init__(self, then=None):
        self.rows: list[dict[str, Any]] = []
        self.then = then

    def write(self, item) -> None:
        row = item if isinstance(item, dict) else asdict(item)
        self.rows.append(row)
        if self.then is not None:
            self.then.write(item)


def trace_row(row: dict[str, Any], include_messages: bool) -> dict[str, Any]:
    """A role-call event as ``solve`` returns it: who answered what, parsed, with the
    Primitive's envelope; the prompts only when asked for."""
    keep = ["turn", "attempt", "step", "role", "backend", "adapter", "parsed", "parse_error", "latency_s",
            "prompt_tokens", "completion_tokens", "extra", "errored"]
    if include_messages:
        keep += ["messages", "raw_output"]
    return {key: row[key] for key in keep if key in row}


@dataclasses.dataclass
class _Live:
    """A ``call_primitive`` session: the task's live tool state and its own containment."""

    session: EnvironmentSession
    registry: ToolFace
    """The session's tools as registered under registry provenance (:mod:`heart.provenance`):
    what ``call_primitive`` executes, its document hash checked before each run."""
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    untrusted: str | None = None
    """Set when a call was abandoned on timeout: the state may still change under us."""
    turn: int | None = None
    calls: TurnCalls = dataclasses.field(default_factory=TurnCalls)
    """The successful calls of ``turn``: what prerequisite intercepts look at, as in a HEART turn."""


class HeartMCP:
    """What the three tools do, without the transport (tests call it directly too).

    ``backend_for(task)`` gives the backend of one episode (the gold teacher needs the task;
    a model is shared); ``gold`` says it is the gold teacher, which answers only inside a
    benchmark task's episode. ``exclusive`` serialises role calls (an in-process model is
    one set of weights; an OpenAI-compatible server batches by itself).
    """

    def __init__(self, environment: Environment, backend_for: Callable[[Task | None], Backend], *,
                 gold: bool = False, config: LoopConfig = LoopConfig(),
                 sampling: dict[str, SamplingConfig] | None = None, split: str | None = None,
                 seed: int = 0, trace=None, exclusive: bool = False, cache_dir=None):
        self.environment = environment
        self.backend_for = backend_for
        self.gold = gold
        self.config = config
        self.middleware = load_middleware(config.middleware)
        """The tool-boundary intercept set every ``call_primitive`` execution passes, as the
        loop's (``LoopConfig.middleware``: ``--middleware``, or a ``--harness``'s)."""
        self.sampling = sampling or {role: SamplingConfig(max_new_tokens=512) for role in ROLES}
        self.split = split
        self.seed = seed
        self.trace = trace
        self.cache_dir = cache_dir
        self._exclusive = threading.Lock() if exclusive else None
        self._lock = threading.Lock()
        self._live: collections.OrderedDict[str, _Live] = collections.OrderedDict()
        self._toolfaces: collections.OrderedDict[str | None, ToolFace] = collections.OrderedDict()
        self._allowed: set[str] | None = set(environment.task_ids(split)) if split else None

    # -- helpers -------------------------------------------------------------------------
    def task(self, task_id: str) -> Task:
        if self._allowed is not None and task_id not in self._allowed:
            raise MCPInputError(f"task {task_id!r} is not in this server's {self.split} split of "
                                f"{self.environment.name} ({len(self._allowed)} tasks)")
        try:
            return self.environment.load_task(task_id)
        except KeyError as err:
            raise MCPInputError(f"{err.args[0] if err.args else err}; list ids with `heart tasks --env "
                                f"{self.environment.name}`") from None

    def _serialised(self):
        return self._exclusive if self._exclusive is not None else _NoLock()

    def toolface(self, task_id: str | None) -> ToolFace:
        """The environment's whole catalog (no task), or the ToolFace a task's episode plans with."""
        from heart.catalog import retrieval_config, session_toolface, tool_companions

        with self._lock:
            if task_id in self._toolfaces:
                self._toolfaces.move_to_end(task_id)
                return self._toolfaces[task_id]
        if task_id is None:
            from heart.provenance import session_provenance

            # the environment's documents, registered under provenance as an episode's are
            tools = [Tool(spec, _not_executable(spec.name)) for spec in _unique(self.environment.catalog())]
            face = ToolFace(tools, cache_dir=self.cache_dir, config=retrieval_config(self.environment),
                            companions=tool_companions(self.environment),
                            provenance=session_provenance(self.environment, None))
        else:
            session = self.environment.start(self.task(task_id))
            try:
                face = session_toolface(self.environment, session, cache_dir=self.cache_dir)
            finally:
                _close(session)
        with self._lock:
            self._toolfaces[task_id] = face
            while len(self._toolfaces) > MAX_SESSIONS:
                self._toolfaces.popitem(last=False)
        return face

    def _live_session(self, task: Task, reset: bool) -> _Live:
        with self._lock:
            live = self._live.get(task.task_id)
            if live is not None and not reset:
                self._live.move_to_end(task.task_id)
                return live
        live = self._start_live(task)
        with self._lock:
            old = self._live.pop(task.task_id, None)
            self._live[task.task_id] = live
            dropped = [self._live.popitem(last=False)[1] for _ in range(max(0, len(self._live) - MAX_SESSIONS))]
        for gone in ([old] if old is not None else []) + dropped:
            _close(gone.session)
        return live

    def _start_live(self, task: Task) -> _Live:
        """A fresh session of ``task`` with its tools registered as an episode's ToolFace
        registers them (:func:`heart.provenance.session_provenance`; nothing is embedded)."""
        from heart.provenance import session_provenance

        session = self.environment.start(task)
        registry = ToolFace(session.tools, cache_dir=self.cache_dir,
                            provenance=session_provenance(self.environment, session))
        return _Live(session, registry)

    def close(self) -> None:
        with self._lock:
            live, self._live = list(self._live.values()), collections.OrderedDict()
        for item in live:
            _close(item.session)

    # -- the tools -----------------------------------------------------------------------
    def toolface_search(self, query: str, task_id: str | None = None, k: int | None = None) -> dict[str, Any]:
        if not query.strip():
            raise MCPInputError("query is empty: say what the tool should do")
        face = self.toolface(task_id)
        shown = face.retrieve(query, k)
        return {"query": query, "task_id": task_id, "environment": self.environment.name,
                "catalog_size": len(face), **({"refused": list(face.refusals)} if face.refusals else {}),
                "tools": [{"name": t.name, "description": t.description, "category": t.category,
                           "score": round(t.score, 4)} for t in shown]}

    def call_primitive(self, task_id: str, tool: str, request: str | None = None,
                       arguments: dict[str, Any] | None = None, turn: int = 0, reset: bool = False,
                       timeout_s: float = PRIMITIVE_TIMEOUT_S) -> dict[str, Any]:
        request = (request or "").strip() or None
        if request is None and arguments is None:
            raise MCPInputError("give a natural-language request, arguments, or both")
        if request is not None and arguments is None and self.gold:
            raise MCPInputError("the gold teacher resolves requests only inside `solve` (it follows a task's "
                                "gold calls): pass `arguments`, or serve a model (--model)")
        task = self.task(task_id)
        if not 0 <= turn < len(task.turns):
            raise MCPInputError(f"task {task_id} has turns 0..{len(task.turns) - 1}, not {turn}")
        live = self._live_session(task, reset)
        with live.lock:
            if live.untrusted:
                raise MCPInputError(f"the session of {task_id} is no longer trustworthy ({live.untrusted}); "
                                    "call again with reset=true")
            refusal = next((r for r in live.registry.refusals if r["tool"] == tool), None)
            if refusal is not None:
                raise MCPInputError(f"tool {tool!r} of task {task_id} is not registered: {refusal['reason']}")
            if tool not in live.registry:
                names = sorted(live.registry.names())
                raise MCPInputError(f"task {task_id} has no tool {tool!r}; its tools are "
                                    f"{', '.join(names[:40])}{' …' if len(names) > 40 else ''}")
            live.session.start_turn(turn)
            if live.turn != turn:  # prerequisite intercepts look at this turn's calls only
                live.turn, live.calls = turn, TurnCalls()
            target = live.registry.get(tool)
            resolved_by = "arguments"
            primitive_output = None
            if request is not None and not self.gold:
                resolved_by = "primitive role"
                arguments, primitive_output, envelope = self._resolve(target, request, arguments or {}, task)
                if envelope is not None:
                    return self._answer(envelope, task_id, turn, resolved_by, primitive_output)
            with contained_tool_calls() as containment:
                envelope = execute_with_retry(target, arguments, timeout_s=timeout_s, attempts=1,
                                              middleware=self.middleware, calls=live.calls)
            if containment.abandoned:
                live.untrusted = containment.abandoned
        answer = self._answer(envelope, task_id, turn, resolved_by, primitive_output)
        if request is not None and self.gold:
            answer["note"] = "the gold teacher resolves no requests: the arguments ran as given"
        return answer

    def _resolve(self, tool: Tool, request: str, bindings: dict[str, Any], task: Task):
        """The Primitive role's arguments for ``request`` (None + a FAILURE envelope when it
        cannot resolve them)."""
        from heart.calls import EpisodeContext, RoleClient
        from heart.episode import episode_id
        from heart.roles import primitive
        from heart.roles.registry import PRIMITIVE

        backend = self.backend_for(task)
        context = EpisodeContext(episode_id(task.env, task.task_id, self.seed, backend.name), task.task_id, task.env)
        card = primitive.tool_card(tool.name, tool.spec.description, tool.spec.parameters)
        payload = primitive.build_payload(request, bindings, card)
        system = system_prompt(PRIMITIVE, self.config, payload)  # short prompt and harness edits, as the loop's
        prefill = PRIMITIVE.response_prefix if self.config.prefill and not self.config.constrained else ""
        schema = PRIMITIVE.schema_for_input(payload) if self.config.constrained else None
        with self._serialised():
            call = RoleClient(backend, context, self.trace, self.sampling).call(
                PRIMITIVE.name, PRIMITIVE.build_messages(payload, system_prompt=system),
                lambda text: PRIMITIVE.parse_for_input(text, payload), 0, prefill=prefill, schema=schema)
        output = call.generation.text
        if not call.ok:
            return None, output, failure(tool.name, SCHEMA_RESOLUTION,
                                         f"unreadable primitive output: {call.result.error}")
        if call.result.value.status == "UNRESOLVABLE":
            return None, output, failure(tool.name, SCHEMA_RESOLUTION, call.result.value.reason)
        return call.result.value.arguments, output, None

    @staticmethod
    def _answer(envelope: Envelope, task_id: str, turn: int, resolved_by: str, output: str | None) -> dict[str, Any]:
        row = {"task_id": task_id, "turn": turn, "resolved_by": resolved_by, **envelope.to_dict()}
        if output is not None:
            row["primitive_output"] = output
        return row

    def solve(self, task_id: str, request: str | None = None, include_messages: bool = False) -> dict[str, Any]:
        from heart.episode import run_episode

        task = self.task(task_id)
        request = (request or "").strip() or None
        if request is not None:
            if self.gold:
                raise MCPInputError("the gold teacher answers only a benchmark task's own turns (it follows their "
                                    "gold calls): drop `request`, or serve a model (--model)")
            task = dataclasses.replace(task, turns=[request], gold=None, gold_response=None)
        trace = MemoryTrace(self.trace)
        backend = self.backend_for(task)
        with self._serialised():
            result = run_episode(self.environment, task, backend, config=self.config, trace=trace, seed=self.seed,
                                 sampling=self.sampling, cache_dir=self.cache_dir)
        record = result.record
        turns = [{"turn": i, "query": query, "verdict": r.verdict, "replans": r.replans_used, "response": r.response}
                 for i, (query, r) in enumerate(zip(task.turns, result.turns))]
        scored = request is None and not record.errored
        return {
            "task_id": task_id, "environment": self.environment.name, "backend": backend.name,
            "request": request,
            "answer": turns[-1]["response"] if turns else "",
            "turns": turns,
            "score": record.score if scored else None,
            "success": record.success if scored else None,
            "checker": record.checker if scored else {},
            "scored": scored,
            "errored": record.errored, "error": record.error,
            "wall_s": record.wall_s,
            "trace": [trace_row(row, include_messages) for row in trace.rows if row.get("kind") == "event"],
        }


class _NoLock:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _close(session) -> None:
    try:
        session.close()
    except Exception:  # a session that fails to close holds nothing we can still release
        pass


def _unique(specs):
    seen: set[str] = set()
    for spec in specs:
        if spec.name not in seen:
            seen.add(spec.name)
            yield spec


def _not_executable(name: str):
    def call(**arguments):
        raise RuntimeError(f"{name} is listed for search only: call it through call_primitive with a task id")

    return call


# -- the MCP server ----------------------------------------------------------------------
TaskId = Annotated[str, Field(min_length=1, max_length=200,
                              description="A task id of the served environment, e.g. multi_turn_base_1 "
                                          "(BFCL) or workspace/user_task_0 (AgentDojo).")]


def build_server(heart: HeartMCP, host: str = "127.0.0.1", port: int = 8765):
    """The SDK's ``MCPServer`` with the three tools bound to ``heart``."""
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError

    env = heart.environment.name
    server = MCPServer(SERVER_NAME, instructions=(
        f"HEART over the {env} benchmark: search its tools with toolface_search, run one tool through a "
        "Tool Primitive with call_primitive (state is kept per task id), or solve a task end to end with "
        "the Planner, Router, Primitives and Verifier."), log_level="WARNING")
    # MCPServer configures the root logger; libraries whose own loggers sit at DEBUG (bm25s)
    # would then print through it: only warnings reach stderr.
    for handler in logging.getLogger().handlers:
        handler.setLevel(max(handler.level, logging.WARNING))

    def guarded(name: str, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        try:
            return fn()
        except MCPInputError as err:
            raise ToolError(str(err)) from None
        except Exception as err:  # a bug or an infrastructure failure: say so, keep serving
            traceback.print_exc(file=sys.stderr)
            raise ToolError(f"{name} failed inside the server: {type(err).__name__}: {err}") from None

    @server.tool(description=(
        f"Search the {env} tool catalog as HEART's ToolFace does for the Planner: the tools it would show for "
        "a query, best first, each with its name, a one-line description, its category and the fused "
        "retrieval score (0 for a companion tool). With task_id, search that task's own tools with what the "
        "train split taught ToolFace (exactly the list its Planner sees); without, the whole catalog."))
    def toolface_search(
        query: Annotated[str, Field(min_length=1, max_length=4000, description="What the tool should do.")],
        task_id: Annotated[str | None, Field(max_length=200, description="Search this task's tools only.")] = None,
        k: Annotated[int | None, Field(ge=1, le=MAX_K, description="Ranked tools before companions are added "
                                                                  "(default: ToolFace's own, 7).")] = None,
    ) -> dict[str, Any]:
        return guarded("toolface_search", lambda: heart.toolface_search(query, task_id, k))

    @server.tool(description=(
        "Run one tool of a task through a HEART Tool Primitive and return its envelope: status SUCCESS with "
        "the result and a one-sentence summary, or FAILURE with failure_type SCHEMA_RESOLUTION (arguments do "
        "not fit the schema), CONSTRAINT_VIOLATION (they break an enum, range or pattern) or RUNTIME_ERROR "
        "(the tool failed or timed out), and details. The call runs against the task's live session, whose "
        "state is kept between calls (reset=true starts from the task's initial state). Give arguments to "
        "bind and execute them as they are; give a natural-language request to have the Primitive role "
        "resolve it into arguments (any arguments given are its resolved bindings)."))
    def call_primitive(
        task_id: TaskId,
        tool: Annotated[str, Field(min_length=1, max_length=200, description="The tool's name (see toolface_search).")],
        request: Annotated[str | None, Field(max_length=4000, description="What the call should do, in words.")] = None,
        arguments: Annotated[dict[str, Any] | None, Field(description="Arguments by parameter name.")] = None,
        turn: Annotated[int, Field(ge=0, le=1000, description="The user turn the call is logged under.")] = 0,
        reset: Annotated[bool, Field(description="Start the task's session afresh first.")] = False,
        timeout_s: Annotated[float, Field(gt=0, le=600,
                                          description="Execution deadline in seconds.")] = PRIMITIVE_TIMEOUT_S,
    ) -> dict[str, Any]:
        return guarded("call_primitive", lambda: heart.call_primitive(task_id, tool, request, arguments, turn,
                                                                       reset, timeout_s))

    @server.tool(description=(
        f"Solve a {env} task with the HEART loop (Planner → Router → Tool Primitives → Verifier, with "
        "re-plans) in a fresh session: every user turn of the task, scored by the benchmark's own checker. "
        "Returns each turn's verdict and answer, the score, and the trace of role calls. With request, the "
        "loop answers that request instead, as one turn in the task's environment (its tools and initial "
        "state), unscored."))
    def solve(
        task_id: TaskId,
        request: Annotated[str | None, Field(max_length=4000, description=(
            "A request to answer in the task's environment instead of its own turns."))] = None,
        include_messages: Annotated[bool, Field(description="Include each role call's prompt and raw output "
                                                            "in the trace.")] = False,
    ) -> dict[str, Any]:
        return guarded("solve", lambda: heart.solve(task_id, request, include_messages))

    return server


def serve(args, heart: HeartMCP, key: str | None = None) -> int:
    """Run the server until the client disconnects (stdio) or until interrupted (HTTP; with
    ``key``, every request must carry it: :mod:`heart.access`)."""
    server = build_server(heart)
    try:
        if args.transport == "stdio":
            print(f"heart mcp: serving {heart.environment.name} over stdio", file=sys.stderr)
            server.run("stdio")
        else:
            import uvicorn

            from heart.access import RequireKey

            app = server.streamable_http_app(host=args.host)
            if key:
                app = RequireKey(app, key)
            print(f"heart mcp: serving {heart.environment.name} on http://{args.host}:{args.port}/mcp"
                  f"{' (API key required)' if key else ''}", file=sys.stderr, flush=True)
            uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    except KeyboardInterrupt:
        pass
    finally:
        heart.close()
    return 0
