"""The protocol: split seeds × repeats of the optimizer, the scorecard once per run, four arms.

Task sets. Per pre-declared condition (``bfcl:simple``, ``bfcl:multi_turn_base``,
``agentdojo:banking``), a pool of each split — repair from train, gate from dev, scorecard
from test (:mod:`heart.environments.splits`, disjoint by task id) — is its first N tasks in a
fixed hash order; a split seed draws each run's repair, gate and scorecard tasks from them.
Runs of one split seed differ by their repeat, which seeds the search's choices.

Stages, each resumable (a finished piece is a file and is skipped):

1. ``search`` — per arm that gets a harness and per run: :func:`search.search` on repair and
   gate tasks only, writing ``runs/<arm>/<run>/log.json`` and the selected harness folder.
2. ``scorecard`` — per run, each arm's scorecard, evaluated once, after every search of the
   run is done: base and distilled with the seed harness (cached per split seed), each with
   its run's selected harness, and — when the seed's middleware is not the shipped default —
   each with the seed's prompts and the default middleware: a fixed **reference** arm
   (``<arm>+default``), the repair a search from ``none`` can be held against.

The seed harness is the recipe's ``seed_middleware`` (``none``, ``default`` or an intercept
file) with its ``seed_prompts`` (role prompt edits, as in a harness file): every arm starts from
it, and nothing else is part of every arm.
3. ``report`` — four arms (base; base + optimized harness; distilled; distilled + optimized
   harness), each arm's lift over base with a bootstrap interval over runs, WorstLift over
   the conditions, RR0, RelLift95(B) for the optimized arms, and the interaction
   (both − distil − optimize).
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import hashlib
import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from heart.harness import Harness, _parse_prompts, save_harness
from heart_distill.eval.optimize.rollouts import AnswerRecord, Evaluation, ReplayBackend, TaskRef, evaluate
from heart_distill.eval.optimize.search import SearchConfig, budget_error, search, write_log

SPLITS = {"repair": "train", "gate": "dev", "scorecard": "test"}
ARMS = ("base", "distilled")
LOOP_EXTRA = ("argument_types",)
"""The recipe's ``loop`` keys that are not loop settings: how a role's answer schema types the
tool's arguments (``argument_types: {primitive: free | string}``: :class:`ArgumentTypes`). Every
other key is a :class:`heart.settings.LoopConfig` setting by its field name (``replan_budget``,
``max_plan_steps``, ``router_mode`` — as the adapters were trained —, ``verify``, ``messages``,
``constrained``, …), over the loop's defaults."""

ARGUMENT_TYPES = ("free", "string")


def retype(spec: Any, mode: str) -> Any:
    """An argument schema whose scalar value types are changed, names, required parameters
    and nesting kept (arrays' items and objects' properties alike):

    - ``free``: a number, integer or boolean may also be a string, a string may leave its enum;
    - ``string``: what a tool-spec converter that writes scalars as text serves — an integer
      or number is a numeric string (``"36"``, ``"2.5"``), a boolean ``"true"`` / ``"false"``,
      a string enum's options upper-cased (``"CELSIUS"``). Every such value is one the default
      middleware's ``coerce_type`` / ``enum_casefold`` read back as the tool's own."""
    if not isinstance(spec, dict):
        return spec
    kind = spec.get("type")
    if kind in ("integer", "number", "boolean"):
        if mode == "free":
            return {"anyOf": [{"type": "string", "maxLength": 64}, {k: v for k, v in spec.items() if k != "enum"}]}
        if kind == "boolean":
            return {"type": "string", "enum": ["true", "false"]}
        fraction = r"(\.[0-9]{1,8})?" if kind == "number" else ""
        return {"type": "string", "pattern": f"^-?[0-9]{{1,12}}{fraction}$"}
    if kind == "string" and isinstance(spec.get("enum"), list):
        if mode == "free":
            return {k: v for k, v in spec.items() if k != "enum"}
        return {**spec, "enum": [o.upper() if isinstance(o, str) else o for o in spec["enum"]]}
    if kind == "array" and isinstance(spec.get("items"), dict):
        return {**spec, "items": retype(spec["items"], mode)}
    if kind == "object" and isinstance(spec.get("properties"), dict):
        return {**spec, "properties": {k: retype(v, mode) for k, v in spec["properties"].items()}}
    return spec


class ArgumentTypes:
    """A backend that serves some roles' calls under their answer schema with the tool's
    argument types changed (:func:`retype` on the ``arguments`` of the Primitive's answer
    schema): the answer is still a well-formed call of the right tool with its parameter
    names, but a ``"5"`` for an integer can reach the tool boundary — as from a server whose
    structured output checks a call's shape and not the tool's types (``free``), or one fed a
    tool spec that writes scalars as text (``string``: a planted defect, which the default
    middleware's coercion and enum casefold repair). Other roles, and schemas of another form, decode
    as the loop asks."""

    def __init__(self, inner: Any, modes: dict[str, str]):
        self.inner, self.modes = inner, dict(modes)
        self.name = getattr(inner, "name", "model")

    @staticmethod
    def retyped(schema_text: str, mode: str) -> str:
        schema = json.loads(schema_text)
        for branch in schema.get("anyOf", []) if isinstance(schema, dict) else []:
            arguments = (branch.get("properties") or {}).get("arguments")
            if isinstance(arguments, dict) and isinstance(arguments.get("properties"), dict):
                branch["properties"]["arguments"] = retype(arguments, mode)
        return json.dumps(schema, sort_keys=True)

    def generate(self, role: str, messages, sampling=None):
        if role in self.modes and sampling is not None and sampling.guided_json:
            sampling = dataclasses.replace(sampling, guided_json=self.retyped(sampling.guided_json, self.modes[role]))
        return self.inner.generate(role, messages, sampling)

    def client(self):
        import contextlib

        client = getattr(self.inner, "client", None)
        return client() if client is not None else contextlib.nullcontext()


@dataclass
class ProtocolConfig:
    """A ``heart optimize`` recipe (recipes/*/optimize.yaml)."""

    out: str
    """Where logs, harnesses, recorded answers and the report go."""
    conditions: list[str]
    """Pre-declared conditions: bfcl:<category> or agentdojo:<suite> (WorstLift is over these)."""
    model: str = "smollm2-135m"
    """The fixed base model."""
    engine: str = "llamacpp:f16"
    """In-process engine (heart.runtime.engines) when the arm is not an openai: endpoint."""
    arms: dict[str, str] = field(default_factory=lambda: {"base": "base"})
    """Arm → roles spec: base, an adapters folder, or teacher:openai:<url>#<model>."""
    optimize: list[str] = field(default_factory=lambda: ["base"])
    """Arms whose harness is optimized (each gets its own search per run)."""
    proposer: str = "deterministic"
    """deterministic, or openai:<url>#<model> (any OpenAI-compatible chat model)."""
    pools: dict[str, int] = field(default_factory=lambda: {"repair": 6, "gate": 6, "scorecard": 8})
    """Per condition: how many tasks of each split the runs draw from."""
    sizes: dict[str, int] = field(default_factory=lambda: {"repair": 4, "gate": 4, "scorecard": 6})
    """Per condition and run: how many tasks each set gets."""
    split_seeds: list[int] = field(default_factory=lambda: [0, 1, 2, 3])
    repeats: int = 2
    search: dict[str, int] = field(default_factory=lambda: {"generations": 10, "mutations": 3, "population": 5,
                                                            "budget": 200})
    """generations × mutations, population cap, and B: inner rollouts per run, at least
    :func:`search.min_budget` of the run's repair and gate tasks (refused at load otherwise)."""
    budget_runs: list[int] = field(default_factory=lambda: [1, 2])
    """RelLift95(B) is reported at B = k × one run's budget for each k here."""
    concurrency: int = 2
    """Episodes in flight at once (the in-process engine batches their role calls)."""
    loop: dict[str, Any] = field(default_factory=dict)
    """The episodes' loop settings by :class:`heart.settings.LoopConfig` field name, over the
    loop's defaults (single-turn BFCL runs with no re-plan whatever ``replan_budget`` says),
    plus :data:`LOOP_EXTRA`."""
    resamples: int = 5000
    slots: list[str] = field(default_factory=lambda: ["middleware", "prompt", "joint"])
    """The search's mutation slots (["middleware"]: the middleware surface alone)."""
    answers: str | None = None
    """Where recorded role answers are kept (default <out>/answers); variants of one recipe
    (another out, other slots) share them to replay what the first computed."""
    seed_middleware: str = "default"
    """The seed harness's tool-boundary middleware: ``default`` (the shipped set), ``none``
    (arguments bound as given) or an intercept file (docs/middleware.md). Unless it is
    ``default``, the scorecard also scores each arm with the default set (``<arm>+default``)."""
    seed_prompts: dict[str, dict[str, str]] | None = None
    """The seed harness's role prompt edits, as a harness file writes them:
    ``{primitive: {append: "..."}}`` (a planted defect for a positive control, or a house style)."""

    def __post_init__(self) -> None:
        for c in self.conditions:
            env, _, part = c.partition(":")
            if env not in ("bfcl", "agentdojo") or not part:
                raise ValueError(f"conditions: {c!r}: expected bfcl:<category> or agentdojo:<suite>")
        if not self.conditions:
            raise ValueError("conditions: name at least one")
        for a in self.optimize:
            if a not in self.arms:
                raise ValueError(f"optimize: {a!r} is not an arm (arms: {sorted(self.arms)})")
        for key in ("pools", "sizes"):
            value = getattr(self, key)
            if set(value) != set(SPLITS) or not all(isinstance(v, int) and v >= 1 for v in value.values()):
                raise ValueError(f"{key}: expected positive integers for {', '.join(SPLITS)}, got {value}")
        for s in SPLITS:
            if self.sizes[s] > self.pools[s]:
                raise ValueError(f"sizes.{s}={self.sizes[s]} is larger than pools.{s}={self.pools[s]}")
        if not self.slots or set(self.slots) - {"middleware", "prompt", "joint"}:
            raise ValueError(f"slots: a non-empty subset of middleware, prompt, joint, got {self.slots}")
        if set(self.search) - {"generations", "mutations", "population", "budget"}:
            raise ValueError(f"search: unknown key(s) {sorted(set(self.search) - {'generations', 'mutations', 'population', 'budget'})}")
        if self.repeats < 1 or not self.split_seeds:
            raise ValueError("split_seeds and repeats: at least one run")
        if any(k < 1 for k in self.budget_runs):
            raise ValueError("budget_runs: each k ≥ 1")
        refused = budget_error(self.search_config.budget, *self.tasks_per_run())
        if refused:  # refused here, not after the seed's rollouts: such a run can only return the seed
            raise ValueError(f"search.budget: {refused}")
        from heart.harness import ROLES
        from heart.settings import user_settings

        known = [f.name for f in user_settings()] + list(LOOP_EXTRA)
        for key in self.loop:
            if key not in known:
                close = difflib.get_close_matches(str(key), known, n=1)
                hint = f"; did you mean 'loop.{close[0]}'?" if close else ""
                raise ValueError(f"unknown key 'loop.{key}'{hint} (known: {', '.join(known)})")
        try:
            self.loop_config()
        except (TypeError, ValueError) as err:
            raise ValueError(f"loop: {err}") from None

        types = self.loop.get("argument_types", {})
        if not isinstance(types, dict) or set(types) - set(ROLES) or set(types.values()) - set(ARGUMENT_TYPES):
            raise ValueError(f"loop.argument_types: role → {' | '.join(ARGUMENT_TYPES)} (roles: {', '.join(ROLES)}), "
                             f"got {types!r}")
        self.seed_harness()  # a bad seed_middleware or seed_prompts is refused by field, before any rollout

    def loop_config(self):
        """The episodes' :class:`heart.settings.LoopConfig` (``loop`` less :data:`LOOP_EXTRA`)."""
        from heart.settings import LoopConfig

        return LoopConfig(**{k: v for k, v in self.loop.items() if k not in LOOP_EXTRA})

    def seed_harness(self) -> Harness:
        """The harness every arm starts from (``seed_middleware`` + ``seed_prompts``)."""
        from heart.middleware import load_middleware
        from heart.user_errors import UserError

        try:
            prompts = _parse_prompts(self.seed_prompts, "seed_prompts")
            middleware = str(self.seed_middleware)
            load_middleware(middleware)
        except (UserError, ValueError) as err:  # MiddlewareError, HarnessError
            raise ValueError(f"seed: {err}") from None
        text = None
        if middleware not in ("default", "none"):
            middleware = str(Path(middleware).resolve())
            text = Path(middleware).read_text()
        return Harness("seed", prompts, middleware, text)

    def reference_harness(self) -> Harness | None:
        """The seed's prompts with the shipped default middleware: the fixed reference arm, or
        None when the seed's middleware is the default already."""
        if str(self.seed_middleware) == "default":
            return None
        return Harness("reference-default", self.seed_harness().prompts, "default")
    @property
    def search_config(self) -> SearchConfig:
        return SearchConfig(**self.search, slots=tuple(self.slots))

    def tasks_per_run(self) -> tuple[int, int]:
        """(repair, gate) tasks of one run: each set draws its size from every condition."""
        return self.sizes["repair"] * len(self.conditions), self.sizes["gate"] * len(self.conditions)

    def run_ids(self) -> list[str]:
        return [run_id(s, r) for s in self.split_seeds for r in range(self.repeats)]


def load_recipe(path: str | Path, overrides: dict[str, Any] | None = None) -> ProtocolConfig:
    """A recipe's YAML as a ProtocolConfig; an unknown or bad field is refused by name."""
    from heart_distill.recipes import check_keys, read_yaml

    data = read_yaml(Path(path), "optimize recipe") or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of recipe fields")
    data.update(overrides or {})
    try:
        check_keys(data, ProtocolConfig, error=ValueError)
        return ProtocolConfig(**data)
    except TypeError as err:
        raise ValueError(f"{path}: {err}") from None
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None


def run_id(split_seed: int, repeat: int) -> str:
    return f"s{split_seed}r{repeat}"


def _order(task_id: str) -> str:
    return hashlib.sha256(task_id.encode()).hexdigest()


def condition_tasks(condition: str, split: str, environment: Any) -> list[str]:
    env, _, part = condition.partition(":")
    ids = environment.task_ids(split)
    if env == "agentdojo":
        ids = [t for t in ids if t.split("/")[0] == part]
    return sorted(ids, key=_order)


def task_sets(config: ProtocolConfig, split_seed: int, task_ids: Callable[[str, str], list[str]]) -> dict[str, list[TaskRef]]:
    """The repair, gate and scorecard tasks of one split seed (``task_ids(condition, split)``:
    the condition's task ids of a split in pool order)."""
    out: dict[str, list[TaskRef]] = {}
    for which, split in SPLITS.items():
        refs = []
        for condition in config.conditions:
            pool = task_ids(condition, split)[:config.pools[which]]
            if len(pool) < config.sizes[which]:
                raise ValueError(f"{condition}: the {split} split has {len(pool)} task(s) for the {which} pool, "
                                 f"fewer than sizes.{which}={config.sizes[which]}")
            rng = random.Random(f"split:{split_seed}:{condition}:{which}")
            refs += [TaskRef(condition, t) for t in sorted(rng.sample(pool, config.sizes[which]), key=pool.index)]
        out[which] = refs
    return out


# -- the run's world: environments, backends, one episode ------------------------------------

class World:
    """What rollouts need: each condition's environment and each arm's model (loaded once)."""

    def __init__(self, config: ProtocolConfig):
        self.config = config
        self._envs: dict[str, Any] = {}
        self._backends: dict[str, Any] = {}
        self._models: dict[str, Any] = {}

    def environment(self, condition: str):
        if condition not in self._envs:
            from heart_distill.eval.e2e import load_environment

            env, _, part = condition.partition(":")
            self._envs[condition] = load_environment(env, part if env == "bfcl" else None)
        return self._envs[condition]

    def task_ids(self, condition: str, split: str) -> list[str]:
        return condition_tasks(condition, split, self.environment(condition))

    def catalogs(self) -> dict[str, list[Any]]:
        return {c: self.environment(c).catalog() for c in self.config.conditions}

    def models(self, arm: str):
        if arm not in self._models:
            from heart_distill.eval.models import resolve_role_models

            spec = self.config.arms[arm]
            self._models[arm] = resolve_role_models(spec.removeprefix(GOLD_CONTEXT), self.config.model)
        return self._models[arm]

    def backend(self, arm: str):
        if arm not in self._backends:
            from heart.runtime.scheduler import BatchingBackend
            from heart_distill.eval.models import shared_backend

            inner = shared_backend(self.models(arm), engine=self.config.engine)
            if inner is None:
                raise ValueError(f"arms.{arm}: {self.config.arms[arm]!r} has no shared backend (the gold "
                                 "teacher is not a fixed model to optimize around)")
            backend = BatchingBackend(inner, max_batch_size=max(1, self.config.concurrency))
            types = self.config.loop.get("argument_types") or {}
            self._backends[arm] = ArgumentTypes(backend, types) if types else backend
        return self._backends[arm]

    def run_episode(self, arm: str) -> Callable:
        from heart_distill.eval.e2e import E2EConfig, gold_teacher, run_one

        models = self.models(arm)
        loop = self.config.loop_config()

        def one(task: TaskRef, harness_dir: str | None, backend: Any):
            env, _, part = task.condition.partition(":")
            # the harness folder brings the middleware (the policy's is the default, never used)
            e2e = E2EConfig(env=env, out="", category=part if env == "bfcl" else None, split=SPLITS_OF_ANY,
                            roles_spec=self.config.arms[arm], model=self.config.model, engine=self.config.engine,
                            loop=loop, harness=harness_dir)
            environment = self.environment(task.condition)
            if not self.config.arms[arm].startswith(GOLD_CONTEXT):
                return run_one(environment, task.task_id, 0, backend, models, e2e)
            return run_one(environment, task.task_id, 0, None, models, e2e,
                           teacher_for_task=lambda t, env, seed: GoldContext(gold_teacher(t, env, seed), backend))

        return one


GOLD_CONTEXT = "gold+primitive:"
"""An arm ``gold+primitive:<roles>``: the gold teacher plays Planner, Router and Verifier, and
the model of ``<roles>`` (``base`` or an adapters folder) plays the Tool Primitive — the one
role whose answers meet the tool boundary, measured with every other role right."""


class GoldContext:
    """One episode's backend for a ``gold+primitive:`` arm: Primitive calls go to the model
    (the run's :class:`ReplayBackend`), the others to the task's gold teacher. The teacher
    is stateful (its plan follows the episode), so it answers every call; a call whose exact
    messages this optimizer run already sent it is marked ``replayed`` (greedy and seeded, it
    gives the same answer), so an episode costs an inner rollout exactly when some call is new."""

    def __init__(self, gold: Any, model: Any):
        self.gold, self.model = gold, model
        self.name = f"{getattr(gold, 'name', 'gold')}+{getattr(model, 'name', 'model')}"

    def generate(self, role: str, messages, sampling=None):
        if role == "primitive":
            return self.model.generate(role, messages, sampling)
        from heart_distill.eval.optimize.rollouts import call_key

        generation = self.gold.generate(role, messages, sampling)
        seen = getattr(self.model, "seen", None)
        key = call_key(self.gold.name, role, messages, sampling)
        replayed = seen is not None and key in seen
        if seen is not None:
            seen.add(key)
        return dataclasses.replace(generation, meta={**generation.meta, "replayed": replayed, "cached": True})

    def client(self):
        return self.model.client() if hasattr(self.model, "client") else contextlib.nullcontext()


SPLITS_OF_ANY = "test"
"""run_one reads no split (the protocol picked the tasks); E2EConfig needs one."""


# -- stages ------------------------------------------------------------------------------

def shipped_folder(out: Path) -> str:
    """The shipped harness (shipped prompts, default middleware) saved under ``out``."""
    return harness_folder(out, Harness("shipped"))


def harness_folder(out: Path, harness: Harness) -> str:
    """``harness`` saved under ``out/harnesses/<name>-<fingerprint>`` (once)."""
    folder = out / "harnesses" / f"{harness.name}-{harness.fingerprint()}"
    if not (folder / "harness.yaml").is_file():
        save_harness(harness, folder)
    return str(folder)


def model_label(config: ProtocolConfig, arm: str) -> str:
    """What an answer record is keyed by besides the messages: the arm's model and engine,
    and how roles' answer schemas type the arguments (their answers differ)."""
    types = config.loop.get("argument_types") or {}
    return f"{arm}:{config.arms[arm]}:{config.engine}" + "".join(f":{r}-arguments={m}" for r, m in sorted(types.items()))


def record_path(config: ProtocolConfig, arm: str) -> Path:
    return Path(config.answers or Path(config.out) / "answers") / f"{arm}.jsonl"


def search_run(config: ProtocolConfig, arm: str, rid: str, world: Any, proposer: Any,
               log: Callable[[str], None] = print) -> dict[str, Any]:
    """Stage 1 for one (arm, run): skipped when its log exists."""
    out = Path(config.out)
    folder = out / "runs" / arm / rid
    path = folder / "log.json"
    seed = config.seed_harness()
    if path.is_file():
        done = json.loads(path.read_text())
        _same_seed(done, seed, path)
        return done
    split_seed, repeat = (int(x) for x in rid[1:].split("r"))
    sets = task_sets(config, split_seed, world.task_ids)
    backend = ReplayBackend(world.backend(arm), model_label(config, arm), AnswerRecord(record_path(config, arm)))
    run_episode = world.run_episode(arm)
    started = time.perf_counter()

    def evaluate_folder(tasks: list[TaskRef], harness_dir: str) -> Evaluation:
        return evaluate(tasks, harness_dir, backend, run_episode, config.concurrency)

    result = search(seed, sets["repair"], sets["gate"], evaluate_folder, proposer,
                    world.catalogs(), config.search_config, random.Random(f"run:{arm}:{rid}"),
                    folder / "candidates",
                    log=lambda e: log(f"[{arm} {rid}] {json.dumps(e, default=str)[:300]}"))
    header = {"kind": "optimize-run", "arm": arm, "run": rid, "split_seed": split_seed, "repeat": repeat,
              "proposer": getattr(proposer, "name", "?"), "search": config.search,
              "seed": {"describe": seed.describe(), "fingerprint": seed.fingerprint()}, "loop": config.loop,
              "repair": [t.key for t in sets["repair"]], "gate": [t.key for t in sets["gate"]],
              "scorecard_tasks_not_seen": len(sets["scorecard"]),
              "computed_role_calls": backend.computed, "wall_s": round(time.perf_counter() - started, 1),
              "seed_diagnosis": diagnosis([*result.seed.repair.episodes.values(), *result.seed.gate.episodes.values()])}
    write_log(result, path, header)
    return json.loads(path.read_text())


def _same_seed(done: dict[str, Any], seed: Harness, path: Path) -> None:
    """A finished piece is reused only when it started from this recipe's seed harness."""
    recorded = (done.get("seed") or {}).get("fingerprint", Harness("shipped").fingerprint())
    if recorded != seed.fingerprint():
        raise ValueError(f"{path}: made from another seed harness ({(done.get('seed') or {}).get('describe', 'shipped')}) "
                         f"than the recipe's ({seed.describe()}): give another out, or remove it")


def diagnosis(episodes: list[Any]) -> dict[str, Any]:
    """Where the seed harness's episodes fail: how many reached the tool boundary (a Primitive
    produced a call that met the middleware), and the failures by kind — what decides whether
    a middleware edit can matter at all."""
    from collections import Counter

    from heart_distill.eval.optimize.clusters import failures_of

    def at_boundary(e: dict[str, Any]) -> bool:  # a parsed Primitive call that met the middleware
        return (e.get("role") == "primitive" and not e.get("parse_error") and bool((e.get("extra") or {}).get("envelope"))
                and (e.get("parsed") or {}).get("status") != "UNRESOLVABLE")

    reached = sum(any(at_boundary(e) for e in ep.events) for ep in episodes)
    kinds = Counter(f"{f.kind}/{f.where}" for ep in episodes for f in failures_of(ep))
    return {"episodes": len(episodes), "passed": sum(ep.score >= 1.0 for ep in episodes),
            "reached_tool_boundary": reached, "failures": dict(kinds.most_common())}


def scorecard_run(config: ProtocolConfig, rid: str, world: Any, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Stage 2 for one run: every arm's scorecard, after every search of the run is logged."""
    out = Path(config.out)
    path = out / "scorecard" / f"{rid}.json"
    if path.is_file():
        return json.loads(path.read_text())
    missing = [a for a in config.optimize if not (out / "runs" / a / rid / "log.json").is_file()]
    if missing:
        raise ValueError(f"run {rid}: the search of arm(s) {missing} is not done; the scorecard waits for selection")
    split_seed = int(rid[1:].split("r")[0])
    tasks = task_sets(config, split_seed, world.task_ids)["scorecard"]
    doc: dict[str, Any] = {"run": rid, "split_seed": split_seed, "tasks": [t.key for t in tasks], "arms": {},
                           "seed": config.seed_harness().describe()}
    started = time.perf_counter()
    seed = config.seed_harness()
    fixed = {"": harness_folder(out, seed)}
    reference = config.reference_harness()
    if reference is not None:
        fixed["+default"] = harness_folder(out, reference)
    for arm in config.arms:
        backend = ReplayBackend(world.backend(arm), model_label(config, arm), AnswerRecord(record_path(config, arm)))
        run_episode = world.run_episode(arm)
        for suffix, harness_dir in fixed.items():  # fixed harnesses on this split seed's scorecard: shared by its runs
            which = seed if not suffix else reference
            cached = out / "scorecard" / f"baseline-{arm}{suffix}-s{split_seed}-{which.fingerprint()}.json"
            if cached.is_file():
                entry = json.loads(cached.read_text())
            else:
                ev = evaluate(tasks, harness_dir, backend, run_episode, config.concurrency)
                entry = {"scores": ev.scores(), "errored": [k for k, e in ev.episodes.items() if e.errored],
                         "rollouts": ev.rollouts, "tokens": ev.tokens, "harness": which.describe()}
                _write(cached, entry)
            doc["arms"][f"{arm}{suffix}"] = entry
        if arm in config.optimize:
            run_log = json.loads((out / "runs" / arm / rid / "log.json").read_text())
            ev = evaluate(tasks, run_log["selected_folder"], backend, run_episode, config.concurrency)
            doc["arms"][f"{arm}+harness"] = {"scores": ev.scores(), "errored": [k for k, e in ev.episodes.items()
                                                                               if e.errored],
                                             "rollouts": ev.rollouts, "tokens": ev.tokens,
                                             "harness": run_log["selected"], "gate_lift": run_log["gate_lift"]}
        log(f"[scorecard {rid}] {arm}: " + ", ".join(f"{k} {100 * np.mean(list(v['scores'].values())):.1f}%"
                                                    for k, v in doc["arms"].items() if k.split("+")[0] == arm))
    doc["wall_s"] = round(time.perf_counter() - started, 1)
    _write(path, doc)
    return doc


def _write(path: Path, doc: dict[str, Any]) -> None:
    from heart.atomic import publish_text

    path.parent.mkdir(parents=True, exist_ok=True)
    publish_text(path, json.dumps(doc, indent=1, default=str) + "\n")
