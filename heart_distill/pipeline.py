"""The whole distillation as one command: collect → role datasets → four adapters → held-out
role inputs → per-role and end-to-end evaluation, base vs distilled → report.

    heart pipeline --recipe recipes/smollm2-135m/pipeline.yaml                 every stage, in order
    heart pipeline --recipe recipes/smollm2-135m/pipeline.yaml --until train   collect, datasets, train
    heart pipeline --recipe recipes/smollm2-135m/pipeline.yaml --stage eval_roles   one stage alone

Each stage runs existing CLI commands in subprocesses (``heart collect``, ``heart datasets
build``, ``heart train``, ``python -m heart_distill.eval.heldout``, ``heart eval roles|e2e``, ``heart
report``), so this module imports neither ``train`` nor ``eval`` (recipes are read with
:mod:`heart_distill.recipes`, as training reads them). Every stage is
content-addressed: its key is a hash of its commands and of the bytes of its inputs (the
upstream stage's outputs, the training recipes, the base model's manifest). A stage whose
stamp (``<run_dir>/stamps/<stage>.json``) holds the same key, and whose outputs still have
the fingerprint recorded there, is skipped with a line saying so; otherwise its outputs are
removed and it runs again from scratch, unless a run of it under the same key was interrupted
(``<run_dir>/stamps/<stage>.started.json`` and no stamp) and the stage knows how to continue
(collect, train, collect_test, eval_e2e: ``Stage.resume``): then it continues over the outputs it left.
Per-stage wall times go to ``<run_dir>/pipeline.json``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Callable, Literal

from pydantic import Field

from heart import ROLES
from heart.environments import BFCL_CATEGORIES, ENVIRONMENTS
from heart.environments.splits import SPLITS_VERSION
from heart.roles import FORMATS_VERSION
from heart.settings import POLICY
from heart.atomic import publish_text
from heart.runtime.engines import ENGINE_SPECS
from heart_distill.arguments import loop_flags
from heart_distill.recipes import RecipeError, Role, load_roles, read_yaml, validate_sections
from heart_distill.library_cli import ENGINE_CHOICES as LIBRARY_ENGINES

Env = Literal[ENVIRONMENTS]
BFCLCategory = Literal[BFCL_CATEGORIES]
EngineSpec = Literal[ENGINE_SPECS]  # type: ignore[valid-type]  (a tuple subscript: one Literal of each)
STAMP_VERSION = 1


STAGE_ENV = {**os.environ, "PYTHONHASHSEED": os.environ.get("PYTHONHASHSEED", "0")}
"""Stages run with a fixed hash seed: BFCL's error texts print Python sets, whose order
follows it, and a content-addressed stage must produce the same bytes from the same inputs."""


def stage_env(run: Path, processes: int = 1) -> dict[str, str]:
    """:data:`STAGE_ENV`, with llama.cpp's and the converters' output going to the run folder's
    ``heart.log`` (unless ``HEART_LOG_FILE`` names another), which the pipeline names once.
    One of ``processes`` commands running at once gets its share of the cores for its
    llama.cpp engines (:data:`heart.runtime.llamacpp_threads.THREADS_ENV`, unless already set)."""
    from heart.runtime import llamacpp_log, llamacpp_threads

    env = dict(STAGE_ENV)
    if processes > 1:
        env.setdefault(llamacpp_threads.THREADS_ENV, str(max(1, len(os.sched_getaffinity(0)) // processes)))
    env.setdefault(llamacpp_log.LOG_FILE_ENV, str((run / "heart.log").resolve()))
    env[llamacpp_log.NAMED_ENV] = env[llamacpp_log.LOG_FILE_ENV]
    return env


class PipelineError(ValueError):
    """A pipeline recipe or invocation that cannot run; the message names what is wrong."""


@dataclass
class CollectConfig:
    envs: list[Env] = field(default_factory=lambda: ["bfcl", "agentdojo"])
    """Environments whose train split the teacher runs over."""
    bfcl_categories: list[BFCLCategory] = field(default_factory=lambda: ["multi_turn_base"])
    """BFCL's categories collected (``heart collect --category``): multi-turn, and the
    single-turn ones whose answers hold several calls (parallel, parallel_multiple) or one
    call chosen among similar tools (multiple) — distinct multi-step plans for the Planner."""
    teacher: str = "gold"
    """Teacher: gold (gold-guided, offline), openai:<url>#<model> (vLLM or any API), or hf:<model>."""
    fault_rate: Annotated[float, Field(ge=0, le=1)] = 0.3
    """Share of gold-teacher role calls with an injected fault (gives the Verifier FAIL labels)."""
    limit: Annotated[int, Field(ge=0)] = 0
    """First N train tasks per environment (0 = the whole train split)."""
    seeds: list[int] = field(default_factory=lambda: [0])
    """One episode per task per seed."""
    concurrency: Annotated[int, Field(gt=0)] = 8
    """Episodes run at once."""
    student: str | None = None
    """A model whose Primitive answers some steps in both collections (``heart collect
    --student``: ``base`` or an adapters folder): its real mistakes, executed and judged, are
    the Verifier's natural FAILs beside the injected ones. None: injected faults only."""
    student_rate: Annotated[float, Field(ge=0, le=1)] = 0.0
    """Chance that a Primitive step, in a turn with no fault yet, is the student's."""


@dataclass
class HeldoutConfig:
    envs: list[Env] = field(default_factory=lambda: ["bfcl", "agentdojo"])
    """Environments whose test split gives the held-out role inputs."""
    bfcl_categories: list[BFCLCategory] = field(default_factory=lambda: ["multi_turn_base"])
    """BFCL's categories whose test split gives held-out role inputs."""
    fault_rate: Annotated[float, Field(ge=0, le=1)] = 0.3
    """Fault rate of the test collection (held-out Verifier inputs need FAIL cases too)."""
    limit: Annotated[int, Field(ge=0)] = 20
    """First N test tasks per environment (0 = the whole test split)."""


@dataclass
class TrainConfig:
    recipe: str = "roles.yaml"
    """roles.yaml of the per-role recipes, relative to the pipeline YAML's folder."""
    roles: list[Role] = field(default_factory=lambda: list(ROLES))
    """Roles to distil (one adapter each)."""
    overrides: list[str] = field(default_factory=list)
    """section.key=value overrides applied to every role's recipe (data and output dirs are set by the pipeline)."""


@dataclass
class E2ERun:
    env: Env = "bfcl"
    """Environment whose test split is run end to end."""
    category: BFCLCategory | None = None
    """BFCL's category (None: multi_turn_base)."""
    concurrency: Annotated[int, Field(gt=0)] | None = None
    """Episodes in flight per side (None: the engine's default, ``eval.e2e.EPISODES_IN_FLIGHT``)."""
    limit: Annotated[int, Field(ge=0)] = 2
    """Test tasks run end to end, per side (base and distilled; 0 = the whole test split)."""
    loop: dict[str, Any] = field(default_factory=dict)
    """The loop's settings for these episodes, by :class:`heart.settings.LoopConfig` field name
    (``{max_plan_steps: 4, router_mode: step}``), over the loop's defaults; passed to
    `heart eval e2e` as the flags they derive (:func:`heart_distill.arguments.loop_flags`)."""
    args: list[str] = field(default_factory=list)
    """Other arguments for `heart eval e2e` (``--max-new-tokens 256``)."""
    name: str = ""
    """Suffix of its result folders (eval/e2e-NAME-base, eval/e2e-NAME-distilled); default: none
    for the first run, the environment's name for the others."""


@dataclass
class AttackConfig:
    pairs: Annotated[int, Field(ge=0)] = 0
    """Distinct AgentDojo (user task, injection task) pairs attacked, base and distilled roles
    alike (``bench/injection.py``: agentdojo's own attack API); 0 = no attack stage."""
    suites: list[Literal["workspace", "travel", "banking", "slack"]] = field(
        default_factory=lambda: ["workspace", "travel", "banking", "slack"])
    """AgentDojo suites the pairs' user tasks are drawn from, in turn, from their test split
    only (one suite's test split holds 6-11 user tasks)."""
    concurrency: Annotated[int, Field(gt=0)] = 8
    """Episodes in flight on the one engine (``eval.e2e_engine``, else ``eval.engine``)."""
    args: list[str] = field(default_factory=list)
    """Extra arguments for ``bench/injection.py`` (e.g. --attack tool_knowledge, --router-mode step)."""


@dataclass
class EvalConfig:
    engine: EngineSpec = "peft"
    """In-process engine of the evaluations (base and distilled alike): peft, or llamacpp
    (GGUF on a CPU; the same greedy answers up to arithmetic order, faster here), with its base
    weights' precision if not f32 (``llamacpp:f16``)."""
    e2e_engine: EngineSpec | None = None
    """Engine of the end-to-end evaluation when it differs from ``engine`` (None: ``engine``)."""
    roles_limit: Annotated[int, Field(ge=0)] = 16
    """Held-out rows per role for the per-role evaluation (0 = all)."""
    roles_args: list[str] = field(default_factory=list)
    """Extra arguments for `heart eval roles` (e.g. --batch-size 8)."""
    e2e: list[E2ERun] = field(default_factory=lambda: [E2ERun()])
    """End-to-end runs, one `heart eval e2e` each (both sides at once), run one after another."""
    attack: AttackConfig = field(default_factory=AttackConfig)
    """Utility under attack and attack success on AgentDojo, base and distilled."""


@dataclass
class ExecutorConfig:
    kind: Literal["local", "ray"] = "local"
    """Where the collect, collect_test and eval_e2e stages run their episodes: local (threads
    in one process) or ray (Ray Data actors on a Ray cluster; docs/scaling.md)."""
    address: str | None = None
    """Ray cluster address (None: RAY_ADDRESS, else the cluster `ray start` began on this machine)."""
    workers: Annotated[int, Field(gt=0)] = 2
    """Ray worker actors per command."""
    shard_size: Annotated[int, Field(gt=0)] = 16
    """Episodes per Ray shard."""

    def arguments(self) -> list[str]:
        """The command-line options that say so; none for local (the stages' keys stay as they were)."""
        if self.kind == "local":
            return []
        return ["--executor", "ray", *(["--ray-address", self.address] if self.address else []),
                "--workers", str(self.workers), "--shard-size", str(self.shard_size)]


@dataclass
class LibraryConfig:
    roles: list[Role] = field(default_factory=list)
    """Roles whose trained adapter goes before the run's library (``<run_dir>/library``,
    ``heart library adapter``): validated against the library's incumbent for the role (else
    the bare base) on the role datasets' validation rows, and admitted only by the library's
    rule. Empty: no library stage."""
    rows: Annotated[int, Field(gt=0)] = 24
    """Gate rows per role (the datasets' validation split: tasks disjoint from training)."""


@dataclass
class PipelineConfig:
    run_dir: str = "runs/pipeline"
    """Folder of everything the pipeline writes (relative to the working directory)."""
    model: str = "smollm2-135m"
    """Base model of the training recipes (its manifest is an input of the train stage)."""
    loop: dict[str, Any] = field(default_factory=dict)
    """The loop's settings for every stage that runs episodes, by
    :class:`heart.settings.LoopConfig` field name (``{router_mode: step, planner_form:
    subgoals}``): both collections take its policy settings (:data:`heart.settings.POLICY`),
    so the datasets, and the adapters trained on them, learn those modes' inputs; every
    end-to-end run takes all of them, its own ``loop:`` over them."""
    tasks: str | None = None
    """The tasks file of the environment ``custom`` (your own tools: docs/your-tools.md), read
    by every stage whose ``envs`` or ``env`` names it; its tasks are split by id."""
    tools: str | None = None
    """The tools of ``custom``: a Python module or .py file of typed functions,
    ``mcp:COMMAND ARGS`` (a stdio MCP server per episode), or an http(s) MCP server URL."""
    collect: CollectConfig = field(default_factory=CollectConfig)
    datasets: dict[str, Any] = field(default_factory=dict)
    """How traces become role datasets, by :class:`heart_distill.data.build.BuildOptions`
    field name (``{verifier_balance: 1.0, relevance_balance: 3.0, validation_fraction: 0.1,
    seed: 0}``), over its defaults; passed to ``heart datasets build`` as the flags they derive."""
    heldout: HeldoutConfig = field(default_factory=HeldoutConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    executor: ExecutorConfig = field(default_factory=ExecutorConfig)
    library: LibraryConfig = field(default_factory=LibraryConfig)


def load_pipeline(path: str | Path) -> tuple[PipelineConfig, Path]:
    """(config, folder of the YAML); fails naming the field for unknown keys and bad values."""
    path = Path(path)
    try:
        data = read_yaml(path, "pipeline recipe") or {}
    except RecipeError as err:
        raise PipelineError(str(err)) from None
    if isinstance(data, dict) and "router_mode" in (data.get("collect") or {}):
        raise PipelineError(f"{path}: collect.router_mode is now a setting of the recipe's loop: section, read by "
                            f"every stage that runs episodes (loop: {{router_mode: "
                            f"{data['collect']['router_mode']}}})")
    config = validate_sections(data, PipelineConfig, str(path), PipelineError, "pipeline recipe")
    try:
        loop_flags(config.loop)
    except (TypeError, ValueError) as err:
        raise PipelineError(f"{path}: loop: {err}") from None
    from heart_distill.data.build import build_flags  # (the CLI's parser imports this module, not data/)

    try:
        build_flags(config.datasets)
    except (TypeError, ValueError) as err:
        raise PipelineError(f"{path}: datasets: {err}") from None
    for index, run_spec in enumerate(config.eval.e2e):
        if run_spec.category is not None and run_spec.env != "bfcl":
            raise PipelineError(f"{path}: eval.e2e.{index}.category applies to bfcl only, not {run_spec.env!r}")
        try:
            loop_flags(run_spec.loop)
        except (TypeError, ValueError) as err:
            raise PipelineError(f"{path}: eval.e2e.{index}.loop: {err}") from None
    named = {*config.collect.envs, *config.heldout.envs, *(run_spec.env for run_spec in config.eval.e2e)}
    if "custom" in named and not (config.tasks and config.tools):
        raise PipelineError(f"{path}: the environment custom needs the recipe's tasks: (a tasks file) and tools: "
                            "(a Python module or .py file, mcp:COMMAND ARGS, or an MCP server URL)")
    if "custom" not in named and (config.tasks or config.tools):
        raise PipelineError(f"{path}: tasks: and tools: are read by the environment custom only, which no "
                            "collect.envs, heldout.envs or eval.e2e env names")
    if config.tasks and not Path(config.tasks).is_file():
        raise PipelineError(f"{path}: tasks: {config.tasks} is not a file (relative to the working directory)")
    c = config.collect
    if bool(c.student) != bool(c.student_rate):
        raise PipelineError(f"{path}: collect.student and collect.student_rate go together (got student "
                            f"{c.student!r}, student_rate {c.student_rate}): a student needs a rate above 0")
    if c.student and c.teacher != "gold":
        raise PipelineError(f"{path}: collect.student applies to the gold teacher only, not to {c.teacher!r}")
    if c.student and c.student != "base" and not Path(c.student).is_dir():
        raise PipelineError(f"{path}: collect.student must be 'base' or an adapters folder (relative to the "
                            f"working directory), got {c.student!r}")
    if config.library.roles and config.eval.engine not in LIBRARY_ENGINES:
        raise PipelineError(f"{path}: library.roles needs eval.engine one of {', '.join(LIBRARY_ENGINES)} "
                            f"(heart library adapter), got {config.eval.engine!r}")
    return config, path.parent


@dataclass
class Stage:
    name: str
    commands: list[list[str]]
    """Command lines, as a user types them (`heart ...`, `python -m ...`): they are what the key hashes."""
    inputs: list[Path]
    """Files and folders whose bytes the stage reads (their fingerprints enter the key)."""
    outputs: list[Path]
    """Folders the stage writes (removed before it reruns; fingerprinted into the stamp)."""
    concurrent: bool = False
    """Run the commands at once: independent jobs whose outputs do not depend on their order
    (one collection per environment: each writes its own trace shard, the manifest is locked,
    and datasets are built in a canonical order). Collections are mostly one Python thread
    each, so two of them on 2 cores took 19 s where one after the other took 36 s."""
    resume: Callable[[], list[list[str]]] | None = None
    """How an interrupted run of these commands continues over the outputs it left: the
    command lines to run instead, computed when it continues (None: it starts over). Not part
    of the key: a continued run must finish with what an uninterrupted one would have made."""


def _collections(envs: list[str], bfcl_categories: list[str], config: PipelineConfig) -> list[tuple[str, list[str]]]:
    """(environment, its ``--category`` or ``--tasks``/``--tools`` flags) of each collection:
    one per BFCL category (the default category without a flag, so its command line is what
    it always was)."""
    return [(env, _environment_flags(env, category, config))
            for env in envs for category in (bfcl_categories if env == "bfcl" else [None])]


def _environment_flags(env: str, category: str | None, config: PipelineConfig) -> list[str]:
    """What says which tasks and tools an environment's command runs over."""
    if env == "custom":
        return ["--tasks", str(config.tasks), "--tools", str(config.tools)]
    return [] if category in (None, "multi_turn_base") else ["--category", category]


def _custom_inputs(config: PipelineConfig) -> list[Path]:
    """The files of the environment ``custom`` whose bytes its stages read: the tasks file, the
    tools when they are a .py file (a server is not a file: its own version is its own), and
    the files the tasks' ``setup`` commands name (a script that builds the initial state)."""
    if not config.tasks:
        return []
    from heart.environments.custom import load_tasks

    folder = Path(config.tasks).parent  # (relative as the recipe gives it: keys stay the same in any clone)
    setup_files = sorted({folder / word for task in load_tasks(config.tasks) for word in task.meta.get("setup", [])[1:]
                          if (folder / word).is_file()})
    return [Path(config.tasks), *([Path(config.tools)] if config.tools and Path(config.tools).is_file() else []),
            *setup_files]


def stages(config: PipelineConfig, recipe_dir: Path) -> list[Stage]:
    from heart_distill.data.build import build_flags

    run = Path(config.run_dir)
    c, h, t, e = config.collect, config.heldout, config.train, config.eval
    faults = ["--fault-rate", str(c.fault_rate)] if c.fault_rate else []  # a gold-teacher option only
    # the collections' policy settings: the Router's mode, the Planner's form, ... (heart collect's flags)
    mode = loop_flags({k: v for k, v in config.loop.items() if k in POLICY})
    student = (["--student", c.student, "--student-rate", str(c.student_rate), "--student-engine", e.engine]
               if c.student and c.student_rate else [])  # (a gold-teacher option, like the faults)
    executor = config.executor.arguments()
    collect = [["heart", "collect", "--env", env, *category, "--split", "train", "--teacher", c.teacher, *faults,
                "--seeds", *map(str, c.seeds), "--concurrency", str(c.concurrency), *mode, *student,
                "--out", str(run / "collect"), *(["--limit", str(c.limit)] if c.limit else []), *executor]
               for env, category in _collections(c.envs, c.bfcl_categories, config)]
    roles_yaml = recipe_dir / t.recipe
    recipe_files = _recipe_files(roles_yaml, t.roles)
    # every role in one training process ({role} is each role's name): one start-up, not four
    train = [["heart", "train", "--recipe", str(roles_yaml), "--roles", ",".join(t.roles),
              f"data.dataset_dir={run / 'datasets' / '{role}'}", f"output.dir={run / 'adapters' / '{role}'}",
              "output.overwrite=true", *t.overrides]]
    test_faults = ["--fault-rate", str(h.fault_rate)] if h.fault_rate else []
    collect_test = [["heart", "collect", "--env", env, *category, "--split", "test", "--teacher", c.teacher,
                     *test_faults, "--concurrency", str(c.concurrency), *mode, *student,
                     "--out", str(run / "collect-test"), *(["--limit", str(h.limit)] if h.limit else []), *executor]
                    for env, category in _collections(h.envs, h.bfcl_categories, config)]
    limit = ["--limit", str(e.roles_limit)] if e.roles_limit else []
    base = ["--model", config.model]  # the unadapted side names its model; adapters' manifests name theirs
    # each evaluation runs both sides in one process: they share the model and decode in one batch
    engine = ["--engine", e.engine]
    e2e_engine = ["--engine", e.e2e_engine or e.engine]
    eval_roles = [["heart", "eval", "roles", "--data", str(run / "heldout"), "--split", "test", "--adapters",
                   str(run / "adapters"), *base, *engine, "--only", ",".join(t.roles), *limit, *e.roles_args,
                   "--out", str(run / "eval" / "roles-distilled"), "--base-out", str(run / "eval" / "roles-base")]]
    eval_e2e = []
    for index, run_spec in enumerate(e.e2e):
        name = run_spec.name or ("" if index == 0 else run_spec.env)
        folder = run / "eval" / ("e2e-" + name + "-" if name else "e2e-")
        limit_e2e = ["--limit", str(run_spec.limit)] if run_spec.limit else []
        where = (_environment_flags("custom", None, config) if run_spec.env == "custom"
                 else ["--category", run_spec.category] if run_spec.category else [])
        typed = [*where,
                 *(["--concurrency", str(run_spec.concurrency)] if run_spec.concurrency else [])]
        eval_e2e.append(["heart", "eval", "e2e", "--env", run_spec.env, "--split", "test", "--roles",
                         str(run / "adapters"), *base, *e2e_engine, *limit_e2e, *typed, *run_spec.args,
                         *loop_flags({**config.loop, **run_spec.loop}), *executor,
                         "--out", f"{folder}distilled", "--base-out", f"{folder}base"])
    e2e_outputs = [Path(command[-3]) for command in eval_e2e] + [Path(command[-1]) for command in eval_e2e]
    # A retrained adapter replaces the served one only through the library's validation; the
    # evaluation stages below measure the trained adapters themselves (base vs distilled).
    library = [["heart", "library", "adapter", "--library", str(run / "library"), "--role", role, "--adapter",
                str(run / "adapters" / role), "--data", str(run / "datasets"), "--limit", str(config.library.rows),
                "--engine", e.engine] for role in config.library.roles]
    a = e.attack
    # held out: the user tasks of the test split only, on the end-to-end evaluation's engine
    eval_attack = ([["python", "bench/injection.py", "--model", config.model, "--adapters", str(run / "adapters"),
                     "--suites", *a.suites, "--split", "test", "--pairs", str(a.pairs),
                     *e2e_engine, "--concurrency", str(a.concurrency), *a.args,
                     "--traces", str(run / "eval" / "attack" / "traces"),
                     "--out", str(run / "eval" / "attack" / "injection.json")]] if a.pairs else [])
    return [
        Stage("collect", collect, _custom_inputs(config), [run / "collect"], concurrent=True,
              resume=_with_resume(collect)),
        Stage("datasets", [["heart", "datasets", "build", str(run / "collect"), "--out", str(run / "datasets"),
                            *build_flags(config.datasets), "--overwrite"]],
              [run / "collect" / "traces"], [run / "datasets"]),
        Stage("train", train, [run / "datasets", *recipe_files, *_model_manifest(config.model)], [run / "adapters"],
              resume=lambda: _unfinished_roles(train, t.roles, run / "adapters")),
        # no outputs to remove: the library keeps every earlier admission and its history
        Stage("library", library, [run / "adapters", run / "datasets"], []),
        Stage("collect_test", collect_test, _custom_inputs(config), [run / "collect-test"], concurrent=True,
              resume=_with_resume(collect_test)),
        Stage("heldout", [["python", "-m", "heart_distill.eval.heldout", str(run / "collect-test"), "--out", str(run / "heldout"),
                           "--split", "test", "--overwrite"]], [run / "collect-test" / "traces"], [run / "heldout"]),
        Stage("eval_roles", eval_roles, [run / "heldout", run / "adapters"],
              [run / "eval" / "roles-base", run / "eval" / "roles-distilled"]),
        Stage("eval_e2e", eval_e2e, [run / "adapters", *_custom_inputs(config)], e2e_outputs,
              resume=_with_resume(eval_e2e)),
        Stage("eval_attack", eval_attack, [run / "adapters"], [run / "eval" / "attack"]),
        Stage("report", [["heart", "report", str(run / "eval"), "--out", str(run / "report")]], [run / "eval"],
              [run / "report"]),
    ]


STAGE_NAMES = ("collect", "datasets", "train", "library", "collect_test", "heldout", "eval_roles", "eval_e2e",
               "eval_attack", "report")


def _with_resume(commands: list[list[str]]) -> Callable[[], list[list[str]]]:
    """The same commands plus ``--resume``: each continues the killed run in its --out (and
    --base-out) without running its finished episodes again (``heart collect --resume``,
    ``heart eval e2e --resume``); a command that had finished finds nothing left to run."""
    return lambda: [[*command, "--resume"] for command in commands]


def _unfinished_roles(train: list[list[str]], roles: list[str], adapters: Path) -> list[list[str]]:
    """The train command for the roles whose adapter has no manifest.json yet (none when every
    role finished), without ``output.overwrite=true``. Each rerun on its output.dir resumes from
    the last checkpoint there (``train/sft.py``); overwrite only acts on a folder that holds a
    finished adapter, and leaving it out makes sure no finished adapter is trained again."""
    left = [role for role in roles if not (adapters / role / "manifest.json").is_file()]
    if not left:
        return []
    command = [arg for arg in train[0] if not arg.startswith("output.overwrite=")]
    command[command.index("--roles") + 1] = ",".join(left)
    return [command]


def _recipe_files(roles_yaml: Path, roles: list[str]) -> list[Path]:
    """roles.yaml, the chosen roles' recipes and the accelerate config: what the train stage reads
    (the roles.yaml read as training reads it, :func:`heart_distill.recipes.load_roles`)."""
    try:
        spec = load_roles(roles_yaml)
    except RecipeError as err:
        raise PipelineError(f"train.recipe: {err}") from None
    missing = [role for role in roles if role not in spec["roles"]]
    if missing:
        raise PipelineError(f"train.roles: {roles_yaml} has no recipe for {', '.join(missing)}")
    files = [roles_yaml, *(Path(spec["roles"][role]) for role in roles)]
    if spec["accelerate_config"]:
        files.append(Path(spec["accelerate_config"]))
    return files


def _model_manifest(name: str) -> list[Path]:
    """The base model's content-hash manifest: retraining follows a changed base."""
    from heart.models import resolve_model

    manifest = Path(resolve_model(name)) / "heart_model.json"
    return [manifest] if manifest.is_file() else []


def fingerprint(paths: list[Path]) -> str:
    """sha256 over each path's files (relative names and bytes); a missing path hashes as missing.

    Readers' cache files are left out, so reading a stage's outputs does not make it stale.
    """
    digest = hashlib.sha256()
    for root in paths:
        digest.update(f"\0root {root}\0".encode())
        if not root.exists():
            digest.update(b"missing")
            continue
        # cache-*.arrow: what `datasets` leaves beside a dataset a reader mapped or filtered on disk
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*")
                                                      if p.is_file() and not p.name.startswith("cache-"))
        for path in files:
            digest.update(str(path.relative_to(root) if path != root else path.name).encode() + b"\0")
            with path.open("rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
    return "sha256:" + digest.hexdigest()


def stage_key(stage: Stage) -> str:
    from heart_distill.data import TEACHER_WORDING_VERSION  # (the CLI's parser builds without data/)

    payload = json.dumps({"version": STAMP_VERSION, "formats": FORMATS_VERSION, "splits": SPLITS_VERSION,
                          "teacher_wording": TEACHER_WORDING_VERSION, "stage": stage.name,
                          "commands": stage.commands,
                          "inputs": fingerprint(stage.inputs)}, sort_keys=True)
    return "sha256:" + hashlib.sha256(payload.encode()).hexdigest()


def _stamp_path(run: Path, stage: Stage) -> Path:
    return run / "stamps" / f"{stage.name}.json"


def _started_path(run: Path, stage: Stage) -> Path:
    return run / "stamps" / f"{stage.name}.started.json"


def interrupted_key(run: Path, stage: Stage) -> str | None:
    """The key of a run of this stage that started and did not finish (None: there is none).

    The started record is written before the stage's commands run and removed once its stamp
    is written; the stamp alone says a stage finished.
    """
    path = _started_path(run, stage)
    if _stamp_path(run, stage).exists() or not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except ValueError:  # edited by hand (publish_text never leaves half a file): start over
        return None
    return record.get("key") if isinstance(record, dict) else None


def is_up_to_date(run: Path, stage: Stage, key: str) -> dict[str, Any] | None:
    """The stamp when the stage ran with this key and its outputs are as it left them, else None."""
    path = _stamp_path(run, stage)
    if not path.is_file():
        return None
    stamp = json.loads(path.read_text())
    if stamp.get("key") != key or stamp.get("outputs") != fingerprint(stage.outputs):
        return None
    return stamp


def heart_argv(command: list[str]) -> list[str]:
    """Run `heart ...` and `python ...` with this interpreter, whatever PATH holds."""
    if command[0] == "heart":
        return [sys.executable, "-m", "heart_distill.cli", *command[1:]]
    if command[0] == "python":
        return [sys.executable, *command[1:]]
    return command


def run_stage(run: Path, stage: Stage, key: str, continuing: bool = False) -> tuple[int, float]:
    """(exit status, wall seconds). A stage starts from empty outputs, or, ``continuing`` an
    interrupted run under the same key, keeps them and runs ``stage.resume()``'s commands."""
    missing = [str(p) for p in stage.inputs if not p.exists()]
    if missing:
        print(f"pipeline: {stage.name}: missing input(s) {', '.join(missing)}: run the stages before it first",
              file=sys.stderr)
        return 2, 0.0
    if continuing and stage.resume is not None:
        commands = stage.resume()
    else:
        commands, continuing = stage.commands, False
        # the record goes first: once it is written again, the outputs hold this run's work only
        _started_path(run, stage).unlink(missing_ok=True)
        _stamp_path(run, stage).unlink(missing_ok=True)
        for output in stage.outputs:
            shutil.rmtree(output, ignore_errors=True)
        started = {"stage": stage.name, "key": key, "commands": stage.commands,
                   "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        _started_path(run, stage).parent.mkdir(parents=True, exist_ok=True)
        publish_text(_started_path(run, stage), json.dumps(started, indent=2) + "\n")
    start = time.perf_counter()
    batches = [commands] if stage.concurrent else [[command] for command in commands]
    for batch in batches:
        processes = []
        for command in batch:
            print(f"pipeline: {stage.name}: $ {' '.join(command)}", file=sys.stderr, flush=True)
            processes.append((command, subprocess.Popen(heart_argv(command), env=stage_env(run, len(batch)))))
        failed = [(command, status) for command, process in processes if (status := process.wait()) != 0]
        for command, status in failed:
            print(f"pipeline: {stage.name}: failed ({' '.join(command[:3])} exited {status})", file=sys.stderr)
        if failed:
            return failed[0][1], time.perf_counter() - start
    wall = time.perf_counter() - start
    stamp = {"stage": stage.name, "key": key, "outputs": fingerprint(stage.outputs), "wall_s": round(wall, 1),
             "commands": stage.commands, "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if continuing:
        stamp["continued_with"] = commands  # the last continuation's commands; the key holds stage.commands
    _stamp_path(run, stage).parent.mkdir(parents=True, exist_ok=True)
    publish_text(_stamp_path(run, stage), json.dumps(stamp, indent=2) + "\n")  # only once the stage finished
    _started_path(run, stage).unlink(missing_ok=True)
    return 0, wall


def select(all_stages: list[Stage], only: list[str] | None, until: str | None) -> list[Stage]:
    names = [s.name for s in all_stages]
    for name in [*(only or []), *([until] if until else [])]:
        if name not in names:
            raise PipelineError(f"unknown stage {name!r} (stages: {', '.join(names)})")
    if only:
        return [s for s in all_stages if s.name in only]
    if until:
        return all_stages[: names.index(until) + 1]
    return all_stages


def run_pipeline(recipe: str | Path, only: list[str] | None = None, until: str | None = None,
                 force: bool = False) -> int:
    config, recipe_dir = load_pipeline(recipe)
    run = Path(config.run_dir)
    chosen = select(stages(config, recipe_dir), only, until)
    report_path = run / "pipeline.json"
    timings = json.loads(report_path.read_text())["stages"] if report_path.is_file() else {}
    total = time.perf_counter()
    print(f"pipeline: llama.cpp's and the converters' output goes to "
          f"{stage_env(run)['HEART_LOG_FILE']} (HEART_VERBOSE=1 shows it here)", file=sys.stderr, flush=True)
    for index, stage in enumerate(chosen, 1):
        head = f"pipeline: [{index}/{len(chosen)}] {stage.name}"
        key = stage_key(stage)
        stamp = None if force else is_up_to_date(run, stage, key)
        if stamp:
            print(f"{head}: up to date (same commands and inputs, key {key[7:19]}; ran in {stamp['wall_s']} s "
                  f"at {stamp['finished_at']}) — skipped", file=sys.stderr, flush=True)
            timings[stage.name] = {"wall_s": 0.0, "skipped": True, "last_run_wall_s": stamp["wall_s"]}
            continue
        interrupted = interrupted_key(run, stage)
        continuing = interrupted == key and stage.resume is not None and not force
        if continuing:
            print(f"{head}: continuing an interrupted run (key {key[7:19]}), its outputs kept", file=sys.stderr,
                  flush=True)
        else:
            why = ("" if interrupted is None else " (an interrupted run had another key)" if interrupted != key
                   else " (--force: an interrupted run is not continued)" if force
                   else " (an interrupted run of this stage is not continued)")
            if stage.commands:
                print(f"{head}: running from empty outputs (key {key[7:19]}){why}", file=sys.stderr, flush=True)
        status, wall = run_stage(run, stage, key, continuing)
        if not stage.commands:
            print(f"{head}: nothing to run in this recipe", file=sys.stderr, flush=True)
        timings[stage.name] = {"wall_s": round(wall, 1), "skipped": False, "last_run_wall_s": round(wall, 1),
                               "continued": continuing}
        run.mkdir(parents=True, exist_ok=True)
        report_path.write_text(json.dumps({"recipe": str(recipe), "stages": timings}, indent=2) + "\n")
        if status != 0:
            return status
    elapsed = time.perf_counter() - total
    report_path.write_text(json.dumps({"recipe": str(recipe), "stages": timings,
                                       "last_invocation_wall_s": round(elapsed, 1)}, indent=2) + "\n")
    print("\npipeline: stage wall times (this invocation; skipped stages: their last run)")
    for stage in chosen:
        t = timings[stage.name]
        print(f"  {stage.name:13} {t['wall_s']:7.1f} s" + (f"  (skipped; ran in {t['last_run_wall_s']} s)"
                                                           if t["skipped"] else ""))
    print(f"  {'total':13} {elapsed:7.1f} s   → {report_path}")
    return 0


def add_arguments(parser) -> None:
    parser.add_argument("--recipe", required=True, help="pipeline YAML (recipes/<model>/pipeline.yaml)")
    parser.add_argument("--stage", action="append", choices=STAGE_NAMES, metavar="NAME",
                        help=f"run only this stage (repeatable): {', '.join(STAGE_NAMES)}")
    parser.add_argument("--until", choices=STAGE_NAMES, metavar="NAME", help="run the stages up to NAME, included")
    parser.add_argument("--force", action="store_true", help="rerun the selected stages even when up to date")


def main(args) -> int:
    try:
        return run_pipeline(args.recipe, args.stage, args.until, args.force)
    except PipelineError as err:
        print(f"heart pipeline: {err}", file=sys.stderr)
        return 2
