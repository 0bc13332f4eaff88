"""The library: admitted composite primitives and role adapters, each with its evidence.

HEELO grows its primitive library between tasks only through validation
(``L_{k+1} = L_k ⊕ {P̃ : VALIDATE(P̃) = PASS}``). This module owns *reading* a library and
running what it holds; proposing, validating and admitting live beside evaluation
(:mod:`heart_distill.eval.library`, ``heart library propose|validate|admit|history|list``).

A library is one folder::

    library/
      library.json            config (the admission rule's δ), version, admitted primitives
                              and adapters with their evidence, and the history of decisions
      candidates/NAME.json    proposed composites; validation writes its evidence into them
      adapters/ROLE/vN/       admitted adapter folders (peft folder + manifest naming version
                              and evidence)

Every update builds a new copy of the folder beside it and swaps it in whole
(:func:`updating`: :func:`heart.atomic.locked` + :func:`heart.atomic.staged_dir`), so a
reader — or a SIGKILL at any moment of an admission — sees the previous library or the next
one, never a mixture.

A **composite primitive** runs a chain of the environment's tool calls as one primitive: a
name, an interface (the JSON schema of its inputs, what the Primitive role binds), a
description ToolFace indexes, and a chain of ``{"tool", "arguments"}`` whose argument values
are literals or references — ``$step_0.NAME`` is the composite's input NAME, ``$step_j.result.F``
the result of chain call j (the loop's own ``$step_j.field`` syntax, resolved by
:func:`heart.primitives.resolve_references`). :func:`composite_tool` makes it a
:class:`heart.toolface.Tool`; :class:`LibraryEnvironment` adds the admitted composites to an
environment's tools, so ToolFace retrieves them and the loop runs them like any tool (no
change to the loop: a composite is a tool whose function is a chain). A chain call that
fails stops the chain and the composite's envelope is a RUNTIME_ERROR naming the call.
"""

from __future__ import annotations

import json
import re
import shutil
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import AbstractSet, Any, Iterator, Sequence

import jsonschema

from heart.atomic import locked, publish_text, staged_dir
from heart.environments.base import Task, ToolCall, ToolDocuments
from heart.primitives import REFERENCE, BindingError, Envelope, execute, resolve_references
from heart.toolface import Tool, ToolSpec

LIBRARY_FILE = "library.json"
FORMAT_VERSION = 1
CANDIDATES = "candidates"
ADAPTERS = "adapters"
ADAPTER_ENTRY = "library_entry.json"
"""Written into an admitted adapter's folder: its library version and evidence."""
DEFAULT_CONFIG = {"delta": 0.0, "confidence": 0.95, "n_resamples": 2000}
"""The admission rule's settings: admit when the paired lower bound (at ``confidence``) of
the decision metric's lift is above 0 and the worst condition's end-to-end success lift (in
points) is ≥ −``delta``."""
NAME = re.compile(r"^[a-z][a-z0-9_]{2,63}$")
COMPOSITE_PREFIX = "chain_"
"""Composite names start with it: a word that is no reading verb, so the loop treats a
composite as state-changing (:func:`heart.roles.router.is_read_only`) and never retries it."""
INNER_TIMEOUT_S = 10.0


class LibraryError(ValueError):
    """A library folder or one of its entries is malformed; the message names which and why."""


# -- composites ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Composite:
    """A composite primitive: a chain of tool calls behind one interface."""

    name: str
    description: str
    interface: dict[str, Any]
    """JSON schema (type object) of the inputs, which chain arguments reference as ``$step_0.NAME``."""
    chain: tuple[ToolCall, ...]
    env: str = ""
    category: str = ""

    @property
    def spec(self) -> ToolSpec:
        return ToolSpec(self.name, self.description, self.interface, category=self.category)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "interface": self.interface,
                "chain": [{"tool": c.name, "arguments": c.arguments} for c in self.chain],
                "env": self.env, "category": self.category}

    def match(self, calls: Sequence[ToolCall], start: int) -> dict[str, Any] | None:
        """The composite's inputs when ``calls[start:]`` begins with calls this chain makes
        (same tools, same argument names, literals equal, each input one value), else None.
        Values bound to earlier chain results are not checked: only running the chain shows
        them (that is what validation measures)."""
        if start + len(self.chain) > len(calls):
            return None
        inputs: dict[str, Any] = {}
        for step, call in zip(self.chain, calls[start:]):
            if step.name != call.name or set(step.arguments) != set(call.arguments):
                return None
            for name, template in step.arguments.items():
                value = call.arguments[name]
                ref = REFERENCE.fullmatch(template.strip()) if isinstance(template, str) else None
                if ref is None:
                    if template != value:
                        return None
                elif ref.group(1) == "0":
                    key = ref.group(2).lstrip(".")
                    if key in inputs and inputs[key] != value:
                        return None
                    inputs[key] = value
        required = set(self.interface.get("required", []))
        return inputs if required <= set(inputs) else None


def parse_composite(entry: Any, tools: dict[str, ToolSpec] | None = None, where: str = "composite") -> Composite:
    """A :class:`Composite` from its JSON entry, checked; raises :class:`LibraryError` naming
    the entry and the field. With ``tools`` (the environment's catalog by name), each chain
    call must name one of them, pass only its parameters and bind all its required ones."""
    if not isinstance(entry, dict):
        raise LibraryError(f"{where}: expected a JSON object, got {type(entry).__name__}")
    name = entry.get("name")
    where = f"{where} {name!r}" if isinstance(name, str) else where
    if not isinstance(name, str) or not NAME.match(name) or not name.startswith(COMPOSITE_PREFIX):
        raise LibraryError(f"{where}: field 'name' must match {NAME.pattern} and start with {COMPOSITE_PREFIX!r}")
    description = entry.get("description")
    if not isinstance(description, str) or not description.strip():
        raise LibraryError(f"{where}: field 'description' must be a non-empty string (ToolFace indexes it)")
    interface = entry.get("interface")
    if not isinstance(interface, dict) or interface.get("type") != "object" \
            or not isinstance(interface.get("properties"), dict):
        raise LibraryError(f"{where}: field 'interface' must be a JSON schema of type 'object' with 'properties'")
    try:
        jsonschema.validators.validator_for(interface).check_schema(interface)
    except jsonschema.SchemaError as err:
        raise LibraryError(f"{where}: field 'interface' is not a valid JSON schema: {err.message}") from None
    missing = [r for r in interface.get("required", []) if r not in interface["properties"]]
    if missing:
        raise LibraryError(f"{where}: interface requires {missing}, which it does not define")
    chain = entry.get("chain")
    if not isinstance(chain, list) or len(chain) < 2:
        raise LibraryError(f"{where}: field 'chain' must be a list of at least 2 tool calls")
    calls = []
    for i, step in enumerate(chain, 1):
        if not isinstance(step, dict) or not isinstance(step.get("tool"), str) \
                or not isinstance(step.get("arguments"), dict):
            raise LibraryError(f"{where}: chain call {i} must be {{'tool': NAME, 'arguments': {{...}}}}")
        for arg, value in step["arguments"].items():
            for ref in REFERENCE.finditer(value) if isinstance(value, str) else ():
                j, path = int(ref.group(1)), ref.group(2).lstrip(".")
                if j >= i:
                    raise LibraryError(f"{where}: chain call {i} argument {arg!r} references {ref.group(0)}, "
                                       "which is not an earlier call")
                if j == 0 and path not in interface["properties"]:
                    raise LibraryError(f"{where}: chain call {i} argument {arg!r} references input {path!r}, "
                                       "which the interface does not define")
        if tools is not None:
            spec = tools.get(step["tool"])
            if spec is None:
                raise LibraryError(f"{where}: chain call {i} names tool {step['tool']!r}, which the "
                                   "environment does not have")
            params = spec.parameters.get("properties", {})
            unknown = sorted(set(step["arguments"]) - set(params))
            unbound = sorted(set(spec.parameters.get("required", [])) - set(step["arguments"]))
            if unknown or unbound:
                raise LibraryError(f"{where}: chain call {i} ({step['tool']}) "
                                   + (f"passes unknown parameter(s) {unknown}" if unknown
                                      else f"leaves required parameter(s) {unbound} unbound"))
        calls.append(ToolCall(step["tool"], dict(step["arguments"])))
    used = {r.group(2).lstrip(".") for c in calls for v in c.arguments.values() if isinstance(v, str)
            for r in REFERENCE.finditer(v) if r.group(1) == "0"}
    unused = sorted(set(interface["properties"]) - used)
    if unused:
        raise LibraryError(f"{where}: interface input(s) {unused} are used by no chain call")
    return Composite(name, description.strip(), interface, tuple(calls), str(entry.get("env", "")),
                     str(entry.get("category", "")))


class ChainFailed(RuntimeError):
    """A chain call of a composite failed: the composite's envelope is a RUNTIME_ERROR."""


def run_chain(composite: Composite, tools: dict[str, Tool], inputs: dict[str, Any],
              timeout_s: float = INNER_TIMEOUT_S) -> dict[str, Any]:
    """Run the chain over ``inputs`` with the session's ``tools``; each call is bound and
    executed like a Tool Primitive's (:func:`heart.primitives.execute`). Returns every call's
    bound arguments and result, and the last result; raises :class:`ChainFailed`."""
    results = {0: Envelope("SUCCESS", composite.name, result=dict(inputs))}
    ran = []
    for i, call in enumerate(composite.chain, 1):
        try:
            arguments = resolve_references(call.arguments, results)
        except BindingError as err:
            raise ChainFailed(f"chain call {i} ({call.name}): {err.details}") from None
        envelope = execute(tools[call.name], arguments, timeout_s)
        if not envelope.ok:
            raise ChainFailed(f"chain call {i} ({call.name}) failed with {envelope.failure_type}: {envelope.details}")
        results[i] = envelope
        ran.append({"tool": call.name, "arguments": envelope.bound_arguments, "result": envelope.result})
    return {"calls": ran, "result": ran[-1]["result"]}


def composite_tool(composite: Composite, tools: Sequence[Tool]) -> Tool:
    """The composite as a Tool over one session's ``tools``."""
    by_name = {t.name: t for t in tools}
    absent = [c.name for c in composite.chain if c.name not in by_name]
    if absent:
        raise LibraryError(f"composite {composite.name!r}: the session has no tool(s) {absent}")

    def run(**inputs: Any) -> dict[str, Any]:
        return run_chain(composite, by_name, inputs)

    return Tool(composite.spec, run)


class LibrarySession:
    """An environment session whose tools also hold the composites it can run (those whose
    chain tools are all the session's: a BFCL task loads only some of the tool classes)."""

    def __init__(self, session, composites: Sequence[Composite]):
        self.inner = session
        self.task: Task = session.task
        names = {t.name for t in session.tools}
        self.tools: list[Tool] = list(session.tools) + [composite_tool(c, session.tools) for c in composites
                                                        if all(call.name in names for call in c.chain)]

    def start_turn(self, turn: int) -> None:
        self.inner.start_turn(turn)

    def clarify(self, question: str) -> str:
        return self.inner.clarify(question)

    def finish_turn(self, turn: int, response: str) -> None:
        self.inner.finish_turn(turn, response)

    def executed_calls(self) -> list[list[ToolCall]]:
        return self.inner.executed_calls()

    def score(self):
        return self.inner.score()

    @property
    def state(self):
        return self.inner.state

    @property
    def infrastructure_failure(self) -> str | None:
        return self.inner.infrastructure_failure

    @property
    def answered_turns(self) -> AbstractSet[int]:
        """The inner session's turns given as a clarification's answer (BFCL miss_param)."""
        return self.inner.answered_turns

    def close(self) -> None:
        self.inner.close()


class LibraryEnvironment:
    """An environment plus composite primitives: its catalog and every session's tools hold
    them; tasks, scoring and ToolFace's settings (``toolface_source``) are the environment's."""

    def __init__(self, environment, composites: Sequence[Composite]):
        catalog = {s.name: s for s in environment.catalog()}
        clash = [c.name for c in composites if c.name in catalog]
        if clash:
            raise LibraryError(f"composite name(s) {clash} clash with tools of environment {environment.name!r}")
        for c in composites:
            parse_composite(c.to_dict(), catalog)
        self.inner = environment
        self.name = environment.name
        self.composites = list(composites)
        self.toolface_source = environment.toolface_source

    def task_ids(self, split: str | None = None) -> list[str]:
        return self.inner.task_ids(split)

    def load_task(self, task_id: str) -> Task:
        return self.inner.load_task(task_id)

    def catalog(self) -> list[ToolSpec]:
        return list(self.inner.catalog()) + [c.spec for c in self.composites]

    def start(self, task: Task) -> LibrarySession:
        return LibrarySession(self.inner.start(task), self.composites)

    def documents(self, session: LibrarySession | None) -> list[ToolDocuments]:
        """The composites, then what the inner environment vouches for in the inner session."""
        composites = [ToolDocuments("library", c.name, [c.spec]) for c in self.composites]
        return composites + self.inner.documents(session.inner if session is not None else None)


# -- the library folder -------------------------------------------------------------------

@dataclass
class Library:
    """A library folder as read (see the module docstring)."""

    path: Path
    config: dict[str, Any]
    version: int
    primitives: dict[str, dict[str, Any]] = field(default_factory=dict)
    adapters: dict[str, dict[str, Any]] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    base: dict[str, Any] = field(default_factory=dict)
    """The base model its adapters were trained on (set by the first admitted adapter)."""

    def composites(self, env: str | None = None) -> list[Composite]:
        """The admitted composites (of ``env`` only, when given)."""
        out = [parse_composite(e, where=f"{self.path / LIBRARY_FILE}: primitive") for e in self.primitives.values()]
        return [c for c in out if env is None or c.env == env]

    def adapter_paths(self) -> dict[str, str]:
        """Role → folder of its admitted adapter (what serving uses by default)."""
        return {role: str(self.path / entry["path"]) for role, entry in self.adapters.items()}

    def candidates(self) -> dict[str, dict[str, Any]]:
        folder = self.path / CANDIDATES
        out = {}
        for f in sorted(folder.glob("*.json")) if folder.is_dir() else ():
            try:
                out[f.stem] = json.loads(f.read_text())
            except json.JSONDecodeError as err:
                raise LibraryError(f"{f}: not valid JSON ({err})") from None
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"format_version": FORMAT_VERSION, "version": self.version, "config": self.config,
                "primitives": self.primitives, "adapters": self.adapters, "history": self.history,
                "base": self.base}


def new_library_dict(config: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"format_version": FORMAT_VERSION, "version": 0, "config": {**DEFAULT_CONFIG, **(config or {})},
            "primitives": {}, "adapters": {}, "history": []}


def load_library(path: str | Path) -> Library:
    """Read and check a library folder; raises :class:`LibraryError` (or FileNotFoundError)
    naming the file and the entry that is wrong."""
    path = Path(path)
    file = path / LIBRARY_FILE
    if not file.is_file():
        raise FileNotFoundError(f"{path} is not a library: no {LIBRARY_FILE} (create one with "
                                "`heart library propose`)")
    try:
        data = json.loads(file.read_text())
    except json.JSONDecodeError as err:
        raise LibraryError(f"{file}: not valid JSON ({err})") from None
    if not isinstance(data, dict) or data.get("format_version") != FORMAT_VERSION:
        raise LibraryError(f"{file}: format_version must be {FORMAT_VERSION}")
    for key, kind in (("version", int), ("config", dict), ("primitives", dict), ("adapters", dict),
                      ("history", list)):
        if not isinstance(data.get(key), kind):
            raise LibraryError(f"{file}: field {key!r} must be a {kind.__name__}")
    delta = data["config"].get("delta")
    if not isinstance(delta, (int, float)) or delta < 0:
        raise LibraryError(f"{file}: config.delta must be a number ≥ 0, got {delta!r}")
    if not isinstance(data.get("base", {}), dict):
        raise LibraryError(f"{file}: field 'base' must be an object")
    library = Library(path, data["config"], data["version"], data["primitives"], data["adapters"], data["history"],
                      data.get("base", {}))
    for name, entry in library.primitives.items():
        composite = parse_composite(entry, where=f"{file}: primitive")
        if composite.name != name:
            raise LibraryError(f"{file}: primitive {name!r} holds an entry named {composite.name!r}")
        if not isinstance(entry.get("evidence"), dict):
            raise LibraryError(f"{file}: primitive {name!r} has no 'evidence' (nothing enters unvalidated)")
    for role, entry in library.adapters.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("path"), str) \
                or not isinstance(entry.get("version"), int) or not isinstance(entry.get("evidence"), dict):
            raise LibraryError(f"{file}: adapter {role!r} needs 'path', 'version' and 'evidence'")
        if not (path / entry["path"] / "adapter_config.json").is_file():
            raise LibraryError(f"{file}: adapter {role!r}: no adapter_config.json in {path / entry['path']}")
    return library


@contextmanager
def updating(path: str | Path, create: bool = False, config: dict[str, Any] | None = None) -> Iterator[Path]:
    """Yield a staged copy of the library folder to change; when the block ends normally it
    replaces the library whole (atomic, under the library's lock), when it raises (or the
    process dies) the library stays as it was. The block writes ``library.json`` through
    :func:`write_library_file` (or leaves it as copied)."""
    path = Path(path).absolute()
    with locked(path):
        if not (path / LIBRARY_FILE).is_file() and not create:
            raise FileNotFoundError(f"{path} is not a library: no {LIBRARY_FILE}")
        with staged_dir(path) as stage:
            if (path / LIBRARY_FILE).is_file():
                shutil.rmtree(stage)
                shutil.copytree(path, stage, symlinks=True)
            else:
                write_library_file(stage, new_library_dict(config))
            yield stage
            load_library(stage)  # never swap in a library that does not read back


def write_library_file(folder: Path, data: dict[str, Any]) -> None:
    publish_text(folder / LIBRARY_FILE, json.dumps(data, indent=2, ensure_ascii=False, default=str) + "\n")


def compose_calls(calls: Sequence[ToolCall], composites: Sequence[Composite]) -> list[ToolCall]:
    """``calls`` with each run a composite's chain makes replaced by one call of the composite
    (left to right, longest chain first): how a caller that knows its calls uses the library."""
    ordered = sorted(composites, key=lambda c: -len(c.chain))
    out, i = [], 0
    while i < len(calls):
        for c in ordered:
            inputs = c.match(calls, i)
            if inputs is not None:
                out.append(ToolCall(c.name, {k: inputs[k] for k in c.interface["properties"] if k in inputs}))
                i += len(c.chain)
                break
        else:
            out.append(calls[i])
            i += 1
    return out
