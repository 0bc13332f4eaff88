"""The turn's ledger of executed calls: what a re-plan reuses instead of running again.

HEELO's COMPOSE revises a failed plan "changing only the implicated work". The Planner is
asked not to redo what succeeded, but a model's Planner may repeat a step anyway (or repeat
the whole plan), and before this ledger every step of a re-plan was routed and executed: a
``send_money`` that passed ran twice in one turn. The loop now enforces it, per turn:

- **passed work is kept**: a tool call (same tool, same bound arguments — exactly what would
  execute) whose envelope was SUCCESS and that the Verifier passed is never executed again;
  a later step that asks for it gets the earlier envelope, marked ``reused``;
- **effects happen once**: a state-changing call (not :func:`heart.roles.router.is_read_only`)
  that succeeded is never executed twice in the turn with the same arguments, whatever its
  verdict; a later step that asks for it gets the earlier envelope, marked ``reused``.

A read is the same work only on the same state: once a state-changing call has run since a
read, the read's earlier envelope is stale and the read runs again (``list_files`` after
``delete_file`` must see the file gone). Code steps (:mod:`heart.sandbox`) are pure
functions of their inputs with no effect: they are not recorded here.

The same bookkeeping audits what happened: :meth:`TurnLedger.ran` counts every execution
that repeated passed work or a succeeded state-changing call, so the loop's
``passed_steps_reexecuted`` and ``state_changing_executed_twice`` are measured, not assumed
(0 by construction since the loop consults the ledger first), and :func:`audit_trace` counts
the same from a trace written by any version of the loop.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Iterable

from heart.roles.router import is_read_only

RUNTIME_ERROR = "RUNTIME_ERROR"
COUNTERS = ("reused_steps", "passed_steps_reexecuted", "state_changing_executed_twice")
"""What the ledger counts per turn (and the episode record sums)."""


def call_key(tool: str, arguments: dict[str, Any]) -> str:
    """The identity of a call: its tool and bound arguments, as canonical JSON."""
    return json.dumps([tool, arguments], sort_keys=True, ensure_ascii=False, default=repr)


def ran(status: str, failure_type: str | None) -> bool:
    """Whether an envelope of this status means the tool was invoked (a SUCCESS, or a
    RUNTIME_ERROR: the tool ran and failed); binding failures never reached it."""
    return status == "SUCCESS" or failure_type == RUNTIME_ERROR


@dataclass
class LedgerEntry:
    """One executed call of the turn."""

    key: str
    tool: str
    attempt: int
    step: int
    succeeded: bool
    envelope: Any = None
    """The :class:`heart.primitives.Envelope` it returned (None when audited from a trace)."""
    passed: bool = False
    """The Verifier passed it."""
    stale: bool = False
    """A read that a later state-changing call may have made out of date."""

    @property
    def read_only(self) -> bool:
        return is_read_only(self.tool)

    def reusable(self) -> bool:
        if not self.succeeded:
            return False
        return (self.passed and not self.stale) if self.read_only else True


@dataclass
class TurnLedger:
    """Every call one turn executed, in order, with the ledger's counters."""

    entries: list[LedgerEntry] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))

    def reusable(self, tool: str, arguments: dict[str, Any]) -> LedgerEntry | None:
        """The earlier execution a call with these bound arguments must reuse, if any."""
        key = call_key(tool, arguments)
        return next((e for e in reversed(self.entries) if e.key == key and e.reusable()), None)

    def ran(self, tool: str, arguments: dict[str, Any], attempt: int, step: int, status: str,
            failure_type: str | None = None, envelope: Any = None) -> None:
        """Record an execution (a call that did not reach the tool is ignored), counting it
        when it repeats passed work or a state-changing call that succeeded."""
        if not ran(status, failure_type):
            return
        key = call_key(tool, arguments)
        earlier = [e for e in self.entries if e.key == key and e.succeeded]
        if any(e.passed and not e.stale for e in earlier):
            self.counts["passed_steps_reexecuted"] += 1
        if not is_read_only(tool) and earlier:
            self.counts["state_changing_executed_twice"] += 1
        if not is_read_only(tool):  # the state may have changed: earlier reads are out of date
            for e in self.entries:
                if e.read_only:
                    e.stale = True
        self.entries.append(LedgerEntry(key, tool, attempt, step, status == "SUCCESS", envelope))

    def passed(self, attempt: int, step: int) -> None:
        """The Verifier passed (attempt, step)."""
        for e in self.entries:
            if (e.attempt, e.step) == (attempt, step):
                e.passed = True

    def reused(self) -> None:
        self.counts["reused_steps"] += 1


def audit_trace(rows: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The ledger's counters over a trace (rows of :func:`heart.traces.read_trace`), per
    episode and in total, from what the Primitive events record as executed and what the
    Verifier passed — so any collection, made by any version of the loop, can be audited.
    A Primitive event whose envelope is marked ``reused`` did not execute."""
    ledgers: dict[tuple[str, int], TurnLedger] = {}
    episodes: dict[str, dict[str, int]] = {}
    for row in rows:
        if row.get("kind") != "event":
            continue
        ledger = ledgers.setdefault((row["episode_id"], row["turn"]), TurnLedger())
        counts = episodes.setdefault(row["episode_id"], dict.fromkeys(COUNTERS, 0))
        before = dict(ledger.counts)
        if row["role"] == "primitive":
            if (row.get("extra") or {}).get("mode"):  # a messages or relevance call: no tool ran
                continue
            envelope = (row.get("extra") or {}).get("envelope") or {}
            if (envelope.get("meta") or {}).get("family") == "code":
                continue
            if (envelope.get("meta") or {}).get("reused"):
                ledger.reused()
            else:
                ledger.ran(envelope.get("tool", ""), envelope.get("bound_arguments") or {}, row["attempt"],
                           row["step"], envelope.get("status", ""), envelope.get("failure_type"))
        elif row["role"] == "verifier" and row["step"] is not None and isinstance(row.get("parsed"), dict) \
                and row["parsed"].get("status") == "PASS":
            ledger.passed(row["attempt"], row["parsed"].get("step", row["step"]))
        for name in COUNTERS:
            counts[name] += ledger.counts[name] - before[name]
    total = {name: sum(c[name] for c in episodes.values()) for name in COUNTERS}
    return {"episodes": len(episodes), **total,
            "episodes_with_repeats": sorted(e for e, c in episodes.items()
                                            if c["passed_steps_reexecuted"] or c["state_changing_executed_twice"])}
