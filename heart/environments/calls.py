"""What every environment session keeps about its episode: the calls and answers per turn.

Both benchmarks score from the same record, so it lives here once: which turn is open,
every call that ran under it (in order, including calls whose tool reported an error), and
the agent's final response for each turn. :func:`jsonable` turns tool results (pydantic
models, datetimes, nested lists) into plain JSON data so traces can store them.
"""

from __future__ import annotations

import copy
from typing import AbstractSet, Any, Callable

from pydantic import TypeAdapter

from heart.environments.base import ToolCall


class EpisodeLog:
    """The calls and final responses of one episode, per user turn."""

    def __init__(self, n_turns: int):
        self.n_turns = n_turns
        self.calls: list[list[ToolCall]] = [[] for _ in range(n_turns)]
        self.responses: list[str | None] = [None] * n_turns
        self.turns_started = 0
        """How many turns have been opened; an episode cut short leaves this < n_turns."""
        self._current: int | None = None

    def start_turn(self, turn: int) -> None:
        if not 0 <= turn < self.n_turns:
            raise ValueError(f"turn {turn} is out of range: this task has {self.n_turns} turns")
        self._current = turn
        self.turns_started = max(self.turns_started, turn + 1)

    def record(self, name: str, arguments: dict[str, Any]) -> ToolCall:
        """Log a call under the open turn (before it runs, so failed calls are logged too)."""
        if self._current is None:
            raise RuntimeError(f"tool {name!r} was called before start_turn(): no turn is open")
        call = ToolCall(name, copy.deepcopy(dict(arguments)))
        self.calls[self._current].append(call)
        return call

    def finish_turn(self, turn: int, response: str) -> None:
        if not 0 <= turn < self.n_turns:
            raise ValueError(f"turn {turn} is out of range: this task has {self.n_turns} turns")
        self.responses[turn] = response

    def executed_calls(self) -> list[list[ToolCall]]:
        return [list(turn) for turn in self.calls]


class LoggedSession:
    """The turn bookkeeping every environment's sessions share, and the defaults of
    :class:`heart.environments.base.EnvironmentSession`'s optional members; subclasses set
    ``_log`` and ``clarify_answer`` and implement ``tools`` and ``score`` (and ``state`` when
    they expose it)."""

    _log: EpisodeLog
    clarify_answer: str
    state: Callable[[], Any] | None = None
    answered_turns: AbstractSet[int] = frozenset()
    infrastructure_failure: str | None = None

    def close(self) -> None:
        """Nothing to release: the session holds no connection or process."""

    def start_turn(self, turn: int) -> None:
        self._log.start_turn(turn)

    def clarify(self, question: str) -> str:
        return self.clarify_answer

    def finish_turn(self, turn: int, response: str) -> None:
        self._log.finish_turn(turn, response)

    def executed_calls(self) -> list[list[ToolCall]]:
        return self._log.executed_calls()


def jsonable(value: Any) -> Any:
    """``value`` as plain JSON data (dict, list, str, int, float, bool, None): pydantic
    models dumped in JSON mode, dates as ISO strings, other numbers as floats."""
    return _ANY.dump_python(value, mode="json", fallback=_plain)


def _plain(value: Any) -> Any:
    """Types pydantic does not know (BFCL's MathAPI returns mpmath numbers)."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return str(value)


_ANY = TypeAdapter(Any)
