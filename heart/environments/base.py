"""The environment interface: tasks, tools into ToolFace, execution, and scoring.

An :class:`Environment` is the benchmark (its task list, its tool catalog); an
:class:`EnvironmentSession` is one live episode of one task: its own copy of the tool
state, the executable tools bound to that state, a log of every call that ran, and the
benchmark's own checker to score the episode at the end.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import AbstractSet, Any, Callable, Protocol, Sequence

from heart.toolface import Tool, ToolSpec


@dataclass(frozen=True)
class ToolCall:
    """A call by name with keyword arguments (gold calls, executed calls)."""

    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Computation:
    """A value a turn's answer needs that no tool returns: computed from the turn's gold
    calls' results by one expression (a code step, :mod:`heart.sandbox`). Written from the
    task's own request — what to compute, over which results — never from its answer."""

    objective: str
    """What is computed, in a few words (the code step's objective)."""
    expression: str
    """The Python expression, over the variables named in ``inputs``."""
    inputs: dict[str, int]
    """Variable name → index (in the turn's gold calls) of the call whose result it holds."""


@dataclass(frozen=True)
class Task:
    """One benchmark task: one or more user turns, and the gold calls when known."""

    task_id: str
    env: str
    turns: list[str]
    """The user's query for each turn (BFCL multi-turn has several, AgentDojo one)."""
    gold: list[list[ToolCall]] | None = None
    """Gold calls per turn, in order; used by gold-guided teachers and faithfulness tests."""
    gold_response: list[str] | None = None
    """What a correct final answer should contain per turn, when the benchmark says so."""
    computations: list[list[Computation]] | None = None
    """Per turn, the values its answer computes from the gold calls' results (a sum, a time
    span), for gold-guided teachers; None when no turn needs one."""
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class EpisodeScore:
    """The benchmark's own verdict on an episode."""

    score: float
    success: bool
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ToolDocuments:
    """Tool documents an environment vouches for, as registry provenance records them
    (:mod:`heart.provenance`): where they come from, which one, and the documents — given
    now, or read by ``load`` the first time a document is not among those given."""

    source: str
    """One of :data:`heart.provenance.SOURCES`: ``catalog``, ``library``, ``mcp``."""
    origin: str
    """Which one: the environment, the composite, the MCP server."""
    specs: Sequence[ToolSpec] = ()
    load: Callable[[], Sequence[ToolSpec]] | None = None


class ToolExecutionError(RuntimeError):
    """The tool ran and reported an error (the benchmark's own error, not ours)."""


class EnvironmentSession(Protocol):
    """One live episode. Tools in ``tools`` act on this session's state only.

    :class:`heart.environments.calls.LoggedSession` gives the defaults of the members below
    that most sessions do not need (no state, no answered turns, nothing to close)."""

    task: Task
    tools: list[Tool]
    state: Callable[[], Any] | None
    """The session's state as plain JSON, for the carried validation's state-change check
    (:mod:`heart.validation`); None for a session that does not expose it (an MCP server)."""
    answered_turns: AbstractSet[int]
    """Turns the user already gave as a clarification's answer (BFCL miss_param): the loop
    does not run them again."""
    infrastructure_failure: str | None
    """Why this session's tool calls can no longer be trusted (an MCP server that died or
    hung), once that happened: the episode is recorded as errored, not as the model's failure."""

    def close(self) -> None:
        """Release what the session holds (a connection, a server process); scoring is done."""

    def start_turn(self, turn: int) -> None:
        """Begin user turn ``turn``: later tool calls are logged under it."""

    def clarify(self, question: str) -> str:
        """The environment's user answers a clarification question."""

    def finish_turn(self, turn: int, response: str) -> None:
        """Record the agent's final natural-language response for the turn."""

    def executed_calls(self) -> list[list[ToolCall]]:
        """Every call that ran, per turn (including calls whose tool reported an error)."""

    def score(self) -> EpisodeScore:
        """Score the episode with the benchmark's own checker."""


class Environment(Protocol):
    """A benchmark: its tasks, its tool catalog, and sessions over its tasks.

    :class:`CatalogEnvironment` gives the defaults for an environment whose tools are its
    own catalog."""

    name: str
    toolface_source: "Environment"
    """The environment whose measured settings and train-split gold teach ToolFace
    (:func:`heart.catalog.session_toolface`): itself, or the benchmark whose tools it serves
    (an MCP server wrapping one)."""

    def documents(self, session: EnvironmentSession | None) -> list[ToolDocuments]:
        """The tool documents this environment vouches for in ``session`` (None: before any
        session), for the registry provenance of the episode's ToolFace."""

    def task_ids(self, split: str | None = None) -> list[str]:
        """All task ids, or those of one split ("train", "dev", "test"), in a stable order."""

    def load_task(self, task_id: str) -> Task:
        """The task with this id; raises KeyError naming the id when there is none."""

    def catalog(self) -> list[ToolSpec]:
        """Every tool schema this benchmark can offer (for indexing ToolFace once)."""

    def start(self, task: Task) -> EnvironmentSession:
        """A fresh session for ``task``, with its own tool state."""


class CatalogEnvironment:
    """What an environment whose tools are its own catalog answers for the members of
    :class:`Environment` beyond tasks and sessions: it teaches ToolFace itself, and vouches
    for its session's tools now and its whole catalog on a miss."""

    name: str

    @property
    def toolface_source(self) -> Environment:
        return self  # type: ignore[return-value]

    def catalog(self) -> list[ToolSpec]:
        raise NotImplementedError

    def documents(self, session: EnvironmentSession | None) -> list[ToolDocuments]:
        given = [tool.spec for tool in session.tools] if session is not None else []
        return [ToolDocuments("catalog", self.name, given, load=self.catalog)]
