"""Growing the library: propose candidates, validate them on the gate split, admit by rule.

    heart library propose --library runs/NAME/library --traces runs/NAME/collect
    heart library validate --library runs/NAME/library [--names chain_cd_ls] [--limit 20] [--seeds 0 1 2]
    heart library admit --library runs/NAME/library
    heart library adapter --library runs/NAME/library --role planner --adapter runs/NAME/adapters/planner --data runs/NAME/datasets
    heart library history --library runs/NAME/library [ROLE|NAME]
    heart library list --library runs/NAME/library

:mod:`heart.library` reads a library and runs its composites; this module changes it, every
change an atomic swap of the whole folder (:func:`heart.library.updating`).

- **propose** mines composite primitives from verified traces: in the successful episodes
  of a collection's train-split tasks, the tool calls that ran, succeeded and that the
  Verifier passed, in order; each pair of consecutive calls becomes a pattern with its
  bindings — an argument of the second call equal to a field of the first call's result is
  bound ``$step_1.result.FIELD`` (look something up, then act on it), one equal to an
  argument of the first shares its input, the others are inputs of their own. Patterns
  made in at least ``min_support`` distinct train tasks become candidates, each with a
  name, an interface (the JSON schema of its inputs, taken from the tools' own parameter
  schemas), a description ToolFace indexes, and its support.
- **validate** runs the gate (dev) split twice per (task, seed), paired: with the library
  as admitted, and with the library plus the candidate. The gold teacher
  (:class:`heart_distill.data.gold_teacher.GoldTeacher`) plans a run of gold calls that a shown
  composite's chain makes as one call of the composite; a model plans with whatever
  ToolFace shows it. Per task: end-to-end success (the benchmark's checker), role calls and
  tokens. The **decision signal** is end-to-end success when any paired task differs in
  it, else role calls saved per task (the role-level signal: with the 135M base end-to-end
  success is near zero, and with the gold teacher it is near one on both sides).
- **admit** applies the stated rule (:func:`decide`): the paired bootstrap lower bound of
  the signal's lift is above 0 **and** the worst condition's (seed's) success lift is ≥ −δ
  points (δ: the library's ``config.delta``). Admitted entries carry their evidence;
  rejected candidates stay under ``candidates/`` with theirs; every decision is appended to
  the history.
- **adapter** validates a role adapter against the incumbent (the library's admitted one,
  else the bare base) on the role's held-out gate rows (the datasets' ``validation``
  split, :mod:`heart_distill.eval.roles`), paired per row on the role's primary metric,
  conditions the environments; admits it under the same rule (copying the folder into the
  library, its manifest naming version and evidence) or records the rejection. An adapter
  for another base is refused before anything is evaluated.
"""

from __future__ import annotations

import json
import random
import re
import shutil
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from heart.environments.base import ToolCall
from heart.environments.splits import split_of
from heart.library import (ADAPTER_ENTRY, ADAPTERS, CANDIDATES, COMPOSITE_PREFIX, Composite, LibraryEnvironment,
                           LibraryError, load_library, parse_composite, updating, write_library_file)
from heart.traces import read_trace
from heart_distill.eval.stats import bootstrap

MAX_PATH_DEPTH = 4
MAX_LIST_ITEMS = 20


# -- propose ------------------------------------------------------------------------------

def trace_files(sources: Iterable[str | Path]) -> list[Path]:
    """Trace files under each source: a file, a run folder (``*/traces/*.jsonl``) or a folder of them."""
    files: list[Path] = []
    for source in map(Path, sources):
        if source.is_file():
            files.append(source)
        elif source.is_dir():
            found = sorted(source.glob("traces/*.jsonl")) or sorted(source.glob("*.jsonl")) \
                or sorted(source.glob("**/traces/*.jsonl"))
            if not found:
                raise FileNotFoundError(f"{source}: no trace files (traces/*.jsonl)")
            files += found
        else:
            raise FileNotFoundError(f"{source}: no such trace file or folder")
    return files


def verified_calls(files: Sequence[Path], split: str = "train") -> dict[tuple[str, str], list[list[dict[str, Any]]]]:
    """(env, task id) → per turn, the calls that ran, succeeded and that the Verifier passed,
    in order (from successful, non-errored episodes of ``split``'s tasks; reused and code
    steps left out). One episode per task: the first successful one read."""
    events: dict[str, list[dict[str, Any]]] = defaultdict(list)
    records: dict[str, dict[str, Any]] = {}
    for f in files:
        for row in read_trace(f):
            if row.get("kind") == "episode":
                records[row["episode_id"]] = row
            elif row["role"] in ("primitive", "verifier"):
                events[row["episode_id"]].append(row)
    out: dict[tuple[str, str], list[list[dict[str, Any]]]] = {}
    for episode, record in records.items():
        key = (record["env"], record["task_id"])
        if not record.get("success") or record.get("errored") or key in out or split_of(*key) != split:
            continue
        passed = {(r["turn"], r["attempt"], (r.get("parsed") or {}).get("step")) for r in events[episode]
                  if r["role"] == "verifier" and (r.get("parsed") or {}).get("status") == "PASS"}
        turns: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for r in events[episode]:
            envelope = (r.get("extra") or {}).get("envelope") or {}
            meta = envelope.get("meta") or {}
            if r["role"] != "primitive" or envelope.get("status") != "SUCCESS" or meta.get("reused") \
                    or (r.get("extra") or {}).get("mode") \
                    or meta.get("family") == "code" or (r["turn"], r["attempt"], r["step"]) not in passed:
                continue
            turns[r["turn"]].append({"tool": envelope["tool"], "arguments": envelope.get("bound_arguments") or {},
                                     "result": envelope.get("result")})
        out[key] = [turns[t] for t in sorted(turns)]
    return out


def _paths(value: Any, prefix: tuple[str, ...] = (), depth: int = 0) -> Iterable[tuple[tuple[str, ...], Any]]:
    """Every (path, scalar) inside a result, shallow paths first."""
    if isinstance(value, dict) and depth < MAX_PATH_DEPTH:
        items = list(value.items())
    elif isinstance(value, list) and depth < MAX_PATH_DEPTH:
        items = [(str(i), v) for i, v in enumerate(value[:MAX_LIST_ITEMS])]
    else:
        if prefix:
            yield prefix, value
        return
    for k, v in items:
        if not isinstance(v, (dict, list)):
            yield (*prefix, str(k)), v
    for k, v in items:
        if isinstance(v, (dict, list)):
            yield from _paths(v, (*prefix, str(k)), depth + 1)


def _bindable(value: Any) -> bool:
    return (isinstance(value, str) and len(value.strip()) >= 2) or \
        (isinstance(value, (int, float)) and not isinstance(value, bool))


def pair_pattern(first: dict[str, Any], second: dict[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    """The chain arguments of (first, second) as references: the first call's arguments are
    inputs; each of the second's is a field of the first's result, a shared input, or an
    input of its own (renamed on a clash)."""
    first_args = {name: f"$step_0.{name}" for name in first["arguments"]}
    second_args: dict[str, str] = {}
    for name, value in second["arguments"].items():
        found = next((path for path, v in _paths(first["result"]) if _bindable(value) and v == value), None) \
            if _bindable(value) else None
        shared = next((k for k, v in first["arguments"].items() if _bindable(value) and v == value), None)
        if found is not None:
            second_args[name] = "$step_1.result." + ".".join(found)
        elif shared is not None:
            second_args[name] = f"$step_0.{shared}"
        else:
            own = name if name not in first_args else f"{second['tool']}_{name}"
            second_args[name] = f"$step_0.{own}"
    return first_args, second_args


def snake(name: str) -> str:
    return re.sub(r"[^a-z0-9_]", "_", re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower())


def _purpose(spec) -> str:
    from heart.toolface import first_sentence

    text = first_sentence(spec.own_description()).rstrip(".")
    return text[:1].lower() + text[1:] if text else spec.name


def candidate_entry(env: str, catalog: dict[str, Any], tools: tuple[str, str], args: tuple[dict, dict],
                    name: str) -> dict[str, Any]:
    """A composite's JSON entry for a mined pattern (interface from the tools' own schemas)."""
    properties, required = {}, []
    for tool, arguments in zip(tools, args):
        params = catalog[tool].parameters
        for param, ref in arguments.items():
            if not ref.startswith("$step_0."):
                continue
            key = ref[len("$step_0."):]
            if key not in properties:
                properties[key] = dict(params.get("properties", {}).get(param, {}))
                if param in params.get("required", []):
                    required.append(key)
    links = [f"{param} from {tools[0]}'s {(ref.split('.', 2) + ['result'])[2]}" for param, ref in args[1].items()
             if ref.startswith("$step_1.")]
    description = (f"{_purpose(catalog[tools[0]]).capitalize()}, then {_purpose(catalog[tools[1]])}: "
                   f"calls {tools[0]} and then {tools[1]}" + (f" ({'; '.join(links)})" if links else "") + ".")
    return {"name": name, "description": description,
            "interface": {"type": "object", "properties": properties, "required": required},
            "chain": [{"tool": t, "arguments": a} for t, a in zip(tools, args)],
            "env": env, "category": catalog[tools[0]].category}


def mine(calls: dict[tuple[str, str], list[list[dict[str, Any]]]], catalogs: dict[str, dict[str, Any]],
         min_support: int = 2, max_candidates: int = 8) -> list[dict[str, Any]]:
    """Candidates from verified calls: consecutive pairs with their bindings, made in at least
    ``min_support`` distinct tasks, most supported first (at most ``max_candidates`` per
    environment). Each entry carries ``support`` (tasks, and a few of their ids)."""
    support: dict[tuple, set[str]] = defaultdict(set)
    for (env, task_id), turns in calls.items():
        if env not in catalogs:
            continue
        for turn in turns:
            for first, second in zip(turn, turn[1:]):
                if first["tool"] == second["tool"]:
                    continue  # a repeated call composes nothing
                a, b = pair_pattern(first, second)
                key = (env, first["tool"], second["tool"], json.dumps([a, b], sort_keys=True))
                support[key].add(task_id)
    out: list[dict[str, Any]] = []
    per_env: dict[str, int] = defaultdict(int)
    names: set[str] = set()
    for key, tasks in sorted(support.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        env, t1, t2, args = key
        if len(tasks) < min_support or per_env[env] >= max_candidates:
            continue
        base = f"{COMPOSITE_PREFIX}{snake(t1)}_{snake(t2)}"[:60]
        name, i = base, 2
        while name in names:
            name, i = f"{base}_{i}", i + 1
        a, b = json.loads(args)
        entry = candidate_entry(env, catalogs[env], (t1, t2), (a, b), name)
        try:
            parse_composite(entry, catalogs[env])
        except LibraryError:
            continue  # e.g. a second call that leaves a required parameter to its default
        names.add(name)
        per_env[env] += 1
        out.append({**entry, "support": {"tasks": len(tasks), "task_ids": sorted(tasks)[:10]}})
    return out


def add_candidates(library: str | Path, candidates: Sequence[dict[str, Any]], config: dict[str, Any] | None = None,
                   origin: str = "mined") -> list[str]:
    """Write ``candidates`` under the library's ``candidates/`` (creating the library), each
    checked first; a name the library already admitted or holds is skipped. Returns the names written."""
    written = []
    with updating(library, create=True, config=config) as stage:
        current = json.loads((stage / "library.json").read_text())
        folder = stage / CANDIDATES
        folder.mkdir(exist_ok=True)
        for entry in candidates:
            parse_composite({k: v for k, v in entry.items()})
            name = entry["name"]
            if name in current["primitives"] or (folder / f"{name}.json").exists():
                continue
            (folder / f"{name}.json").write_text(json.dumps({**entry, "origin": origin, "status": "proposed",
                                                             "proposed_at": _now()}, indent=2, default=str) + "\n")
            written.append(name)
    return written


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


# -- useless candidates, for the false-admission check ----------------------------------------

def random_chain(env: str, catalog: dict[str, Any], rng: random.Random, index: int) -> dict[str, Any]:
    """A schema-valid chain of two random tools of one category with random bindings: a
    candidate built to be useless."""
    by_category: dict[str, list[str]] = defaultdict(list)
    for name, spec in catalog.items():
        by_category[spec.category].append(name)
    category = rng.choice(sorted(c for c, names in by_category.items() if len(names) > 1))
    t1, t2 = rng.sample(sorted(by_category[category]), 2)
    args: list[dict[str, str]] = [{}, {}]
    for i, tool in enumerate((t1, t2)):
        for param in catalog[tool].parameters.get("required", []):
            args[i][param] = ("$step_1.result" if i == 1 and rng.random() < 0.5
                              else f"$step_0.{'b_' if i else 'a_'}{param}")
    return candidate_entry(env, catalog, (t1, t2), tuple(args), f"{COMPOSITE_PREFIX}random_{index}_{snake(t1)}"[:60])


def miswired(entry: dict[str, Any], catalog: dict[str, Any], index: int) -> dict[str, Any] | None:
    """A mined candidate with its second call's first input rebound to the first call's whole
    result (a wrong binding): a candidate built to be useless. None when the second call has
    no input."""
    chain = [dict(c, arguments=dict(c["arguments"])) for c in entry["chain"]]
    inputs = [p for p, ref in chain[1]["arguments"].items() if ref.startswith("$step_0.")]
    if not inputs:
        return None
    chain[1]["arguments"][inputs[0]] = "$step_1.result"
    tools = (chain[0]["tool"], chain[1]["tool"])
    name = f"{entry['name']}_miswired_{index}"[:64]
    return candidate_entry(entry["env"], catalog, tools, (chain[0]["arguments"], chain[1]["arguments"]), name)


# -- validate -----------------------------------------------------------------------------

def load_env(env: str):
    from heart_distill.eval.e2e import load_environment

    return load_environment(env, None)


def run_side(environment, composites: Sequence[Composite], task_ids: Sequence[str], seeds: Sequence[int],
             roles_spec: str = "teacher:gold", backend=None, engine: str = "llamacpp:f16",
             concurrency: int = 4) -> dict[tuple[str, int], dict[str, Any]]:
    """One side of a paired run: each (task, seed) through the loop with ``composites`` added
    to the environment's tools. The gold teacher uses a composite a shown plan can use;
    a model answers with ``backend``. Returns episode rows (:func:`eval.e2e.episode_row`)
    plus ``composite_calls`` (calls of each composite that ran)."""
    from concurrent.futures import ThreadPoolExecutor

    from heart_distill.data.gold_teacher import GoldTeacher
    from heart_distill.eval.e2e import E2EConfig, run_one
    from heart_distill.eval.models import resolve_role_models

    library_env = LibraryEnvironment(environment, composites)
    models = resolve_role_models(roles_spec)
    config = E2EConfig(env=environment.name, out="", split="dev", roles_spec=roles_spec, engine=engine,
                       concurrency=concurrency)
    names = {c.name for c in composites}

    def teacher(task, env, seed):
        return GoldTeacher(task, env.catalog(), seed=seed, composites=composites)

    def one(task_id: str, seed: int):
        row, events = run_one(library_env, task_id, seed, backend, models, config, teacher_for_task=teacher)
        used = defaultdict(int)
        for e in events:
            tool = ((e.get("extra") or {}).get("envelope") or {}).get("tool")
            if e.get("role") == "primitive" and tool in names and not (e.get("extra") or {}).get("mode"):
                used[tool] += 1
        return (task_id, seed), {**row, "composite_calls": dict(used)}

    jobs = [(t, s) for t in task_ids for s in seeds]
    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        return dict(pool.map(lambda job: one(*job), jobs))


def paired_evidence(without: dict[tuple[str, int], dict[str, Any]], with_: dict[tuple[str, int], dict[str, Any]],
                    config: dict[str, Any], seed: int = 0) -> dict[str, Any]:
    """Paired figures over tasks (per-task means over seeds; errored episodes drop the pair),
    the decision signal and the conditions (seeds)."""
    keys = sorted(k for k in without if k in with_ and not without[k]["errored"] and not with_[k]["errored"])
    tasks = sorted({t for t, _ in keys})
    seeds = sorted({s for _, s in keys})
    errored = len([k for k in set(without) | set(with_) if k not in keys])

    def per_task(rows, field):
        return np.array([np.mean([float(rows[(t, s)][field]) for s in seeds if (t, s) in keys]) for t in tasks])

    def estimate(values):
        kw = {"confidence": config.get("confidence", 0.95), "n_resamples": config.get("n_resamples", 2000)}
        return bootstrap(values, seed=seed, **kw).to_dict() if len(values) else \
            {"value": None, "low": None, "high": None, "n": 0}

    succ_a, succ_b = per_task(without, "score"), per_task(with_, "score")
    calls_a, calls_b = per_task(without, "role_calls"), per_task(with_, "role_calls")
    tok = lambda rows: per_task(rows, "prompt_tokens") + per_task(rows, "completion_tokens")  # noqa: E731
    tok_a, tok_b = tok(without), tok(with_)
    success_diff = 100.0 * (succ_b - succ_a)
    signal = "success" if np.any(success_diff != 0) else "role_calls_saved"
    lift = success_diff if signal == "success" else calls_a - calls_b
    conditions = {f"seed {s}": float(100.0 * np.mean([with_[(t, s)]["score"] - without[(t, s)]["score"]
                                                       for t in tasks if (t, s) in keys])) for s in seeds}
    used = sum(1 for k in keys if with_[k].get("composite_calls"))
    return {
        "tasks": len(tasks), "seeds": seeds, "episodes_errored": errored,
        "episodes_using_candidate": used,
        "success": {"without": float(succ_a.mean()) if len(tasks) else None,
                    "with": float(succ_b.mean()) if len(tasks) else None,
                    "lift_points": estimate(success_diff)},
        "role_calls_per_task": {"without": float(calls_a.mean()) if len(tasks) else None,
                                "with": float(calls_b.mean()) if len(tasks) else None,
                                "saved": estimate(calls_a - calls_b)},
        "tokens_per_task": {"without": float(tok_a.mean()) if len(tasks) else None,
                            "with": float(tok_b.mean()) if len(tasks) else None,
                            "saved": estimate(tok_a - tok_b)},
        "signal": signal, "lift": estimate(lift),
        "conditions": conditions,
    }


def decide(evidence: dict[str, Any], delta: float) -> tuple[str, str]:
    """The admission rule: ("admitted" | "rejected", why)."""
    lift = evidence["lift"]
    if not lift.get("n"):
        return "rejected", "no paired episode or row was measured"
    worst_name = min(evidence["conditions"], key=evidence["conditions"].get)
    worst = evidence["conditions"][worst_name]
    unit = "points" if evidence["signal"] in ("success", "role_metric") else "calls"
    if lift["low"] is None or lift["low"] <= 0:
        return "rejected", (f"paired lower bound of {evidence['signal']} lift is {lift['low']:.3g} {unit} "
                            f"(value {lift['value']:.3g}), not above 0")
    if worst < -delta:
        return "rejected", f"worst condition ({worst_name}) lift is {worst:.3g} points, below -delta = {-delta:g}"
    return "admitted", (f"paired lower bound of {evidence['signal']} lift {lift['low']:.3g} {unit} > 0 and worst "
                        f"condition ({worst_name}) {worst:.3g} points >= -{delta:g}")


def validate(library: str | Path, names: Sequence[str] | None = None, split: str = "dev", limit: int | None = None,
             seeds: Sequence[int] = (0,), roles_spec: str = "teacher:gold", engine: str = "llamacpp:f16",
             concurrency: int = 4, environments: dict[str, Any] | None = None,
             log: Callable[[str], None] = print) -> dict[str, dict[str, Any]]:
    """Validate candidates (all proposed or validated ones, or ``names``) on ``split``; write
    each one's evidence into its candidate file (one atomic library update per candidate, so
    an interruption keeps what was validated). Returns name → evidence."""
    lib = load_library(library)
    candidates = lib.candidates()
    names = list(names) if names else [n for n, c in candidates.items() if c.get("status") in ("proposed", "validated")]
    unknown = [n for n in names if n not in candidates]
    if unknown:
        raise LibraryError(f"{library}: no candidate(s) {unknown} (candidates: {sorted(candidates)})")
    environments = dict(environments or {})
    backend = None
    if not roles_spec.startswith("teacher:"):
        from heart_distill.eval.models import resolve_role_models, shared_backend

        backend = shared_backend(resolve_role_models(roles_spec), max(1, concurrency), engine)
    results = {}
    baselines: dict[tuple, dict] = {}
    for name in names:
        entry = candidates[name]
        env = entry.get("env") or ""
        if env not in environments and env not in ("bfcl", "agentdojo"):
            raise LibraryError(f"candidate {name!r}: field 'env' is {env!r}, not an environment (bfcl, agentdojo)")
        if env not in environments:
            environments[env] = load_env(env)
        environment = environments[env]
        catalog = {s.name: s for s in environment.catalog()}
        candidate = parse_composite({k: entry[k] for k in ("name", "description", "interface", "chain", "env",
                                                           "category") if k in entry}, catalog)
        admitted = load_library(library).composites(env)
        task_ids = environment.task_ids(split)[:limit] if limit else environment.task_ids(split)
        log(f"validate {name}: {len(task_ids)} {env} {split} tasks × seeds {list(seeds)}, {roles_spec}")
        # the library without the candidate: one run serves every candidate validated against it
        key = (env, tuple(sorted(c.name for c in admitted)), tuple(task_ids), tuple(seeds))
        if key not in baselines:
            baselines[key] = run_side(environment, admitted, task_ids, seeds, roles_spec, backend, engine,
                                      concurrency)
        without = baselines[key]
        with_ = run_side(environment, [*admitted, candidate], task_ids, seeds, roles_spec, backend, engine,
                         concurrency)
        evidence = {"kind": "composite", "split": split, "env": env, "roles": roles_spec,
                    "engine": None if roles_spec.startswith("teacher:") else engine,
                    "library_version": lib.version, "validated_at": _now(),
                    **paired_evidence(without, with_, lib.config)}
        results[name] = evidence
        with updating(library) as stage:
            path = stage / CANDIDATES / f"{name}.json"
            data = json.loads(path.read_text())
            data.update(status="validated", evidence=evidence)
            path.write_text(json.dumps(data, indent=2, default=str) + "\n")
        log(f"  signal {evidence['signal']}: lift {format_estimate(evidence['lift'])}; success "
            f"{evidence['success']['without']} → {evidence['success']['with']}; calls/task "
            f"{evidence['role_calls_per_task']['without']} → {evidence['role_calls_per_task']['with']}; "
            f"used in {evidence['episodes_using_candidate']} episode(s)")
    return results


def format_estimate(e: dict[str, Any]) -> str:
    if e.get("value") is None:
        return f"– (n={e.get('n')})"
    return f"{e['value']:.3g} [{e['low']:.3g}, {e['high']:.3g}] (n={e['n']})"


# -- admit --------------------------------------------------------------------------------

def admit(library: str | Path, names: Sequence[str] | None = None,
          after_decisions: Callable[[Path], None] | None = None) -> list[dict[str, Any]]:
    """Decide every validated candidate (or ``names``) by the rule, in one atomic update:
    admitted ones enter ``primitives`` with their evidence, rejected ones stay as candidates
    with theirs; each decision is appended to the history. A candidate without evidence is
    refused (nothing enters unvalidated). ``after_decisions`` runs on the staged folder just
    before the swap (tests kill the process there). Returns the decisions."""
    lib = load_library(library)
    candidates = lib.candidates()
    names = list(names) if names else [n for n, c in candidates.items() if c.get("status") == "validated"]
    missing = [n for n in names if n not in candidates]
    if missing:
        raise LibraryError(f"{library}: no candidate(s) {missing}")
    unvalidated = [n for n in names if not isinstance(candidates[n].get("evidence"), dict)]
    if unvalidated:
        raise LibraryError(f"{library}: candidate(s) {unvalidated} have no validation evidence: run "
                           "`heart library validate` first (nothing is admitted unvalidated)")
    decisions = []
    with updating(library) as stage:
        data = json.loads((stage / "library.json").read_text())
        delta = float(data["config"]["delta"])
        version = data["version"]
        for name in names:
            entry = candidates[name]
            parse_composite({k: entry[k] for k in ("name", "description", "interface", "chain", "env", "category")
                             if k in entry})
            decision, reason = decide(entry["evidence"], delta)
            record = {"kind": "primitive", "name": name, "decision": decision, "reason": reason,
                      "rule": f"lift lower bound > 0 and worst-condition success lift >= -{delta:g} points",
                      "signal": entry["evidence"]["signal"], "lift": entry["evidence"]["lift"],
                      "at": _now()}
            if decision == "admitted":
                version += 1
                data["primitives"][name] = {k: entry[k] for k in ("name", "description", "interface", "chain",
                                                                  "env", "category", "support") if k in entry}
                data["primitives"][name].update(version=version, evidence=entry["evidence"])
                (stage / CANDIDATES / f"{name}.json").unlink()
            else:
                path = stage / CANDIDATES / f"{name}.json"
                path.write_text(json.dumps({**entry, "status": "rejected", "decision": record}, indent=2,
                                           default=str) + "\n")
            record["library_version"] = version
            data["history"].append(record)
            decisions.append(record)
        data["version"] = version
        write_library_file(stage, data)
        if after_decisions is not None:
            after_decisions(stage)
    return decisions


# -- role adapters ------------------------------------------------------------------------

def check_adapter_base(role: str, path: str | Path, base: dict[str, Any]) -> dict[str, Any]:
    """The adapter's manifest, refused (LibraryError) when it is not for ``role`` or was
    trained on another base than ``base`` (the manifest's ``base_model``: content hash when
    both have one, else name)."""
    manifest_path = Path(path) / "manifest.json"
    if not (Path(path) / "adapter_config.json").is_file() or not manifest_path.is_file():
        raise LibraryError(f"adapter {path}: needs adapter_config.json and manifest.json (a `heart train` folder)")
    manifest = json.loads(manifest_path.read_text())
    if manifest.get("role") != role:
        raise LibraryError(f"adapter {path} is for role {manifest.get('role')!r}, not {role!r}")
    trained = manifest.get("base_model") or {}
    if base:
        same = (trained.get("content_hash") == base.get("content_hash")) if trained.get("content_hash") and \
            base.get("content_hash") else trained.get("name") == base.get("name")
        if not same:
            raise LibraryError(f"adapter {path} was trained on base {trained.get('name')!r} "
                               f"({str(trained.get('content_hash'))[:23]}…), but this library serves base "
                               f"{base.get('name')!r} ({str(base.get('content_hash'))[:23]}…): refused")
    return manifest


def incumbent_with_same_weights(library: str | Path, role: str, path: str | Path) -> dict[str, Any] | None:
    """The library's admitted entry for ``role`` when ``path`` holds the very same adapter
    (same config and weights, byte for byte): validating an adapter against itself decides
    nothing, so a rerun of the same admission is a no-op instead of a rejection in the history."""
    from heart.models import weights_hash

    if not (Path(library) / "library.json").is_file():
        return None
    entry = load_library(library).adapters.get(role)
    if entry is None:
        return None

    def identity(folder: Path) -> tuple[str, str] | None:
        try:  # the adapter's config and its weights (heart.models.weights_hash: the safetensors)
            return (folder / "adapter_config.json").read_text(), weights_hash(folder)
        except FileNotFoundError:
            return None

    candidate = identity(Path(path))
    return entry if candidate is not None and candidate == identity(Path(library) / entry["path"]) else None


def adapter_evidence(role: str, incumbent: list[dict[str, Any]], candidate: list[dict[str, Any]],
                     config: dict[str, Any] | None = None, seed: int = 0) -> dict[str, Any]:
    """Paired evidence on the role's primary metric over the held-out rows both sides scored
    (:func:`heart_distill.eval.metrics.paired_difference`, in points), conditions the rows'
    environments (``env`` of each row)."""
    from heart_distill.eval.metrics import HEADLINE, paired_difference, summarize

    metric = HEADLINE[role]
    lift = paired_difference(role, metric, incumbent, candidate, seed).to_dict()
    lift = {k: (v * 100.0 if isinstance(v, float) else v) for k, v in lift.items()}
    envs = sorted({str(r.get("env") or "all") for r in incumbent})
    conditions = {}
    for env in envs:
        value = paired_difference(role, metric, [r for r in incumbent if str(r.get("env") or "all") == env],
                                  [r for r in candidate if str(r.get("env") or "all") == env], seed).value
        if value is not None:
            conditions[env] = 100.0 * value
    scored = lambda rows: summarize(role, [r for r in rows if not r.get("errored")], seed)[metric].value  # noqa: E731
    return {"kind": "adapter", "role": role, "metric": metric, "signal": "role_metric", "rows": lift["n"],
            "incumbent": scored(incumbent), "candidate": scored(candidate), "lift": lift,
            "conditions": conditions or {"all": 0.0}}


def admit_adapter(library: str | Path, role: str, path: str | Path, evidence: dict[str, Any],
                  config: dict[str, Any] | None = None) -> dict[str, Any]:
    """Decide a validated adapter by the rule, in one atomic update: admitted, its folder is
    copied to ``adapters/ROLE/vN/`` with ``library_entry.json`` (version, evidence) and it
    becomes what serving uses; rejected, the incumbent stays. Either way the history records it."""
    with updating(library, create=True, config=config) as stage:
        data = json.loads((stage / "library.json").read_text())
        base = data.get("base") or {}
        manifest = check_adapter_base(role, path, base)
        decision, reason = decide(evidence, float(data["config"]["delta"]))
        version = data["version"]
        record = {"kind": "adapter", "name": role, "decision": decision, "reason": reason, "source": str(path),
                  "rule": f"lift lower bound > 0 and worst-condition lift >= -{data['config']['delta']:g} points",
                  "signal": f"{evidence['metric']} (held-out gate rows)", "lift": evidence["lift"], "at": _now()}
        if decision == "admitted":
            version += 1
            previous = (data["adapters"].get(role) or {}).get("version", 0)
            target = Path(ADAPTERS) / role / f"v{previous + 1}"
            shutil.copytree(path, stage / target)
            entry = {"role": role, "version": previous + 1, "library_version": version, "path": str(target),
                     "source": str(path), "base_model": manifest.get("base_model"), "evidence": evidence}
            (stage / target / ADAPTER_ENTRY).write_text(json.dumps(entry, indent=2, default=str) + "\n")
            # the served copy's manifest names its library version and evidence
            (stage / target / "manifest.json").write_text(json.dumps(
                {**manifest, "library": {"version": entry["version"], "library_version": version,
                                         "evidence": evidence}}, indent=2, default=str) + "\n")
            entry["system_prompt"] = manifest.get("system_prompt")
            data["adapters"][role] = entry
            data.setdefault("base", manifest.get("base_model") or {})
        record["library_version"] = version
        data["version"] = version
        data["history"].append(record)
        write_library_file(stage, data)
    return record


def validate_adapter(library: str | Path, role: str, path: str | Path, data: str | Path, split: str = "validation",
                     limit: int | None = 24, engine: str = "llamacpp:f16", seed: int = 0,
                     log: Callable[[str], None] = print) -> dict[str, Any]:
    """Evaluate the candidate adapter and the incumbent (the library's admitted adapter for
    ``role``, else the bare base) on the same held-out gate rows; returns the evidence.
    Refuses an adapter for another base before evaluating anything."""
    import tempfile

    from heart_distill.eval.roles import RoleEvalConfig, run

    lib = load_library(library) if (Path(library) / "library.json").is_file() else None
    base = lib.base if lib else {}
    check_adapter_base(role, path, base)
    incumbent = (lib.adapter_paths().get(role) if lib else None)
    with tempfile.TemporaryDirectory() as tmp:
        sides = {}
        for side, folder in (("incumbent", incumbent), ("candidate", str(path))):
            spec = "base"
            if folder is not None:
                (Path(tmp) / side).mkdir()
                (Path(tmp) / side / role).symlink_to(Path(folder).absolute())
                spec = str(Path(tmp) / side)
            sides[side] = RoleEvalConfig(data=str(data), out=str(Path(tmp) / f"out-{side}"), split=split,
                                         roles_spec=spec, roles=(role,), limit=limit, engine=engine, seed=seed)
        log(f"validate adapter {role}: {path} vs {incumbent or 'the bare base'} on {limit or 'all'} {split} rows")
        for config in sides.values():  # one side after the other: concurrent dataset loads race in tqdm
            run(config)
        rows = {side: [json.loads(line) for line in open(Path(c.out) / "roles_examples.jsonl")]
                for side, c in sides.items()}
    envs = _row_envs(data, role, split)
    for side in rows.values():
        for r in side:
            r["env"] = envs.get(r.get("episode_id"), "all")
    evidence = adapter_evidence(role, rows["incumbent"], rows["candidate"], lib.config if lib else
                                {"confidence": 0.95, "n_resamples": 2000}, seed)
    evidence.update(split=split, engine=engine, incumbent_path=incumbent, candidate_path=str(path),
                    validated_at=_now())
    return evidence


def _row_envs(data: str | Path, role: str, split: str) -> dict[str, str]:
    from datasets import load_from_disk

    rows = load_from_disk(str(Path(data) / role))[split]
    return {r["episode_id"]: r.get("env") or "all" for r in rows} if "episode_id" in rows.column_names else {}


# -- reading ------------------------------------------------------------------------------

def history_lines(library: str | Path, name: str | None = None) -> list[str]:
    lib = load_library(library)
    lines = []
    for h in lib.history:
        if name and h["name"] != name:
            continue
        lift = h.get("lift") or {}
        lines.append(f"v{h.get('library_version')} {h['at']} {h['kind']} {h['name']}: {h['decision'].upper()} "
                     f"— {h['reason']} [signal {h.get('signal')}, lift {format_estimate(lift)}]")
    return lines or [f"(no decisions{' for ' + name if name else ''})"]


def list_lines(library: str | Path) -> list[str]:
    lib = load_library(library)
    lines = [f"library {lib.path} version {lib.version} (delta {lib.config['delta']:g})"]
    for name, e in sorted(lib.primitives.items()):
        lines.append(f"  primitive {name} (v{e['version']}, {e.get('env')}): {e['description']}")
    for role, e in sorted(lib.adapters.items()):
        lines.append(f"  adapter {role} v{e['version']}: {e['path']} (from {e.get('source')})")
    for name, c in sorted(lib.candidates().items()):
        lines.append(f"  candidate {name} ({c.get('env')}): {c.get('status')}")
    return lines
