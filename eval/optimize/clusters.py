"""Failure clustering from traces, and routing of clusters to mutation slots.

What the analyst sees of each failed repair episode (PRISM's root-cause view): its case id,
the failing role call (an unparseable answer, an empty plan), the Primitive's FAILURE
envelopes (tool, failure type, the parameter the details name, the message), the Verifier's
failed criteria, the tool-call sequence, and the benchmark checker's verdict (error type and
message, cut: the "checker diff"). Failures that share (kind, tool or role, failure type or
criterion, parameter) form one cluster.

Routing (three slots, as PRISM runs them in parallel):

- ``middleware``: failures at the tool boundary that an intercept can act on — unknown
  argument names, values of the wrong type or outside an enum (the binding's and
  jsonschema's own messages), and a tool that raised because something the call acts on
  does not exist yet or its session is not logged in (a missing prerequisite:
  :data:`PREREQUISITE`);
- ``prompt``: failures before any tool runs or after it — unparseable answers, empty plans,
  a wrong tool, a Verifier that fails a good step, wrong values the checker rejects;
- ``joint``: missing required arguments — an error block can ask for them, a Primitive
  prompt edit can stop them being left out: both at once.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Iterable

from heart_distill.eval.optimize.rollouts import Episode

DETAIL_CHARS = 240
SLOTS = ("middleware", "prompt", "joint")

_PARAM = re.compile(r"'([A-Za-z_][\w.]*)'")
_WHERE = re.compile(r"^([A-Za-z_][\w]*)(?:\[\d+\]|\.\w+)*:")
"""The parameter a binding message starts with: ``limit:``, ``ids[2]:`` (the binding's
coercion), ``ids.0:`` or ``filter.unit:`` (jsonschema's path of the failing value)."""
_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception):\s*")
"""The exception class a RUNTIME_ERROR's details start with (``TypeError: ``)."""

PREREQUISITE = re.compile(
    r"no such file|not found|does not exist|not present|not exist|"
    r"not (?:currently )?logged in|no user is currently logged in|not authenticated|authenticate|"
    r"log ?in first|token expired|invalid access token", re.IGNORECASE)
"""What a tool raises when a call needs something an earlier call provides: the thing it acts
on (a file, a ticket, a booking: "No such file or directory", "not found") or a logged-in
session ("No user is currently logged in", "Token expired") — BFCL's backends' own messages."""


@dataclass(frozen=True)
class Failure:
    kind: str
    """unparseable | empty_plan | tool_failure | verifier_fail | checker"""
    where: str
    """The role, or the tool."""
    type: str
    """Failure type, failed criterion, or the checker's error type."""
    parameter: str = ""
    detail: str = ""
    arguments: dict[str, Any] = field(default_factory=dict, compare=False)
    """The failing call's arguments (a tool failure's envelope), for the proposer."""

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.kind, self.where, self.type, self.parameter)


@dataclass
class Cluster:
    kind: str
    where: str
    type: str
    parameter: str
    cases: list[str] = field(default_factory=list)
    details: list[str] = field(default_factory=list)
    calls: list[list[str]] = field(default_factory=list)
    """Per case, the tool-call sequence of the episode."""
    arguments: list[dict[str, Any]] = field(default_factory=list)
    """Per case, the arguments of the failing call as the envelope gives them (tool failures)."""

    @property
    def id(self) -> str:
        return "/".join(x for x in (self.kind, self.where, self.type, self.parameter) if x)

    @property
    def slot(self) -> str:
        return route(self)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "slot": self.slot, "cases": self.cases, "details": self.details[:3],
                "calls": self.calls[:3], "arguments": self.arguments[:3]}


def _parameter_of(failure_type: str, details: str) -> str:
    """The parameter a failure's details name, or "". A tool's own exception names none
    reliably (its quoted words are values: ``rm: cannot remove 'a.txt'``) unless Python's
    message is about an argument (``missing 1 required positional argument: 'unit'``)."""
    if failure_type == "RUNTIME_ERROR":
        message = _EXCEPTION.sub("", details, count=1)
        m = _PARAM.search(message) if "argument" in message else None
        return m.group(1) if m else ""
    m = _WHERE.match(details)
    if m and m.group(1) not in ("reference", "missing", "unknown"):
        return m.group(1)
    m = _PARAM.search(details)
    return m.group(1) if m else ""


def failures_of(episode: Episode) -> list[Failure]:
    """Every failure one episode's trace shows, in order."""
    out: list[Failure] = []
    for e in episode.events:
        if e.get("kind") == "episode":
            continue
        role = e.get("role", "")
        if e.get("parse_error"):
            out.append(Failure("unparseable", role, "parse_error", "", str(e["parse_error"])[:DETAIL_CHARS]))
            continue
        parsed = e.get("parsed") or {}
        if role == "planner" and parsed.get("status") == "SUFFICIENT" and not parsed.get("plan"):
            out.append(Failure("empty_plan", "planner", "no_step"))
        envelope = (e.get("extra") or {}).get("envelope") or {}
        if role == "primitive" and envelope.get("status") == "FAILURE":
            details = str(envelope.get("details", ""))
            arguments = envelope.get("bound_arguments") or {}
            out.append(Failure("tool_failure", envelope.get("tool", "?"), envelope.get("failure_type") or "?",
                               _parameter_of(envelope.get("failure_type") or "", details), details[:DETAIL_CHARS],
                               arguments if isinstance(arguments, dict) else {}))
        if role == "verifier" and parsed.get("status") == "FAIL":
            criteria = parsed.get("criteria") or {}
            failed = [k for k, v in criteria.items() if v == "fail"] or ["unspecified"]
            out.append(Failure("verifier_fail", "verifier", failed[0], "",
                               str(parsed.get("feedback", ""))[:DETAIL_CHARS]))
    checker = episode.row.get("checker") or {}
    if episode.score < 1.0 and checker:
        error_type = str(checker.get("error_type") or "wrong_result")
        message = checker.get("error") or checker.get("error_message") or ""
        message = " ".join(map(str, message)) if isinstance(message, list) else str(message)
        out.append(Failure("checker", "checker", error_type, _parameter_of("", message), message[:DETAIL_CHARS]))
    return out


def tool_calls(episode: Episode) -> list[str]:
    calls = []
    for e in episode.events:
        envelope = (e.get("extra") or {}).get("envelope") or {}
        if e.get("role") == "primitive" and envelope and not (e.get("extra") or {}).get("mode"):
            calls.append(f"{envelope.get('tool')}:{envelope.get('status')}")
    return calls


def cluster(episodes: Iterable[Episode]) -> list[Cluster]:
    """Clusters of the failed episodes' failures, largest first (ties: first seen)."""
    found: "OrderedDict[tuple, Cluster]" = OrderedDict()
    for episode in episodes:
        if episode.score >= 1.0 or episode.errored:
            continue
        for f in failures_of(episode):
            c = found.setdefault(f.key, Cluster(f.kind, f.where, f.type, f.parameter))
            if episode.task.key not in c.cases:
                c.cases.append(episode.task.key)
                c.details.append(f.detail)
                c.calls.append(tool_calls(episode))
                c.arguments.append(f.arguments)
    return sorted(found.values(), key=lambda c: -len(c.cases))


def route(c: Cluster) -> str:
    """The mutation slot a cluster goes to (module docstring)."""
    if c.kind == "tool_failure":
        text = " ".join(c.details)
        if "missing required" in text or "required positional argument" in text:
            return "joint"
        if c.type in ("SCHEMA_RESOLUTION", "CONSTRAINT_VIOLATION"):
            return "middleware"
        if c.type == "RUNTIME_ERROR" and PREREQUISITE.search(text):
            return "middleware"
    return "prompt"
