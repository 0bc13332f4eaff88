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

**Companions** (:func:`tool_companions`): for each tool, the tools that gold calls use in
the same turn as it at least ``min_share`` of the time, counted over one split's tasks
(train by default, so test-split measurements stay honest). BFCL's ``startEngine`` needs
``pressBrakePedal`` and ``lockDoors`` first; AgentDojo's restaurant look-ups go together.
No tool description says so, so no query can find them by similarity alone.

    from heart.catalog import central_catalog, catalog_tools, tool_companions
    toolface = ToolFace(catalog_tools(session, central_catalog()),
                        companions=tool_companions(environment))
"""

from __future__ import annotations

import collections
import copy
import hashlib
import importlib.util
import itertools
import json
import threading
from functools import lru_cache
from pathlib import Path
from typing import Any

from heart.environments.base import Environment, EnvironmentSession, ToolExecutionError
from heart.toolface import Tool, ToolSpec

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


def _bfcl_data() -> Path:
    return Path(importlib.util.find_spec("bfcl_eval").submodule_search_locations[0]) / "data"


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _schema(bfcl_parameters: dict[str, Any]) -> dict[str, Any]:
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


def _content_key(spec: ToolSpec) -> str:
    """Identity of a document regardless of category (the same function in two suites is
    one tool)."""
    return hashlib.sha256(
        json.dumps([spec.name, spec.description, spec.parameters], sort_keys=True).encode()
    ).hexdigest()


def _documents() -> list[ToolSpec]:
    """Every function document, executable ones first, with duplicates still in."""
    from heart.environments.agentdojo import AgentDojoEnvironment
    from heart.environments.bfcl import BFCLEnvironment

    specs = list(BFCLEnvironment().catalog())
    agentdojo = AgentDojoEnvironment()
    for suite in agentdojo.suites:
        specs.extend(agentdojo._specs[suite].values())
    data = _bfcl_data()
    for path in sorted((data / "multi_turn_func_doc").glob("*.json")):
        for doc in _read_jsonl(path):  # the 8 classes again (deduplicated), memory and web search
            specs.append(ToolSpec(doc["name"], doc["description"], _schema(doc["parameters"]),
                                  category=path.stem))
    for category in SINGLE_TURN_CATEGORIES:
        for entry in _read_jsonl(data / f"BFCL_v4_{category}.json"):
            for doc in entry.get("function", []):
                specs.append(ToolSpec(doc["name"], doc.get("description", ""),
                                      _schema(doc.get("parameters", {})), category=category))
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
        key = _content_key(spec)
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
        _content_key(ToolSpec(spec.name.split("~", 1)[0], spec.description, spec.parameters)): spec.name
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
    own = {_content_key(t.spec): t for t in session.tools}
    tools, bound = [], set()
    for spec in catalog:
        key = _content_key(ToolSpec(spec.name.split("~", 1)[0], spec.description, spec.parameters))
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
    """Companion map learnt from ``split``'s gold calls (computed once per process)."""
    key = (environment.name, tuple(environment.task_ids(split)), min_share, min_count)
    with _companions_lock:
        if key not in _companions:
            _companions[key] = companions_from_turns(gold_turns(environment, split), min_share, min_count)
        return _companions[key]
