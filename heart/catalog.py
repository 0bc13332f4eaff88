"""The central tool catalog, and the companion map ToolFace expands retrieval with.

**Central catalog** (:func:`central_catalog`): one list of :class:`ToolSpec` over every
function document the benchmarks ship — BFCL v4's multi-turn classes (every file of
``multi_turn_func_doc``), its single-turn and live categories (each entry's ``function``
list), and AgentDojo's suites — deduplicated by content (name, description, parameters)
and categorised (the BFCL class, the BFCL test category a single-turn doc first appears in,
or the AgentDojo suite). Different documents that share a name keep the name for the first
one (multi-turn classes and AgentDojo first, so the executable tools keep theirs) and get
``name~<hash>`` after it, since ToolFace holds one tool per name.

An episode can run against its session tools (the default) or against the whole catalog:
:func:`catalog_tools` binds the catalog entries the session can execute (matched by
content, not name) to the session's functions, and every other entry to a function that
raises :class:`ToolExecutionError`, so a retrieved tool the environment cannot execute
fails cleanly at its Primitive as a RUNTIME_ERROR.

**What the train split's gold teaches ToolFace** (:class:`ToolStatistics`, from
:func:`tool_statistics`): one record per gold turn of one split's tasks (train by default)
— the user's text, the tools its gold calls use, and the tools its session offered. Three
things are learnt from it, never from dev or test:

- *companions*: for each tool, the tools that gold calls use in the same turn as it at
  least ``min_share`` of the time. BFCL's ``startEngine`` needs ``pressBrakePedal`` and
  ``lockDoors`` first; AgentDojo's restaurant look-ups go together. No tool description
  says so, so no query can find them by similarity alone.
- a *query log*: earlier requests and the tools they needed. A query like the current one
  votes for its tools ("How much fuel do I have?" → ``displayCarStatus``).
- a *usage prior*: how often a tool is used in the turns that offer it (``cd`` in most
  file-system turns).

A task's own turns are always left out of what its episode is shown
(:meth:`ToolStatistics.without`, used by :func:`session_toolface`): a train-split
episode is never shown tools learnt from its own gold, so collection on the train split
and recall measured on it are as honest as on the test split.

How much the query log and the prior weigh is chosen per environment by measurement
(:data:`RETRIEVAL_BY_ENVIRONMENT`, ``bench/toolface.py``).

An episode's ToolFace indexes only documents whose source it can name (registry provenance,
:mod:`heart.provenance`): the environment's catalog and session tools, a library's
composites, an MCP server's listing, the central catalog once built; any other tool handed
to :func:`session_toolface` is refused and left out.

    from heart.catalog import session_toolface
    toolface = session_toolface(environment, session)        # what run_episode uses
"""

from __future__ import annotations

import collections
import copy
import importlib.util
import itertools
import json
import threading
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

from heart.environments.base import Environment, EnvironmentSession, ToolExecutionError
from heart.embeddings import Embedder
from heart.provenance import document_hash
from heart.toolface import RetrievalConfig, Tool, ToolFace, ToolSpec

SINGLE_TURN_CATEGORIES = (
    "simple_python", "simple_java", "simple_javascript", "multiple", "parallel",
    "parallel_multiple", "irrelevance", "live_simple", "live_multiple", "live_parallel",
    "live_parallel_multiple", "live_irrelevance", "live_relevance",
)
"""BFCL v4 categories whose entries carry their own function documents."""

RETRIEVAL_CATEGORIES = (
    "simple_python", "simple_java", "simple_javascript", "multiple", "parallel",
    "parallel_multiple", "live_simple", "live_multiple", "live_parallel", "live_parallel_multiple",
)
"""Single-turn categories with gold calls: (query → gold functions) retrieval cases."""

_JAVA_JS_TYPES = {
    "String": "string", "Boolean": "boolean", "long": "integer", "double": "number",
    "Array": "array", "ArrayList": "array", "HashMap": "object",
}
"""Java / JavaScript type names some single-turn docs use, as JSON Schema types."""


def bfcl_data() -> Path:
    """The installed bfcl_eval package's data folder (BFCL v4 entries and answers)."""
    return Path(importlib.util.find_spec("bfcl_eval").submodule_search_locations[0]) / "data"


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every non-blank line of a JSON-lines file, parsed."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def bfcl_schema(bfcl_parameters: dict[str, Any]) -> dict[str, Any]:
    """A BFCL document's ``parameters`` as JSON Schema (Java / JavaScript type names mapped)."""
    from heart.environments.bfcl import json_schema

    def fix(node: Any) -> Any:
        if isinstance(node, dict):
            out = {k: fix(v) for k, v in node.items()}
            if isinstance(out.get("type"), str) and out["type"] in _JAVA_JS_TYPES:
                out["type"] = _JAVA_JS_TYPES[out["type"]]
            return out
        if isinstance(node, list):
            return [fix(v) for v in node]
        return node

    schema = json_schema(fix(copy.deepcopy(bfcl_parameters)))
    schema.setdefault("type", "object")
    schema.setdefault("properties", {})
    return schema


def content_key(spec: ToolSpec) -> str:
    """Identity of a document regardless of category (the same function in two suites is
    one tool): its content hash, :func:`heart.provenance.document_hash`."""
    return document_hash(spec)


def _documents() -> list[ToolSpec]:
    """Every function document, executable ones first, with duplicates still in."""
    from heart.environments.agentdojo import AgentDojoEnvironment
    from heart.environments.bfcl import BFCLEnvironment

    specs = list(BFCLEnvironment().catalog())
    agentdojo = AgentDojoEnvironment()
    for suite in agentdojo.suites:
        specs.extend(agentdojo._specs[suite].values())
    data = bfcl_data()
    for path in sorted((data / "multi_turn_func_doc").glob("*.json")):
        for doc in read_jsonl(path):  # the 8 classes again (deduplicated), memory and web search
            specs.append(ToolSpec(doc["name"], doc["description"], bfcl_schema(doc["parameters"]),
                                  category=path.stem))
    for category in SINGLE_TURN_CATEGORIES:
        for entry in read_jsonl(data / f"BFCL_v4_{category}.json"):
            for doc in entry.get("function", []):
                specs.append(ToolSpec(doc["name"], doc.get("description", ""),
                                      bfcl_schema(doc.get("parameters", {})), category=category))
    return specs


def _multi_turn_doc_categories() -> dict[str, str]:
    """BFCL's doc file stem → class name, so the 8 executable classes' docs dedupe."""
    from bfcl_eval.constants.executable_backend_config import MULTI_TURN_FUNC_DOC_FILE_MAPPING

    return {Path(file).stem: cls for cls, file in MULTI_TURN_FUNC_DOC_FILE_MAPPING.items()}


@lru_cache(maxsize=1)
def central_catalog() -> tuple[ToolSpec, ...]:
    """Every function document of BFCL v4 and AgentDojo, once each, with unique names."""
    classes = _multi_turn_doc_categories()
    by_content: dict[str, ToolSpec] = {}
    taken: set[str] = set()
    for spec in _documents():
        key = content_key(spec)
        if key in by_content:
            continue
        category = classes.get(spec.category, spec.category)
        name = spec.name if spec.name not in taken else f"{spec.name}~{key[:6]}"
        taken.add(name)
        by_content[key] = ToolSpec(name, spec.description, spec.parameters, category=category)
    return tuple(by_content.values())


def content_index(catalog: tuple[ToolSpec, ...] | list[ToolSpec]) -> dict[str, str]:
    """Document content key → its name in ``catalog`` (names may carry a ``~hash``)."""
    return {
        content_key(ToolSpec(spec.name.split("~", 1)[0], spec.description, spec.parameters)): spec.name
        for spec in catalog
    }


def _unavailable(name: str, env: str):
    def call(**arguments):
        raise ToolExecutionError(
            f"tool {name!r} is in the central catalog but this {env} episode cannot execute it"
        )

    call.__name__ = name
    return call


def catalog_tools(session: EnvironmentSession, catalog: tuple[ToolSpec, ...] | list[ToolSpec]) -> list[Tool]:
    """The whole catalog as tools for ``session``: the entries the session holds run its
    functions; the rest fail with ToolExecutionError when called."""
    own = {content_key(t.spec): t for t in session.tools}
    tools, bound = [], set()
    for spec in catalog:
        key = content_key(ToolSpec(spec.name.split("~", 1)[0], spec.description, spec.parameters))
        tool = own.get(key)
        if tool is not None:
            bound.add(key)
            # The session's own spec and name: its calls are logged under the real name.
            tools.append(Tool(tool.spec, tool.fn))
        else:
            tools.append(Tool(spec, _unavailable(spec.name, session.task.env)))
    names = {t.name for t in tools}
    # Session tools the catalog lacks (a changed benchmark version): still offered.
    tools += [t for k, t in own.items() if k not in bound and t.name not in names]
    return tools


# -- what the train split's gold teaches ToolFace ------------------------------------------
RETRIEVAL_BY_ENVIRONMENT: dict[str, dict[str, float]] = {
    "bfcl": {"query_log_weight": 0.3, "usage_weight": 0.2},
    "agentdojo": {"min_shown": 8},
}
"""Per-environment retrieval settings over :class:`RetrievalConfig`'s defaults, chosen by
``bench/toolface.py`` on the train split (each task measured without its own turns). On
BFCL the query log and the usage prior raise held-out (dev + test) turns whose gold tools
are all shown from 0.966 to 0.990; AgentDojo has 50 train tasks that ask for different
things, and both lowered its held-out recall (0.915 → 0.851), so they are off there. On
AgentDojo the ninth, filler tool never completed a task's gold set (first-call recall 0.866
with 9 or 8 shown), while the loop's re-plans add tools: with at least 8 shown, the Planner
sees 9.9 tools per call instead of 10.3, and still every gold tool by a turn's last call."""


def retrieval_config(environment: Environment | str, **overrides) -> RetrievalConfig:
    """The measured retrieval settings for an environment (``overrides`` on top)."""
    name = environment if isinstance(environment, str) else environment.name
    return RetrievalConfig(**{**RETRIEVAL_BY_ENVIRONMENT.get(name, {}), **overrides})


@dataclass(frozen=True)
class GoldTurn:
    """One user turn of a split's task, as the statistics see it."""

    task_id: str
    query: str
    tools: frozenset[str]
    """The tools the turn's gold calls use."""
    offered: frozenset[str]
    """The tools the task's session held (what ToolFace could have shown)."""


@dataclass(frozen=True)
class ToolStatistics:
    """Gold turns of one split, and what ToolFace learns from them."""

    turns: tuple[GoldTurn, ...]

    def without(self, task_id: str) -> "ToolStatistics":
        """The same statistics with ``task_id``'s own turns left out."""
        return ToolStatistics(tuple(t for t in self.turns if t.task_id != task_id))

    def companions(self, min_share: float = 0.25, min_count: int = 2) -> dict[str, list[str]]:
        return companions_from_turns([set(t.tools) for t in self.turns], min_share, min_count)

    def usage(self) -> dict[str, float]:
        """Tool → share of the turns offering it whose gold uses it (+1 smoothing on the
        count of offering turns, so a tool offered once and used once is not certain)."""
        used = collections.Counter(name for t in self.turns for name in t.tools)
        offered = collections.Counter(name for t in self.turns for name in t.offered)
        return {name: used[name] / (count + 1) for name, count in offered.items()}

    def query_log(self) -> list[tuple[str, frozenset[str]]]:
        """(user text, tools its gold used) for every turn."""
        return [(t.query, t.tools) for t in self.turns]


_statistics_lock = threading.Lock()
_statistics: dict[tuple, ToolStatistics] = {}


def tool_statistics(environment: Environment, split: str = "train") -> ToolStatistics:
    """The gold turns of ``split``'s tasks (computed once per process)."""
    key = (environment.name, tuple(environment.task_ids(split)))
    with _statistics_lock:
        if key not in _statistics:
            turns = []
            for task_id in environment.task_ids(split):
                task = environment.load_task(task_id)
                offered = frozenset(t.name for t in environment.start(task).tools)
                turns += [GoldTurn(task_id, query, frozenset(c.name for c in calls), offered)
                          for query, calls in zip(task.turns, task.gold or []) if calls]
            _statistics[key] = ToolStatistics(tuple(turns))
        return _statistics[key]


def session_toolface(environment: Environment, session: EnvironmentSession, tools: list[Tool] | None = None,
                     *, cache_dir: Path | None = None, config: RetrievalConfig | None = None,
                     split: str = "train", trusted: Iterable[ToolSpec] = (),
                     provenance: bool = True) -> ToolFace:
    """The ToolFace an episode of ``session.task`` plans with: the session's tools (or
    ``tools``, e.g. the central catalog), the environment's measured settings, and what
    ``split``'s gold teaches — without the task's own turns. An environment that serves
    another's tools (an MCP server wrapping a benchmark, :mod:`heart.environments.mcp`) names
    that one as ``toolface_source``: its settings and gold teach ToolFace.

    Registry provenance (:mod:`heart.provenance`): ToolFace indexes only the documents the
    environment gives (its catalog and the session's tools, a library's composites, an MCP
    server's listing), the central catalog's once this process has built it, and ``trusted``
    (documents the caller vouches for); any other tool in ``tools`` is refused, counted and
    left out (``ToolFace.refusals``). ``provenance=False`` checks nothing (the caller vouches
    for every tool; hashes are still checked before execution)."""
    from heart.provenance import session_provenance

    source = environment.toolface_source
    config = config or retrieval_config(source)
    every = tool_statistics(source, split)
    statistics = every.without(session.task.task_id)
    if config.query_log_weight > 0:
        _embed_once(every, cache_dir)
    sources = session_provenance(environment, session, trusted, [("central catalog", central_documents)]) \
        if provenance else None
    return ToolFace(
        session.tools if tools is None else tools, cache_dir=cache_dir, config=config,
        companions=statistics.companions(),
        query_log=statistics.query_log() if config.query_log_weight > 0 else None,
        usage=statistics.usage() if config.usage_weight > 0 else None,
        provenance=sources,
    )


def central_documents() -> list[tuple[ToolSpec, str, str]]:
    """The central catalog's documents as a provenance source (:mod:`heart.provenance`), once
    this process has built it (:func:`catalog_tools` is given it): a process that never built
    it holds none of its tools, and building it (seconds) only to refuse a document would be
    waste."""
    if not central_catalog.cache_info().currsize:
        return []
    return [(spec, "catalog", "central") for spec in central_catalog()]


def _embed_once(statistics: ToolStatistics, cache_dir: Path | None) -> None:
    """Embed the whole query log in one batch before the episode's ToolFace asks for it
    without the task's own turns. On a cold cache the first episode encodes it and concurrent
    ones find it in the Embedder's memory (:class:`heart.embeddings.Embedder`); later calls
    are memory lookups."""
    Embedder(cache_dir).embed([text for text, _ in statistics.query_log()])


# -- companions ---------------------------------------------------------------------------
_companions_lock = threading.Lock()
_companions: dict[tuple, dict[str, list[str]]] = {}


def gold_turns(environment: Environment, split: str | None) -> list[set[str]]:
    """The set of gold tool names of every turn (with gold calls) of a split's tasks."""
    turns = []
    for task_id in environment.task_ids(split):
        task = environment.load_task(task_id)
        turns += [{call.name for call in calls} for calls in (task.gold or []) if calls]
    return turns


def companions_from_turns(turns: list[set[str]], min_share: float = 0.25,
                          min_count: int = 2) -> dict[str, list[str]]:
    """Tool → tools seen with it in at least ``min_share`` of its turns (and at least
    ``min_count`` times), most frequent first."""
    alone = collections.Counter(name for turn in turns for name in turn)
    pairs = collections.Counter(pair for turn in turns for pair in itertools.permutations(sorted(turn), 2))
    companions: dict[str, list[tuple[float, str]]] = collections.defaultdict(list)
    for (tool, other), count in pairs.items():
        share = count / alone[tool]
        if share >= min_share and count >= min_count:
            companions[tool].append((share, other))
    return {tool: [name for _, name in sorted(pairs_, key=lambda p: (-p[0], p[1]))]
            for tool, pairs_ in sorted(companions.items())}


def tool_companions(environment: Environment, split: str = "train", min_share: float = 0.25,
                    min_count: int = 2) -> dict[str, list[str]]:
    """Companion map learnt from ``split``'s gold calls, every task included (computed once
    per process). Episodes use :func:`session_toolface`, which leaves the task's own turns
    out."""
    key = (environment.name, tuple(environment.task_ids(split)), min_share, min_count)
    with _companions_lock:
        if key not in _companions:
            _companions[key] = companions_from_turns(gold_turns(environment, split), min_share, min_count)
        return _companions[key]
