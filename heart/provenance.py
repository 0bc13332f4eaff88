"""Registry provenance: ToolFace indexes only tool documents whose source it can name.

ToolHijacker's attack at the tool-selection stage is a crafted tool document that lands in
the registry like any other and is then retrieved and selected. Every episode's ToolFace
(:func:`heart.catalog.session_toolface`) is therefore built with a :class:`Provenance`: the
documents it may index, each with where it comes from. The environment says what it vouches
for (:meth:`heart.environments.base.Environment.documents`); this module never asks which
class it is —

- ``catalog``: the environment's own documents — its ``catalog()`` and the tools its
  ``start`` gave the episode's session (BFCL's classes, AgentDojo's suite, a single-turn
  entry's functions); and the central catalog (:func:`heart.catalog.central_catalog`, the
  benchmarks' shipped documents) once the process has built it;
- ``library``: the composite primitives a :class:`heart.library.LibraryEnvironment` was
  built with (``heart run`` / ``heart collect`` take them from the library's admitted
  entries; a validation run from the candidate it validates);
- ``mcp``: the tools an MCP server the user registered (:class:`heart.environments.mcp.MCPEnvironment`)
  listed over the session's own connection (the listing, not the session's tool list);
- ``caller``: documents a caller vouches for by name (``session_toolface(..., trusted=...)``):
  an explicit opt-in, e.g. ``bench/tool_injection.py --trust-injected``.

A document is identified by its content hash, :func:`document_hash`: sha256 of its canonical
JSON (name, description, parameters schema; ``sort_keys``), the same value as
:meth:`heart.toolface.ToolSpec.fingerprint`. ToolFace records a :class:`Registration` (tool,
hash, source, origin) for every tool it indexes; a document no source gives is **refused**:
:meth:`heart.toolface.ToolFace.register` raises :class:`UntrustedToolError` (naming the tool
and why), and a ToolFace built with such a tool among its tools leaves it out and keeps the
refusal in ``ToolFace.refusals``. Before a registered tool runs, :func:`changed_since_registration`
hashes its document again (:func:`heart.primitives.execute`): a document changed since
registration is not executed, the call is a FAILURE with failure type
:data:`PROVENANCE_VIOLATION`, and the Primitive's trace event carries that envelope. The
loop also refuses, with the same failure type, a tool no ToolFace registered at all
(:func:`unregistered`: a document forced past the registry into a step).

Every registration, refusal and refused execution is counted process-wide
(:func:`counts`) and logged to the ``heart.provenance`` logger (refusals at WARNING).
"""

from __future__ import annotations

import collections
import hashlib
import json
import logging
import threading
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Callable, Iterable

if TYPE_CHECKING:  # heart.toolface imports this module, and heart.environments.base heart.toolface
    from heart.environments.base import Environment, EnvironmentSession
    from heart.toolface import Tool, ToolSpec

PROVENANCE_VIOLATION = "PROVENANCE_VIOLATION"
"""Failure type of a call whose tool's document changed after ToolFace registered it: the
tool was not run."""
SOURCES = ("catalog", "library", "mcp", "caller")
"""Where a trusted document can come from (see the module docstring)."""
UNCHECKED = "unchecked"
"""The source a ToolFace built without a :class:`Provenance` records: its caller handed it
the tools and nothing was checked (its hashes are still checked before execution)."""

log = logging.getLogger("heart.provenance")

_counts: collections.Counter[str] = collections.Counter()
_counts_lock = threading.Lock()


def count(key: str, n: int = 1) -> None:
    with _counts_lock:
        _counts[key] += n


def counts() -> dict[str, int]:
    """What this process registered and refused so far: ``registered`` (and per source,
    ``registered:catalog`` …), ``refused_at_registration``, ``refused_at_execution``."""
    with _counts_lock:
        return dict(_counts)


def reset_counts() -> None:
    with _counts_lock:
        _counts.clear()


def canonical_document(spec: "ToolSpec") -> str:
    """The document a hash is taken of: name, description and parameters schema as JSON
    with sorted keys (the category is where ToolFace files it, not part of the document)."""
    return json.dumps([spec.name, spec.description, spec.parameters], sort_keys=True)


def document_hash(spec: "ToolSpec") -> str:
    """sha256 (hex) of :func:`canonical_document`."""
    return hashlib.sha256(canonical_document(spec).encode()).hexdigest()


@dataclass(frozen=True)
class Registration:
    """What ToolFace recorded when it indexed a tool."""

    tool: str
    sha256: str
    """:func:`document_hash` of the document as registered."""
    source: str
    """One of :data:`SOURCES`, or :data:`UNCHECKED`."""
    origin: str = ""
    """Which one: the environment, the composite, the MCP server."""

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


class UntrustedToolError(ValueError):
    """A tool document no source of the ToolFace gives: it is not indexed."""

    def __init__(self, tool: str, sha256: str, reason: str):
        super().__init__(f"tool {tool!r} refused by ToolFace: {reason}")
        self.tool = tool
        self.sha256 = sha256
        self.reason = reason

    def to_dict(self) -> dict[str, str]:
        return {"tool": self.tool, "sha256": self.sha256, "reason": self.reason}


Documents = Iterable[tuple["ToolSpec", str, str]]
"""(document, source, origin) triples."""


class Provenance:
    """The documents a ToolFace may index, by content hash, each with its source.

    ``add`` records documents now; ``add_lazy`` a loader of more documents, called once, the
    first time a document is not found among those already recorded (an environment's whole
    catalog is read only when a tool is not one of its session's)."""

    def __init__(self, documents: Documents = ()):
        self._by_hash: dict[str, tuple[str, str]] = {}
        self._by_name: dict[str, tuple[str, str, str]] = {}
        self._lazy: list[tuple[str, Callable[[], Documents]]] = []
        self.described: list[str] = []
        """What the sources are, in words (for refusals)."""
        for spec, source, origin in documents:
            self.add(spec, source, origin)

    def add(self, spec: "ToolSpec", source: str, origin: str = "") -> None:
        if source not in SOURCES:
            raise ValueError(f"unknown tool source {source!r}: one of {SOURCES}")
        sha = document_hash(spec)
        self._by_hash.setdefault(sha, (source, origin))
        self._by_name.setdefault(spec.name, (sha, source, origin))
        described = f"{source} {origin}".strip()
        if described not in self.described:
            self.described.append(described)

    def add_lazy(self, description: str, loader: Callable[[], Documents]) -> None:
        self._lazy.append((description, loader))
        if description not in self.described:
            self.described.append(description)

    def _load_lazy(self) -> None:
        while self._lazy:
            _, loader = self._lazy.pop(0)
            for spec, source, origin in loader():
                self.add(spec, source, origin)

    def register(self, spec: "ToolSpec") -> Registration:
        """The registration of ``spec``'s document; raises :class:`UntrustedToolError` when no
        source gives it, saying whether a trusted document of that name exists (a changed
        copy of a known tool) or none does."""
        sha = document_hash(spec)
        if sha not in self._by_hash:
            self._load_lazy()
        found = self._by_hash.get(sha)
        if found is not None:
            return Registration(spec.name, sha, *found)
        known = self._by_name.get(spec.name)
        if known is not None:
            reason = (f"its document (sha256 {sha[:12]}…) differs from the one {known[1]} {known[2]} gives "
                      f"under that name (sha256 {known[0][:12]}…)")
        else:
            reason = (f"its document (sha256 {sha[:12]}…) comes from none of this ToolFace's sources "
                      f"({'; '.join(self.described) or 'none'}); a tool enters through its environment's "
                      "catalog, an admitted library entry or an MCP server the user registered")
        raise UntrustedToolError(spec.name, sha, reason)


def refused(error: UntrustedToolError) -> None:
    """Count and log a refusal at registration."""
    count("refused_at_registration")
    log.warning("%s", error)


def registered(registration: Registration) -> None:
    count("registered")
    count(f"registered:{registration.source}")


def changed_since_registration(tool: "Tool") -> str | None:
    """Why ``tool`` must not run — its document's hash is no longer the one registered —
    or None (also for a tool no ToolFace registered: the Code primitive, a composite's inner
    calls). Counts and logs a refusal."""
    registration = tool.registration
    if registration is None:
        return None
    now = document_hash(tool.spec)
    if now == registration.sha256 and tool.spec.name == registration.tool:
        return None
    count("refused_at_execution")
    reason = (f"not run: the document of tool {registration.tool!r} changed after ToolFace registered it "
              f"(sha256 {registration.sha256[:12]}… from {registration.source} {registration.origin}, "
              f"now {now[:12]}…); register it again from its source").replace("  ", " ")
    log.warning("%s", reason)
    return reason


def unregistered(tool: "Tool") -> str | None:
    """Why the HEART loop must not run ``tool`` — no ToolFace registered it: its document
    reached a step without passing registration (defence in depth behind the registry) — or
    None. Every tool a loop's ToolFace hands out carries a registration; the Code primitive
    runs in the sandbox, not through here. Counts and logs a refusal."""
    if tool.registration is not None:
        return None
    count("refused_at_execution")
    reason = (f"not run: tool {tool.name!r} was never registered by this episode's ToolFace (sha256 "
              f"{document_hash(tool.spec)[:12]}…); a tool enters through its environment's catalog, an admitted "
              "library entry or an MCP server the user registered")
    log.warning("%s", reason)
    return reason


# -- the sources of an episode's ToolFace --------------------------------------------------

def session_provenance(environment: "Environment", session: "EnvironmentSession | None", trusted: Iterable["ToolSpec"] = (),
                       more: Iterable[tuple[str, Callable[[], Documents]]] = ()) -> Provenance:
    """The sources of the ToolFace an episode of ``session`` plans with (see the module
    docstring): the environment's documents (a library's composites, an MCP server's
    listing), then ``trusted`` documents the caller vouches for, then ``more`` lazy sources
    ((description, loader), read on a miss)."""
    provenance = Provenance()
    _environment_documents(provenance, environment, session)
    for spec in trusted:
        provenance.add(spec, "caller", "vouched for by the caller")
    for description, loader in more:
        provenance.add_lazy(description, loader)
    return provenance


def _environment_documents(provenance: Provenance, environment: "Environment",
                           session: "EnvironmentSession | None") -> None:
    """What the environment vouches for in ``session`` (:meth:`heart.environments.base.Environment.documents`):
    documents given now are recorded now, a catalog is read on the first miss."""
    for documents in environment.documents(session):
        for spec in documents.specs:
            provenance.add(spec, documents.source, documents.origin)
        if documents.load is not None:
            provenance.add_lazy(f"{documents.source} {documents.origin}",
                                lambda d=documents: [(spec, d.source, d.origin) for spec in d.load()])
