"""The whole-loop benchmark in chunks: held-out tasks, several arms, a ledger that grows.

    heart eval bench --recipe recipes/smollm2-135m/e2e-benchmark.yaml              # the next chunk
    heart eval bench --recipe recipes/smollm2-135m/e2e-benchmark.yaml --max-chunks 3
    heart eval bench --recipe recipes/smollm2-135m/e2e-benchmark.yaml --max-calls 2   # two arms' calls
    heart eval bench --recipe recipes/smollm2-135m/e2e-benchmark.yaml --report-only

A recipe names conditions (an environment, a BFCL category, how many test-split tasks) and
arms (the unadapted base, adapter sets, the gold teacher). Each condition's tasks are cut into
chunks of ``chunk_tasks``; a chunk runs every arm on its tasks with ``heart eval e2e`` (the
base beside the first adapter set in one process, one engine, one batch), each arm into its
own folder under ``<out>/<condition>/chunk-NNN/``. The folders are the ledger: a chunk's
``stamp.json`` holds the key of each command that finished in it (its command line, the bytes of
the adapters it serves, the formats and splits versions); a command whose key is current is
done and skipped, an interrupted one continues (``heart eval e2e --resume``), one run under
another configuration runs again, and an arm added to the recipe later (another distillation
seed, a joint adapter) runs alone on the chunks already done.
Chunks run in recipe order, cheapest and most decisive conditions first, so a session that
runs a few chunks and commits the folder leaves a result and the next session resumes it.

After every chunk the report (``report.md``, ``report.json``) is recomputed from every finished
chunk so far: per condition and arm, tasks so far of those planned, success with its 95%
interval, the paired difference of each adapted arm and the teacher over the base on the same
tasks, the paired contrasts the recipe names, the measures that move before whole tasks do
(per-turn success on multi-turn BFCL, and its paired differences; the share of first plans
that hold the gold calls' tools, beside the one-step rule), clarification recall and precision
where a turn withholds a parameter, where each failed episode broke, the distillation-seed
statistics, and each chunk's wall time.
"""

from __future__ import annotations

import argparse
import functools
import gzip
import hashlib
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field

from heart.atomic import publish_text
from heart.environments import BFCL_CATEGORIES, BFCL_SINGLE_TURN_CATEGORIES, ENVIRONMENTS
from heart.environments.splits import SPLITS_VERSION
from heart.roles import FORMATS_VERSION
from heart_distill.arguments import loop_flags
from heart_distill.eval.e2e_folder import EPISODES
from heart_distill.eval.metrics import plan_tools
from heart_distill.eval.report import DECISIVE_RUNS
from heart_distill.eval.stats import bootstrap
from heart_distill.pipeline import STAGE_ENV, fingerprint, heart_argv
from heart_distill.recipes import RecipeError, read_yaml, validate_sections

Env = Literal[ENVIRONMENTS]  # type: ignore[valid-type]
BFCLCategory = Literal[BFCL_CATEGORIES]  # type: ignore[valid-type]
STAMP = "stamp.json"
REPORT_JSON = "report.json"
REPORT_MD = "report.md"


@dataclass
class Condition:
    name: str
    """Folder and row name (``bfcl-simple``)."""
    env: Env = "bfcl"
    category: BFCLCategory | None = None
    """BFCL's category (None: multi_turn_base; AgentDojo: none)."""
    tasks: Annotated[int, Field(ge=0)] = 50
    """Test-split tasks measured, the first of the split in its stable order (0: all)."""
    chunk_tasks: Annotated[int, Field(gt=0)] | None = None
    """Tasks per chunk for this condition (None: the recipe's): multi-step episodes run a
    tenth as fast as single-turn ones, so their chunks are smaller to stay within the hour."""
    concurrency: Annotated[int, Field(gt=0)] | None = None
    """Episodes in flight per side for this condition (None: the recipe's)."""


@dataclass
class Arm:
    name: str
    """Column name (``base``, ``distilled``, ``joint``, ``teacher``)."""
    roles: str
    """What answers the roles: ``base``, an adapters folder (relative to the recipe's
    folder's repository, like every path here), or ``teacher:gold``."""
    seed_of: str | None = None
    """This arm is another distillation seed of the arm named here (the same recipe and rows
    with another ``sft.seed``: data order and LoRA init): the report gives MeanLift,
    WorstLift, RR0 and RelLift95 over base across the group."""
    conditions: list[str] | None = None
    """The names of the conditions this arm runs (None: every one), e.g. a seed on the
    single-turn conditions only."""


@dataclass
class BenchConfig:
    out: str
    """The ledger and report folder (commit it after each chunk)."""
    arms: list[Arm]
    conditions: list[Condition]
    model: str = "smollm2-135m"
    engine: str = "llamacpp:f16"
    chunk_tasks: Annotated[int, Field(gt=0)] = 25
    """Tasks per chunk: size it so that a chunk's arms finish within an hour on the machine."""
    concurrency: Annotated[int, Field(gt=0)] = 16
    """Episodes in flight per side."""
    loop: dict[str, Any] = field(default_factory=dict)
    """Loop settings for every arm (``heart.settings.LoopConfig`` field names)."""
    contrasts: list[tuple[str, str]] = field(default_factory=list)
    """Pairs of arm names ``[a, b]``: the report adds the paired difference a − b on the tasks
    both scored (``[distilled, joint]``: four role adapters against one)."""


def load_bench(path: str | Path) -> BenchConfig:
    """The recipe, checked: unknown keys and bad values fail naming the field."""
    path = Path(path)
    config = validate_sections(read_yaml(path, "benchmark recipe") or {}, BenchConfig, str(path), RecipeError,
                               "benchmark recipe")
    try:
        loop_flags(config.loop)
    except (TypeError, ValueError) as err:
        raise RecipeError(f"{path}: loop: {err}") from None
    names = [a.name for a in config.arms]
    if len(set(names)) != len(names) or len({c.name for c in config.conditions}) != len(config.conditions):
        raise RecipeError(f"{path}: arm and condition names must be distinct")
    if sum(a.roles == "base" for a in config.arms) > 1:
        raise RecipeError(f"{path}: at most one arm is the base")
    for a, b in config.contrasts:
        if a not in names or b not in names or a == b:
            raise RecipeError(f"{path}: contrasts: [{a}, {b}] must name two different arms of {names}")
    for arm in config.arms:
        if arm.seed_of is not None and arm.seed_of not in [a.name for a in config.arms if a.seed_of is None]:
            raise RecipeError(f"{path}: arm {arm.name}: seed_of names no other arm: {arm.seed_of!r}")
        if arm.seed_of is not None and (arm.roles == "base" or arm.roles.startswith("teacher:")):
            raise RecipeError(f"{path}: arm {arm.name}: seed_of applies to adapter sets only")
    for arm in config.arms:
        unknown = sorted(set(arm.conditions or []) - {c.name for c in config.conditions})
        if unknown:
            raise RecipeError(f"{path}: arm {arm.name}: conditions names no condition of the recipe: {unknown}")
    for condition in config.conditions:
        if condition.env != "bfcl" and condition.category is not None:
            raise RecipeError(f"{path}: condition {condition.name}: category applies to bfcl only")
    return config


def condition_tasks(condition: Condition) -> list[str]:
    from heart.environments import load_environment

    ids = load_environment(condition.env, condition.category).task_ids("test")
    return ids[:condition.tasks] if condition.tasks else ids


@dataclass
class Chunk:
    condition: Condition
    index: int
    tasks: list[str]
    folder: Path

    def arm_folder(self, arm: Arm) -> Path:
        return self.folder / arm.name


def plan_chunks(config: BenchConfig) -> list[Chunk]:
    """Every chunk of every condition, in recipe order."""
    chunks = []
    for condition in config.conditions:
        tasks = condition_tasks(condition)
        size = condition.chunk_tasks or config.chunk_tasks
        for index, start in enumerate(range(0, len(tasks), size)):
            chunks.append(Chunk(condition, index, tasks[start:start + size],
                                Path(config.out) / condition.name / f"chunk-{index:03d}"))
    return chunks


def chunk_commands(config: BenchConfig, chunk: Chunk) -> list[list[str]]:
    """The ``heart eval e2e`` command lines of a chunk: the base beside the first adapter set
    (one process, one engine), every other arm on its own."""
    c = chunk.condition
    common = ["--env", c.env, *(["--category", c.category] if c.category else []), "--split", "test",
              "--model", config.model, "--engine", config.engine,
              "--concurrency", str(c.concurrency or config.concurrency),
              *loop_flags(config.loop), *[a for t in chunk.tasks for a in ("--task", t)]]
    running = [a for a in config.arms if a.conditions is None or c.name in a.conditions]
    base = next((a for a in running if a.roles == "base"), None)
    adapted = [a for a in running if a.roles != "base" and not a.roles.startswith("teacher:")]
    commands, paired = [], None
    if base is not None and adapted:
        paired = adapted[0]
        commands.append(["heart", "eval", "e2e", "--roles", paired.roles, *common,
                         "--out", str(chunk.arm_folder(paired)), "--base-out", str(chunk.arm_folder(base))])
    for arm in running:
        if arm is not paired and not (arm is base and paired is not None):
            commands.append(["heart", "eval", "e2e", "--roles", arm.roles, *common,
                             "--out", str(chunk.arm_folder(arm))])
    return commands


def command_arms(command: list[str]) -> list[str]:
    """The arms a chunk command answers for (the folders it writes)."""
    return [Path(command[command.index(flag) + 1]).name for flag in ("--out", "--base-out") if flag in command]


def command_label(command: list[str]) -> str:
    """A chunk command's entry in the stamp: its arms (``distilled,base``)."""
    return ",".join(command_arms(command))


def command_key(command: list[str]) -> str:
    """What decides a command's episodes: the command line, the bytes of the adapters it serves
    (manifests and weights) and the formats and splits versions."""
    roles = command[command.index("--roles") + 1]
    payload = json.dumps({"command": command, "formats": FORMATS_VERSION,
                          "splits": SPLITS_VERSION,
                          "adapters": _adapter_fingerprint(roles) if Path(roles).is_dir() else None}, sort_keys=True)
    return "sha256:" + hashlib.sha256(payload.encode()).hexdigest()


@functools.lru_cache(maxsize=None)
def _adapter_fingerprint(path: str) -> str:
    """An adapters folder's content hash, read once per process: every chunk's key names it."""
    return fingerprint([Path(path)])


def _read_stamp(chunk: Chunk) -> dict[str, Any]:
    path = chunk.folder / STAMP
    return json.loads(path.read_text()) if path.is_file() else {"tasks": chunk.tasks, "wall_s": 0.0, "commands": {}}


def command_state(chunk: Chunk, command: list[str], stamp: dict[str, Any] | None = None) -> str:
    """"done" (the chunk's stamp holds this command's current key), "stale" (stamped under
    another configuration: its folders run again), "partial" (started, not stamped: resume)
    or "new"."""
    stamp = stamp if stamp is not None else _read_stamp(chunk)
    label = command_label(command)
    if label in stamp["commands"]:
        return "done" if stamp["commands"][label]["key"] == command_key(command) else "stale"
    return "partial" if any((chunk.folder / arm).is_dir() for arm in command_arms(command)) else "new"


def chunk_state(config: BenchConfig, chunk: Chunk) -> str:
    """"done" when every arm's command is (an arm added to the recipe later runs alone on the
    chunks already done), else "stale", "partial" or "new" by its commands' states."""
    stamp = _read_stamp(chunk)
    states = {command_state(chunk, c, stamp) for c in chunk_commands(config, chunk)}
    return next((s for s in ("stale", "partial", "new") if s in states), "done")


def run_chunk(config: BenchConfig, chunk: Chunk, max_calls: int | None = None) -> tuple[float, int]:
    """Run (or continue) the commands of a chunk that are not done, at most ``max_calls`` of
    them, stamping each as it finishes; their wall time and how many ran. Raises
    CalledProcessError on a failed arm."""
    chunk.folder.mkdir(parents=True, exist_ok=True)
    wall_s, calls = 0.0, 0
    for command in chunk_commands(config, chunk):
        stamp = _read_stamp(chunk)
        state = command_state(chunk, command, stamp)
        if state == "done":
            continue
        if max_calls is not None and calls >= max_calls:
            break
        if state == "stale":
            for arm in command_arms(command):
                shutil.rmtree(chunk.folder / arm, ignore_errors=True)
        print(f"bench: $ {' '.join(command[:4])} ... --out {command[command.index('--out') + 1]}", flush=True)
        started = time.perf_counter()
        subprocess.run(heart_argv([*command, *(["--resume"] if state == "partial" else [])]), env=STAGE_ENV,
                       check=True)
        took = round(time.perf_counter() - started, 1)
        wall_s, calls = wall_s + took, calls + 1
        compress_traces(chunk.folder)
        finished = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        stamp["commands"][command_label(command)] = {"key": command_key(command), "wall_s": took,
                                                     "finished_at": finished}
        stamp.update(wall_s=round(stamp["wall_s"] + took, 1), finished_at=finished)
        publish_text(chunk.folder / STAMP, json.dumps(stamp, indent=1) + "\n")
    return round(wall_s, 1), calls


def compress_traces(folder: Path) -> None:
    """Gzip each arm's finished trace (``<arm>/trace.jsonl`` → ``trace.jsonl.gz``, a tenth of
    its size: the ledger is committed chunk by chunk); the attribution reads either form."""
    from heart_distill.eval.e2e_folder import TRACE

    for trace in sorted(folder.glob(f"*/{TRACE}")):
        packed = trace.with_name(trace.name + ".gz")
        with trace.open("rb") as source, gzip.GzipFile(packed, "wb", mtime=0) as target:
            shutil.copyfileobj(source, target)
        trace.unlink()


def _trace_lines(folder: Path) -> list[str]:
    from heart_distill.eval.e2e_folder import TRACE

    trace, packed = folder / TRACE, folder / (TRACE + ".gz")
    if trace.is_file():
        return trace.read_text().splitlines()
    return gzip.decompress(packed.read_bytes()).decode().splitlines() if packed.is_file() else []


# -- where a failed episode broke ----------------------------------------------------------------

FAILURE_POINTS = ("planner_unparsed", "plan_tools", "plan_length", "router_unparsed", "router_binding",
                  "primitive_failure", "verifier_pass", "replan_budget", "other")
"""Where a failed episode broke, the first of these in the loop's order that its trace shows:
a Planner answer that did not parse; a first plan of a turn whose tools are not the turn's
gold tools (one missing, or one not needed); one with the right tools but another number of
steps; a Router answer that did not parse; the first plan's Router bindings, as calls, fail
the benchmark's own checker (BFCL's single-turn categories, whose checker judges calls
without running them; elsewhere not told); a Primitive FAILURE; every turn ended with the
Verifier's PASS although the checker failed the episode (a wrong PASS); a turn that spent the
whole re-plan budget; else ``other`` (wrong argument values the Verifier did not catch, or a
turn left unfinished)."""


def router_calls(events: list[dict[str, Any]]) -> list[Any]:
    """The calls the Router bound for the first plan of the first turn (attempt 0), one per
    plan step in step order, as :class:`~heart.environments.base.ToolCall`."""
    from heart.environments.base import ToolCall

    steps: dict[int, Any] = {}
    for event in events:
        if event.get("kind", "event") != "event" or event["role"] != "router" or event.get("attempt", 0) != 0 \
                or event.get("turn", 0) != 0:
            continue
        for item in (event.get("parsed") or {}).get("dispatch") or []:
            if item.get("target_tool"):  # the first binding of a step counts (a retry rebinds it)
                steps.setdefault(item.get("step", len(steps) + 1),
                                 ToolCall(item["target_tool"], dict(item.get("resolved_bindings") or {})))
    return [steps[k] for k in sorted(steps)]


@functools.lru_cache(maxsize=256)
def _tool_schemas(environment: Any, task_id: str) -> dict[str, dict[str, Any]]:
    """Tool name → parameter schema of the tools a task offers, read once per task (a session
    is started only to read them)."""
    session = environment.start(environment.load_task(task_id))
    try:
        return {tool.spec.name: tool.spec.parameters for tool in session.tools}
    finally:
        session.close()


def bindings_accepted(environment: Any, task_id: str, calls: list[Any]) -> bool:
    """The benchmark's checker (``environment.check``) on ``calls`` as the tool boundary binds
    them (:func:`heart.primitives.bind_arguments`: its default corrections of types, JSON text
    and enum case, which the Router's raw output does not yet have); a binding the boundary
    refuses is judged as given."""
    from heart.coercion import BindingError
    from heart.environments.base import ToolCall
    from heart.primitives import bind_arguments

    schemas = _tool_schemas(environment, task_id)
    bound = []
    for call in calls:
        try:
            arguments = bind_arguments(call.arguments, schemas[call.name])
        except (BindingError, KeyError):  # refused, or a tool the task does not offer
            arguments = call.arguments
        bound.append(ToolCall(call.name, arguments))
    return bool(environment.check(task_id, bound)["valid"])


def failure_point(events: list[dict[str, Any]], row: dict[str, Any], gold_turns: list[list[Any]],
                  replan_budget: int, accepts: Callable[[list[Any]], bool] | None = None) -> str:
    """The :data:`FAILURE_POINTS` entry of a failed episode (``row``) from its role calls;
    ``accepts`` judges a list of calls by the benchmark's checker where it can (else None)."""
    calls = [e for e in events if e.get("kind", "event") == "event"]
    planner = [e for e in calls if e["role"] == "planner"]
    if any(e.get("parse_error") for e in planner):
        return "planner_unparsed"
    for turn, gold in enumerate(gold_turns):
        first = next((e for e in planner if e.get("turn") == turn and (e.get("parsed") or {}).get("status")), None)
        if first is None or not gold or first["parsed"]["status"] != "SUFFICIENT":
            continue
        planned = plan_tools(first["parsed"], code_steps=False)
        wanted = [call.name for call in gold]
        if set(wanted) != set(planned):  # a gold tool missing, or a tool the turn does not need
            return "plan_tools"
        if len(planned) != len(wanted):
            return "plan_length"
    if any(e.get("parse_error") for e in calls if e["role"] == "router"):
        return "router_unparsed"
    if accepts is not None and (bound := router_calls(calls)) and not accepts(bound):
        return "router_binding"
    if any(((e.get("extra") or {}).get("envelope") or {}).get("status") == "FAILURE"
           for e in calls if e["role"] == "primitive"):
        return "primitive_failure"
    if row.get("verdicts") and all(v == "PASS" for v in row["verdicts"]):
        return "verifier_pass"
    if any(used >= replan_budget for used in row.get("replans_used") or []):
        return "replan_budget"
    return "other"


def task_events(folder: Path, task_ids: Any) -> dict[str, list[dict[str, Any]]]:
    """Task id → its trace events, in order, for the tasks of ``task_ids`` in an arm's folder."""
    events: dict[str, list[dict[str, Any]]] = {}
    for line in _trace_lines(folder):
        event = json.loads(line) if line.strip() else None
        if event and event.get("task_id") in task_ids:
            events.setdefault(event["task_id"], []).append(event)
    return events


def failure_points(episodes: dict[str, dict[str, Any]], events: dict[str, list[dict[str, Any]]],
                   environment: Any, replan_budget: int) -> dict[str, int]:
    """Counts of :data:`FAILURE_POINTS` over the failed ones of an arm's scored ``episodes``
    (``events``: their traces; ``environment``: the condition's, for the gold calls of its tasks)."""
    failed = {t: r for t, r in episodes.items() if not r["success"]}
    counts = dict.fromkeys(FAILURE_POINTS, 0)
    # an environment whose checker judges calls without running them (BFCL's AST categories)
    judged = hasattr(environment, "check")
    for task_id, row in failed.items():
        accepts = functools.partial(bindings_accepted, environment, task_id) if judged else None
        counts[failure_point(events.get(task_id, []), row, environment.load_task(task_id).gold, replan_budget,
                             accepts)] += 1
    return counts


# -- first plans against the gold calls --------------------------------------------------------

def offered_tools(event: dict[str, Any]) -> list[str]:
    """The tools a Planner call was offered, in the order it saw them (the code family left out)."""
    from heart.families import CODE_CATEGORY
    from heart.roles.common import role_input
    from heart.roles.planner import shown_tools

    try:
        shown = shown_tools(role_input(event.get("messages") or []))
    except (StopIteration, ValueError, KeyError, AttributeError, TypeError):
        return []
    return [name for name, category in shown.items() if category != CODE_CATEGORY]


def first_plans(events: list[dict[str, Any]], gold_turns: list[list[Any]]) -> list[tuple[bool, bool]]:
    """Per turn with gold calls and a Planner call: (its first plan holds the gold calls' tools,
    each as many times as the gold calls do; so does the one-step rule: the first tool the
    Planner was offered, once). A measure that moves before whole episodes do, beside the
    trivial rule it must beat."""
    planner = [e for e in events if e.get("kind", "event") == "event" and e["role"] == "planner"]
    rows = []
    for turn, gold in enumerate(gold_turns):
        first = next((e for e in planner if e.get("turn") == turn), None)
        if first is None or not gold:
            continue
        wanted = sorted(call.name for call in gold)
        planned = sorted(plan_tools(first.get("parsed"), code_steps=False))
        rows.append((planned == wanted, offered_tools(first)[:1] == wanted))
    return rows


def plan_figures(episodes: dict[str, dict[str, Any]], events: dict[str, list[dict[str, Any]]],
                 environment: Any) -> dict[str, tuple[float, float]]:
    """Task id → (the share of its turns whose first plan holds the gold calls' tools, the
    one-step rule's share) over an arm's scored ``episodes`` (``events``: their traces)."""
    shares = {}
    for task_id in episodes:
        rows = first_plans(events.get(task_id, []), environment.load_task(task_id).gold)
        if rows:
            shares[task_id] = (sum(r[0] for r in rows) / len(rows), sum(r[1] for r in rows) / len(rows))
    return shares


# -- the report -------------------------------------------------------------------------------

def _episodes(folder: Path) -> dict[str, dict[str, Any]]:
    """Task id → its scored episode (seed 0) of an arm's folder; errored ones left out."""
    path = folder / EPISODES
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
    return {r["task_id"]: r for r in rows if not r.get("errored")}


def _estimate(values: list[float], seed: int = 0) -> dict[str, Any]:
    return asdict(bootstrap(np.asarray(values, dtype=float), seed=seed))


def build_report(config: BenchConfig, chunks: list[Chunk]) -> dict[str, Any]:
    """Figures from every finished chunk so far (see the module docstring)."""
    from heart.environments import load_environment
    from heart.settings import LoopConfig
    from heart_distill.eval.metrics import clarification_figures

    base = next((a for a in config.arms if a.roles == "base"), None)
    budget = LoopConfig(**config.loop).replan_budget
    conditions = []
    pooled: dict[str, dict[tuple[str, str], dict[str, Any]]] = {arm.name: {} for arm in config.arms}
    by_condition: dict[str, dict[str, dict[str, Any]]] = {arm.name: {} for arm in config.arms}
    for condition in config.conditions:
        mine = [c for c in chunks if c.condition is condition]
        done = [c for c in mine if (c.folder / STAMP).is_file()]
        stamps = [json.loads((c.folder / STAMP).read_text()) for c in done]
        environment = load_environment(condition.env, condition.category) if done else None  # once per condition
        arms = {}
        for arm in config.arms:
            # the chunks whose stamp holds this arm's command: an arm added later has fewer
            finished = [c for c, s in zip(done, stamps) if any(arm.name in label.split(",") for label in s["commands"])]
            episodes, events = {}, {}
            for c in finished:  # each folder's episodes and trace read once, for both measures below
                folder_episodes = _episodes(c.arm_folder(arm))
                episodes.update(folder_episodes)
                events.update(task_events(c.arm_folder(arm), folder_episodes))
            broke = failure_points(episodes, events, environment, budget)
            plans = plan_figures(episodes, events, environment)
            turns = {t: r for t, r in episodes.items() if "turns" in (r.get("checker") or {})}
            arms[arm.name] = {"tasks": len(episodes),
                              "success": _estimate([_success(r) for r in episodes.values()]),
                              # multi-turn BFCL: the share of an episode's turns the checker accepts
                              # before its first failing one, averaged over episodes
                              **({"per_turn_success": _estimate([_turn_share(r) for r in turns.values()])}
                                 if turns else {}),
                              # first plans against the gold calls, and the one-step rule on the same inputs
                              **({"first_plan_right": _estimate([v[0] for v in plans.values()]),
                                  "one_step_rule": _estimate([v[1] for v in plans.values()])} if plans else {}),
                              # multi-turn BFCL: did the Planner ask where a turn withholds a parameter
                              # (miss_param), and only there ({} where the environment records none)
                              **clarification_figures(list(episodes.values())),
                              "errored": sum(len(c.tasks) for c in finished) - len(episodes),
                              "failure_points": broke, "_episodes": episodes, "_turns": turns}
        multi_turn = any("per_turn_success" in figures for figures in arms.values())
        if base is not None:
            for arm in config.arms:
                if arm is not base:
                    arms[arm.name]["delta_vs_base"] = _paired(arms[arm.name]["_episodes"], arms[base.name]["_episodes"])
                    if multi_turn:  # the measure that moves before whole multi-turn tasks do, paired too
                        arms[arm.name]["per_turn_delta_vs_base"] = _paired(arms[arm.name]["_turns"],
                                                                           arms[base.name]["_turns"], _turn_share)
        contrasts = {f"{a} − {b}": _paired(arms[a]["_episodes"], arms[b]["_episodes"]) for a, b in config.contrasts}
        per_turn_contrasts = ({f"{a} − {b}": _paired(arms[a]["_turns"], arms[b]["_turns"], _turn_share)
                               for a, b in config.contrasts} if multi_turn else {})
        for name, figures in arms.items():
            episodes = figures.pop("_episodes")
            figures.pop("_turns")
            by_condition[name][condition.name] = episodes
            if condition.env == "bfcl" and condition.category in BFCL_SINGLE_TURN_CATEGORIES:
                pooled[name].update({(condition.name, t): r for t, r in episodes.items()})
        conditions.append({"name": condition.name, "env": condition.env, "category": condition.category,
                           "planned_tasks": sum(len(c.tasks) for c in mine),
                           "tasks_so_far": sum(len(c.tasks) for c in done),
                           "chunks": [{"index": c.index, "tasks": len(c.tasks), "wall_s": s["wall_s"],
                                       "finished_at": s["finished_at"], "calls": _calls(s)}
                                      for c, s in zip(done, stamps)],
                           "arms": arms, "contrasts": contrasts,
                           **({"per_turn_contrasts": per_turn_contrasts} if multi_turn else {})})
    single_turn = {name: {"tasks": len(episodes), "success": _estimate([_success(r) for r in episodes.values()])}
                   for name, episodes in pooled.items()}
    if base is not None:
        for arm in config.arms:
            if arm is not base:
                single_turn[arm.name]["delta_vs_base"] = _paired(pooled[arm.name], pooled[base.name])
    pooled_contrasts = {f"{a} − {b}": _paired(pooled[a], pooled[b]) for a, b in config.contrasts}
    return {"recipe": asdict(config), "conditions": conditions, "single_turn": single_turn,
            "single_turn_contrasts": pooled_contrasts,
            "seeds": seed_figures(config, by_condition) if base is not None else {},
            "compute_s": sum(ch["wall_s"] for c in conditions for ch in c["chunks"])}


def _calls(stamp: dict[str, Any]) -> list[dict[str, Any]]:
    """A chunk's commands, each one call of ``heart eval e2e`` (the base beside the first adapter set,
    every other arm alone, an arm added later in a later session): the unit the 60-minute bound
    is for, so the report names the longest, not only the chunk's sum."""
    timed = [{"arms": label, "wall_s": c["wall_s"], "finished_at": c.get("finished_at")}
             for label, c in stamp["commands"].items() if c.get("wall_s") is not None]
    # stamps written before calls were timed one by one hold only the chunk's sum: what the timed
    # calls leave of it is those untimed calls' time together
    untimed = [label for label, c in stamp["commands"].items() if c.get("wall_s") is None]
    if untimed:
        rest = round(stamp["wall_s"] - sum(c["wall_s"] for c in timed), 1)
        timed.insert(0, {"arms": " and ".join(untimed) + (" together" if len(untimed) > 1 else ""),
                         "wall_s": rest, "finished_at": None})
    return timed


def seed_figures(config: BenchConfig, by_condition: dict[str, dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """Per group of distillation seeds (an arm and the arms ``seed_of`` it): each seed's lift
    over the base in points, paired on the tasks both scored, on every condition all of the
    group's seeds have finished tasks in; Lift_s pools those tasks. MeanLift, RR0 and
    RelLift95 (the 5th percentile of one seed's lift: no gate statistic chooses among seeds)
    over the Lift_s; WorstLift the smallest condition mean (:mod:`heart_distill.eval.stats`)."""
    from heart_distill.eval.stats import mean_lift, rel_lift95, rr0, worst_lift

    base = next(a for a in config.arms if a.roles == "base").name
    groups = {}
    for head in (a for a in config.arms if a.seed_of is None):
        members = [head.name, *(a.name for a in config.arms if a.seed_of == head.name)]
        if len(members) < 2:
            continue
        shared = [c.name for c in config.conditions if all(by_condition[m].get(c.name) for m in members)]
        if not shared:
            continue
        def pooled(arm: str) -> dict[tuple[str, str], dict[str, Any]]:
            return {(c, t): r for c in shared for t, r in by_condition[arm][c].items()}

        per_seed, per_condition, pooled_base = [], {c: [] for c in shared}, pooled(base)
        for member in members:
            value, tasks = _lift(pooled(member), pooled_base)
            per_seed.append({"arm": member, "lift": value, "tasks": tasks})
            for c in shared:
                per_condition[c].append(_lift(by_condition[member][c], by_condition[base][c])[0])
        values = [p["lift"] for p in per_seed]
        worst, where = worst_lift(per_condition)
        groups[head.name] = {"conditions": shared, "per_seed": per_seed, "mean_lift": mean_lift(values),
                             "worst_lift": worst, "worst_condition": where, "rr0": rr0(values),
                             "rel_lift95": rel_lift95(np.zeros(len(values)), values, runs_per_draw=1)}
    return groups


def _success(episode: dict[str, Any]) -> float:
    return float(bool(episode["success"]))


def _turn_share(episode: dict[str, Any]) -> float:
    """Multi-turn BFCL: the share of the episode's turns the checker accepts before its first failing one."""
    return episode["checker"]["turns_passed"] / episode["checker"]["turns"]


def _paired_values(mine: dict[Any, dict[str, Any]], base: dict[Any, dict[str, Any]],
                   measure: Callable[[dict[str, Any]], float] = _success) -> tuple[np.ndarray, np.ndarray]:
    """``measure`` of ``mine``'s and of ``base``'s episodes on the tasks both scored, in one order."""
    shared = sorted(set(mine) & set(base))
    return np.array([measure(mine[t]) for t in shared]), np.array([measure(base[t]) for t in shared])


def _lift(mine: dict[Any, dict[str, Any]], base: dict[Any, dict[str, Any]]) -> tuple[float, int]:
    """Lift in points of ``mine`` over ``base`` on the tasks both scored, and their number."""
    from heart_distill.eval.stats import lifts

    mine_success, base_success = _paired_values(mine, base)
    return float(lifts(mine_success[None, :], base_success)[0]), len(base_success)


def _paired(mine: dict[Any, dict[str, Any]], base: dict[Any, dict[str, Any]],
            measure: Callable[[dict[str, Any]], float] = _success) -> dict[str, Any]:
    """``measure`` (success by default) of ``mine`` minus the base's on the tasks both scored, with its interval."""
    mine_values, base_values = _paired_values(mine, base, measure)
    return _estimate(list(mine_values - base_values))


def _pct(estimate: dict[str, Any]) -> str:
    if estimate.get("value") is None:
        return "–"
    low, high = estimate.get("low"), estimate.get("high")
    interval = f" [{100 * low:.1f}, {100 * high:.1f}]" if low is not None else ""
    return f"{100 * estimate['value']:.1f}{interval}"


def render_report(report: dict[str, Any], stamp: dict[str, Any]) -> str:
    arms = [a["name"] for a in report["recipe"]["arms"]]
    compared = [a["name"] for a in report["recipe"]["arms"] if a["roles"] != "base"]
    if len(compared) == len(arms):  # no base arm: nothing to pair with
        compared = []
    lines = ["# Whole-loop benchmark (held-out test tasks)", "",
             f"- command: `{stamp['command']}`", f"- commit: {stamp['commit']} (dirty: {stamp['dirty']})",
             f"- date: {stamp['date']}", f"- machine: {json.dumps(stamp['machine'])}",
             f"- engine: {report['recipe']['engine']}, loop: {json.dumps(report['recipe']['loop'])}",
             f"- compute so far: {report['compute_s'] / 60:.1f} min of chunks", "",
             "Success in percent with a bootstrap 95% interval over tasks; Δ: paired difference over the "
             "base on the same tasks, in points. At a few dozen tasks an interval that spans 0 decides nothing.",
             "", "| condition | tasks so far | " + " | ".join(arms) + " |" +
             "".join(f" Δ {a} − base |" for a in compared),
             "|---|---:|" + "---:|" * (len(arms) + len(compared))]
    for c in report["conditions"]:
        cells = [_pct(c["arms"][a]["success"]) + f" (n={c['arms'][a]['tasks']})" for a in arms]
        deltas = [_pct(c["arms"][a].get("delta_vs_base", {})) for a in compared]
        lines.append(f"| {c['name']} | {c['tasks_so_far']} of {c['planned_tasks']} | " + " | ".join(cells) + " |"
                     + "".join(f" {d} |" for d in deltas))
    pooled = report.get("single_turn") or {}
    has_pooled = any(pooled.get(a, {}).get("tasks") for a in arms)
    if has_pooled:
        cells = [_pct(pooled[a]["success"]) + f" (n={pooled[a]['tasks']})" for a in arms]
        deltas = [_pct(pooled[a].get("delta_vs_base", {})) for a in compared]
        lines.append("| **BFCL single-turn, pooled** | " + str(pooled[arms[0]]["tasks"]) + " | " + " | ".join(cells)
                     + " |" + "".join(f" {d} |" for d in deltas))
    contrasts = list(report.get("single_turn_contrasts") or {})
    if contrasts:
        lines += ["", "Paired contrasts between arms (points, on the tasks both scored):", "",
                  "| condition | " + " | ".join(contrasts) + " |", "|---|" + "---:|" * len(contrasts)]
        lines += [f"| {c['name']} | " + " | ".join(_pct(c["contrasts"][k]) for k in contrasts) + " |"
                  for c in report["conditions"] if c["tasks_so_far"]]
        if has_pooled:
            lines.append("| **BFCL single-turn, pooled** | "
                         + " | ".join(_pct(report["single_turn_contrasts"][k]) for k in contrasts) + " |")
    multi_turn = [c for c in report["conditions"] if any("per_turn_success" in c["arms"][a] for a in arms)]
    if multi_turn:
        # an arm the recipe limits to other conditions gets no column here
        ran = [a for a in arms if any("per_turn_success" in c["arms"][a] for c in multi_turn)]
        ran_compared = [a for a in compared if a in ran]
        per_turn_contrasts = [f"{a} − {b}" for a, b in report["recipe"]["contrasts"] if a in ran and b in ran]
        lines += ["", "Multi-turn BFCL, per-turn success (the share of an episode's turns BFCL's checker accepts "
                  "before its first failing turn, in percent; Δ: paired on the same tasks, in points):", "",
                  "| condition | " + " | ".join(ran) + " |" + "".join(f" Δ {a} − base |" for a in ran_compared)
                  + "".join(f" {k} |" for k in per_turn_contrasts),
                  "|---|" + "---:|" * (len(ran) + len(ran_compared) + len(per_turn_contrasts))]
        for c in multi_turn:
            cells = ([_pct(c["arms"][a].get("per_turn_success", {})) for a in ran]
                     + [_pct(c["arms"][a].get("per_turn_delta_vs_base", {})) for a in ran_compared]
                     + [_pct(c.get("per_turn_contrasts", {}).get(k, {})) for k in per_turn_contrasts])
            lines.append(f"| {c['name']} | " + " | ".join(cells) + " |")
    planned = [c for c in report["conditions"] if any("first_plan_right" in c["arms"][a] for a in arms)]
    if planned:
        lines += ["", "First plans against the gold calls (percent of an episode's turns, averaged over episodes: "
                  "the turn's first plan holds the gold calls' tools, each as often as the gold calls do), beside "
                  "the one-step rule (the first tool the Planner is offered, once) on the first arm's inputs: a "
                  "measure that moves before whole tasks do:", "",
                  "| condition | one-step rule | " + " | ".join(arms) + " |", "|---|---:|" + "---:|" * len(arms)]
        for c in planned:
            rule = next(c["arms"][a]["one_step_rule"] for a in arms if "one_step_rule" in c["arms"][a])
            lines.append(f"| {c['name']} | {_pct(rule)} | "
                         + " | ".join(_pct(c["arms"][a].get("first_plan_right", {})) for a in arms) + " |")
    asking = [c for c in report["conditions"]
              if any((c["arms"][a].get("clarification_recall") or {}).get("value") is not None for a in arms)]
    if asking:
        # questions asked and needed per task beside the rates: asking in every turn reaches full recall
        lines += ["", "Clarifications (multi-turn BFCL; miss_param withholds a parameter in some turns): recall, "
                  "the turns needing a question where the Planner asked, and precision, the turns it asked that "
                  "needed one, in percent over turns with an interval over tasks; asked / needed: questions per "
                  "task:", "",
                  "| condition | arm | recall | precision | asked / needed |", "|---|---|---:|---:|---:|"]
        for c in asking:
            for a in (a for a in arms if "clarification_recall" in c["arms"][a]):  # the arms that ran it
                f = c["arms"][a]
                lines.append(f"| {c['name']} | {a} | {_pct(f['clarification_recall'])} | "
                             f"{_pct(f['clarification_precision'])} | {f['clarifications_asked_per_task']['value']:.2f}"
                             f" / {f['clarifications_needed_per_task']['value']:.2f} |")
    lines += ["", "Where the failed episodes broke (counts; `heart_distill.eval.bench_e2e.FAILURE_POINTS`: the "
              "first of these in the loop's order that an episode's trace shows):", "",
              "| condition | arm | failed | " + " | ".join(FAILURE_POINTS) + " |",
              "|---|---|---:|" + "---:|" * len(FAILURE_POINTS)]
    for c in report["conditions"]:
        for a in (a for a in arms if c["arms"][a]["tasks"]):  # an arm that ran none of it: no row
            broke = c["arms"][a]["failure_points"]
            lines.append(f"| {c['name']} | {a} | {sum(broke.values())} | "
                         + " | ".join(str(broke[p]) for p in FAILURE_POINTS) + " |")
    for head, group in (report.get("seeds") or {}).items():
        seeds = len(group["per_seed"])
        lines += ["", f"Distillation seeds of `{head}` ({seeds} adapter sets; lift over the base in points, paired on "
                  f"the tasks both scored, over {', '.join(group['conditions'])}):", "",
                  "| arm | Lift_s | tasks |", "|---|---:|---:|"]
        lines += [f"| {p['arm']} | {p['lift']:+.1f} | {p['tasks']} |" for p in group["per_seed"]]
        lines += ["", f"MeanLift {group['mean_lift']:+.1f} · WorstLift {group['worst_lift']:+.1f} "
                  f"({group['worst_condition']}) · RR0 {100 * group['rr0']:.0f}% · RelLift95 {group['rel_lift95']:+.1f}"
                  + (f" — with fewer than {DECISIVE_RUNS} seeds a 5th percentile is the smallest lift or near "
                     "it: it decides nothing" if seeds < DECISIVE_RUNS else "")]
    lines += ["", "Chunks (wall time of each chunk's calls summed: one call per arm, or the base beside the first "
              "adapter set, an arm added later in a later session; the longest call is the one bounded by 60 "
              "minutes):", ""]
    for c in report["conditions"]:
        for ch in c["chunks"]:
            calls = ch.get("calls", [])
            longest = max(calls, key=lambda call: call["wall_s"], default=None)
            split = (f" in {len(calls)} calls, the longest {longest['wall_s'] / 60:.1f} min ({longest['arms']})"
                     if len(calls) > 1 else "")
            lines.append(f"- {c['name']} chunk {ch['index']}: {ch['tasks']} tasks, {ch['wall_s'] / 60:.1f} min{split} "
                         f"(finished {ch['finished_at']})")
    return "\n".join(lines) + "\n"


def write_report(config: BenchConfig, chunks: list[Chunk], argv: list[str]) -> Path:
    from heart_distill.eval.provenance import stamp, write_stamped_json

    import shlex

    # the ledger's own files change from chunk to chunk of one call: they do not make it dirty
    run_stamp = {**stamp(argv, outside=[config.out]), "command": shlex.join(["heart", *argv])}
    report = build_report(config, chunks)
    write_stamped_json(Path(config.out) / REPORT_JSON, report, run_stamp)
    publish_text(Path(config.out) / REPORT_MD, render_report(report, run_stamp))
    return Path(config.out) / REPORT_MD


def main(argv: list[str], full_argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="heart eval bench", description=__doc__.split("\n")[0])
    parser.add_argument("--recipe", required=True)
    parser.add_argument("--max-chunks", type=int, default=1, help="chunks run in this call (default 1)")
    parser.add_argument("--max-calls", type=int, default=None,
                        help="at most this many `heart eval e2e` calls (one arm each, or the base beside the "
                             "first adapter set), a chunk left part done for the next call: a call bounded in "
                             "time where a chunk's arms together are not")
    parser.add_argument("--report-only", action="store_true", help="recompute the report; run nothing")
    args = parser.parse_args(argv)
    try:
        config = load_bench(args.recipe)
        chunks = plan_chunks(config)
    except (RecipeError, ValueError) as err:
        print(f"heart eval bench: error: {err}", file=sys.stderr)
        return 2
    if args.max_calls is not None and args.max_calls < 1:
        print(f"heart eval bench: error: --max-calls must be at least 1, not {args.max_calls}", file=sys.stderr)
        return 2
    ran, calls_left = 0, args.max_calls
    for chunk in chunks:
        if args.report_only or ran >= args.max_chunks or calls_left == 0:
            break
        if chunk_state(config, chunk) == "done":
            continue
        print(f"bench: {chunk.condition.name} chunk {chunk.index}: {len(chunk.tasks)} tasks, "
              f"{len(config.arms)} arms", flush=True)
        try:
            wall_s, calls = run_chunk(config, chunk, calls_left)
        except subprocess.CalledProcessError as err:
            print(f"heart eval bench: error: an arm of {chunk.folder} failed (exit {err.returncode}); "
                  f"its finished episodes are kept and the next call continues it", file=sys.stderr)
            write_report(config, chunks, full_argv or ["eval", "bench", *argv])
            return 1
        calls_left = None if calls_left is None else calls_left - calls
        if chunk_state(config, chunk) != "done":  # the calls ran out inside it
            print(f"bench: {chunk.folder}: {calls} call(s) in {wall_s / 60:.1f} min, the rest left for the next call",
                  flush=True)
            break
        ran += 1
        write_report(config, chunks, full_argv or ["eval", "bench", *argv])  # after every chunk
        print(f"bench: {chunk.folder} done in {wall_s / 60:.1f} min", flush=True)
    left = sum(chunk_state(config, c) != "done" for c in chunks)
    path = write_report(config, chunks, full_argv or ["eval", "bench", *argv])
    print(f"bench: {ran} chunk(s) run, {left} of {len(chunks)} left; report: {path}")
    return 0
