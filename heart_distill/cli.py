"""The ``heart`` command.

    heart models prepare smollm2-135m          convert the embedded GGUF into a cached folder
    heart tasks --env bfcl --split train       list task ids of a split
    heart run --env bfcl --task multi_turn_base_0 [--model M] [--adapter role=PATH] [--trace F]
    heart demo                                 show the loop: prepare, then run a few BFCL tasks
    heart collect --env bfcl --split train --teacher gold --out runs/NAME [--resume]
    heart datasets build runs/NAME --out runs/NAME/datasets
    heart train --recipe recipes/smollm2-135m/roles.yaml [--roles planner,router]
    heart serve --adapter planner=PATH ... [--port 8000]   OpenAI-compatible, model name = role
    heart mcp serve --env bfcl --model gold [--transport http --port 8765]   MCP server (heart/mcp.py)
    heart check parity --adapters DIR          peft vs vLLM vs int8, token for token, per role
    heart eval roles --data DATASETS --split test --roles base|ADAPTERS_DIR|teacher:SPEC --out DIR
    heart eval e2e --env bfcl --split test --roles base|ADAPTERS_DIR|teacher:SPEC --out DIR [--limit N]
    heart report RUN... --out DIR              markdown page + PNG plots from heart_distill.eval results
    heart pipeline --recipe recipes/smollm2-135m/pipeline.yaml [--until train] [--stage NAME]
    heart optimize --recipe recipes/smollm2-135m/optimize.yaml [--stage search|scorecard|report]

Heavy libraries (torch, transformers, train/, data/) are imported inside the commands.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from heart import ROLES
from heart.argtypes import nonnegative_int, port, positive_int, probability
from heart.access import API_KEY_ENV
from heart.environments import BFCL_CATEGORIES, ENVIRONMENTS
from heart.runtime.backends import backend_for, parse_model_spec
from heart.runtime.engines import ENGINE_SPECS
from heart.settings import POLICY, TURN, LoopConfig
from heart_distill.arguments import (collect_arguments, custom_arguments, loop_arguments, loop_settings,
                                     optimize_arguments)

RUN_SETTINGS = (*POLICY, *TURN, "prefill")
"""The loop settings ``heart run`` and ``heart demo`` take (:mod:`heart.settings`)."""

if TYPE_CHECKING:
    from heart.library import Library

DEMO_TASKS = ["multi_turn_base_0", "multi_turn_base_1"]


def _adapters(pairs: list[str]) -> dict[str, str]:
    adapters = {}
    for pair in pairs:
        role, sep, path = pair.partition("=")
        if not sep or role not in ROLES:
            raise SystemExit(f"error: --adapter expects ROLE=PATH with ROLE one of planner/router/primitive/verifier, got {pair!r}")
        adapters[role] = path
    return adapters


def _library(args: argparse.Namespace):
    """--library: the library folder (heart/library.py) whose admitted adapters and composite
    primitives serve by default; None without one."""
    from heart.library import LibraryError, load_library
    from heart.user_errors import UserError

    if not getattr(args, "library", None):
        return None
    try:
        return load_library(args.library)
    except (LibraryError, FileNotFoundError) as err:
        raise UserError(f"--library: {err}") from None


@dataclass(frozen=True)
class Serving:
    """What a command serves, read from its command line once: --model's kind, --library, and
    the role adapters (--adapter parsed over the library's). Every part of one command takes
    them from here instead of reading the library or parsing --adapter again."""

    args: argparse.Namespace
    kind: str
    """--model's kind (:func:`heart.runtime.backends.parse_model_spec`): gold, openai or hf (in process)."""
    library: Library | None
    adapters: dict[str, str]
    """The library's admitted adapters, with each --adapter ROLE=PATH taking precedence."""
    short_prompts: tuple[str, ...]
    """Roles whose admitted library adapter (not overridden by --adapter, not already given
    by --short-prompt) learnt the short prompt."""

    @property
    def per_task(self) -> bool:
        """The gold teacher: built for each task, from its gold calls."""
        return self.kind == "gold"

    @property
    def in_process(self) -> bool:
        """A model loaded here, which serves the role adapters (a server serves its own)."""
        return self.kind == "hf"


def _serving(args: argparse.Namespace) -> Serving:
    """--model checked, --adapter parsed and --library read, once, before any model loads."""
    kind = _model_spec(args.model).kind
    flagged = _adapters(args.adapter)
    library = _library(args)
    admitted = library.adapter_paths() if library else {}
    return Serving(args, kind, library, {**admitted, **flagged},
                   _library_short_prompts(library, set(flagged), set(getattr(args, "short_prompt", ()))))


def _served_adapters(args: argparse.Namespace) -> dict[str, str]:
    """The library's admitted adapters, with each --adapter ROLE=PATH taking precedence."""
    return _serving(args).adapters


def _library_short_prompts(library: Library | None, overridden: set[str], asked: set[str]) -> tuple[str, ...]:
    if library is None:
        return ()
    return tuple(role for role, entry in library.adapters.items() if role not in overridden
                 and role not in asked and (entry.get("system_prompt") or "") == "short")


def _with_library(serving: Serving, environment):
    """The environment with the library's admitted composites for it among its tools."""
    from heart.library import LibraryEnvironment

    composites = serving.library.composites(environment.name) if serving.library else []
    return LibraryEnvironment(environment, composites) if composites else environment


def _backend(serving: Serving, task=None, environment=None):
    """The loop's backend: the gold teacher of one task (with the library's composites), or the
    model every task shares."""
    args = serving.args
    if serving.per_task:  # `gold`: the gold teacher is data generation, built here (heart/ only names it)
        from heart_distill.data.gold_teacher import GoldTeacher

        library = serving.library
        return GoldTeacher(task, environment.catalog(), fault_rate=args.fault_rate,
                           composites=library.composites(task.env) if library else ())
    # The library's adapters are for a model loaded here; a server serves its own (and
    # _check_loop_arguments refuses an --adapter beside one).
    adapters = serving.adapters if serving.in_process else {}
    return backend_for(args.model, adapters, args.engine, quantize=args.quantize)


def _model_spec(model: str):
    from heart.user_errors import UserError

    try:
        return parse_model_spec(model)
    except ValueError as err:
        raise UserError(f"--model: {err}") from None


def _loop_serving(args: argparse.Namespace) -> Serving:
    """A loop command's --model, --adapter and --library, read once and checked together."""
    serving = _serving(args)
    _check_loop_arguments(serving)
    return serving


def _check_loop_arguments(serving: Serving) -> None:
    """Refuse flag combinations that would be silently ignored."""
    from heart.user_errors import UserError

    args = serving.args
    if args.adapter and not serving.in_process:
        kind = "the gold teacher" if serving.per_task else "an OpenAI-compatible server (it serves its own adapters)"
        raise UserError(f"--adapter applies to in-process models only, not to {kind}: "
                        f"drop --adapter or use --model <name|folder|hf:ID>")
    if args.fault_rate and not serving.per_task:
        raise UserError(f"--fault-rate applies to --model gold only, not to {args.model!r}")
    _check_quantize(args)


def _check_quantize(args: argparse.Namespace) -> None:
    from heart.user_errors import UserError

    if args.quantize and args.engine != "peft":
        raise UserError(f"--quantize int8 is a peft-engine option; --engine is {args.engine}")


def _check_middleware(args: argparse.Namespace, environment) -> None:
    """--middleware names a usable intercept file whose tools and parameters are the
    environment's (a MiddlewareError is a UserError: one line naming the file and field)."""
    LoopConfig(**loop_settings(args, POLICY)).check_files(environment.catalog())
    _harness(args, environment)  # and --harness's intercepts, the same way


def _harness(args: argparse.Namespace, environment=None):
    """--harness: a harness folder (heart/harness.py), its form checked (not its tool names: a
    harness optimized over several environments names tools of each); it brings its own
    middleware, so a --middleware beside it is refused."""
    from heart.harness import load_harness
    from heart.user_errors import UserError

    if not getattr(args, "harness", None):
        return None
    if getattr(args, "middleware", "default") != "default":
        raise UserError("--harness brings its own middleware: drop --middleware (or edit the harness)")
    return load_harness(args.harness)


def _loop_config(args: argparse.Namespace, serving: Serving):
    from heart.harness import loop_fields

    # a harness brings its own middleware (_harness refuses a --middleware beside it)
    fields = {**loop_settings(args, RUN_SETTINGS), **loop_fields(_harness(args))}
    return LoopConfig(short_prompts=tuple(args.short_prompt) + serving.short_prompts, **fields)


def _run_tasks(args: argparse.Namespace, task_ids: list[str]) -> int:
    from heart.account import Account
    from heart.environments import load_environment
    from heart.episode import run_episode
    from heart.runtime.base import SamplingConfig
    from heart.traces import TraceWriter

    serving = _loop_serving(args)
    environment = _with_library(serving, load_environment(args.env, tasks=args.tasks, tools=args.tools))
    _check_middleware(args, environment)
    shared = None if serving.per_task else _backend(serving)
    trace = TraceWriter(args.trace) if args.trace else None
    sampling = {r: SamplingConfig(max_new_tokens=args.max_new_tokens) for r in ROLES}
    config = _loop_config(args, serving)
    scores, errored = [], []
    try:
        for task_id in task_ids:
            try:
                task = environment.load_task(task_id)
            except KeyError as err:
                print(f"error: {err.args[0]}", file=sys.stderr)
                return 2
            backend = shared or _backend(serving, task, environment)
            print(f"\n### {args.env} task {task_id} with {backend.name}", flush=True)
            result = run_episode(environment, task, backend, config=config, trace=trace, seed=args.seed,
                                 observe=Account(), sampling=sampling)
            if result.record.errored:  # infrastructure: no score, counted apart
                errored.append((task_id, result.record.error))
            else:
                scores.append((task_id, result.record.score))
    finally:
        if trace:
            trace.close()
    print("\nscores: " + (", ".join(f"{t}={s:.2f}" for t, s in scores) or "none")
          + f"  (mean {sum(s for _, s in scores) / max(len(scores), 1):.2f} over {len(scores)} scored)")
    if errored:
        print(f"errored: {len(errored)} episode(s), not scored (infrastructure, not the model): "
              + "; ".join(f"{t}: {e}" for t, e in errored))
    if args.trace:
        print(f"trace: {args.trace}")
    if errored and not scores:
        print(f"heart {args.command}: error: every episode errored; nothing was scored", file=sys.stderr)
        return 1
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    return _run_tasks(args, args.task)


def cmd_demo(args: argparse.Namespace) -> int:
    from heart.models import prepare_smollm2

    print(f"model: {prepare_smollm2()}")
    return _run_tasks(args, args.task or DEMO_TASKS)


def cmd_models(args: argparse.Namespace) -> int:
    from heart.models import EMBEDDED

    if args.name not in EMBEDDED:
        print(f"error: unknown embedded model {args.name!r}; known: {', '.join(EMBEDDED)}", file=sys.stderr)
        return 2
    print(EMBEDDED[args.name]())
    return 0


def cmd_tasks(args: argparse.Namespace) -> int:
    from heart.environments import load_environment

    from heart.user_errors import UserError

    try:
        environment = load_environment(args.env, args.category, args.tasks, args.tools)
    except (ValueError, UserError) as err:
        print(f"heart tasks: error: {err}", file=sys.stderr)
        return 2
    for task_id in environment.task_ids(args.split):
        print(task_id)
    return 0


def cmd_toolface(args: argparse.Namespace) -> int:
    """Show what ToolFace gives the Planner for a task's turn (or any query)."""
    from heart.catalog import catalog_tools, central_catalog, retrieval_config, session_toolface
    from heart.environments import load_environment

    environment = load_environment(args.env, tasks=args.tasks, tools=args.tools)
    try:
        task = environment.load_task(args.task or environment.task_ids()[0])
    except KeyError as e:
        print(f"error: {e.args[0]}", file=sys.stderr)
        return 2
    if not 0 <= args.turn < len(task.turns):
        print(f"error: task {task.task_id} has turns 0..{len(task.turns) - 1}, not {args.turn}", file=sys.stderr)
        return 2
    session = environment.start(task)
    tools = catalog_tools(session, central_catalog()) if args.catalog == "central" else session.tools
    toolface = session_toolface(environment, session, tools, config=retrieval_config(environment, k=args.k))
    query = args.query or task.turns[args.turn]
    print(f"{task.task_id} turn {args.turn}, {len(toolface)} tools ({args.catalog}): {query}\n")
    for tool in toolface.retrieve(query):
        print(f"{tool.score:6.3f}  {tool.name}  [{tool.category}]  {tool.description}")
    return 0


def _toolface_arguments(sub) -> None:
    p = sub.add_parser("toolface", help="show the tools ToolFace retrieves for a task's turn or a query")
    p.add_argument("--env", default="bfcl", choices=ENVIRONMENTS)
    custom_arguments(p)
    p.add_argument("--task", help="task id (default: the first task)")
    p.add_argument("--turn", type=nonnegative_int, default=0, help="which user turn's text is the query")
    p.add_argument("--query", help="search this text instead of the task's turn")
    p.add_argument("--catalog", choices=["session", "central"], default="session",
                   help="the task's own tools, or every BFCL + AgentDojo document")
    p.add_argument("--k", type=positive_int, default=7, help="ranked tools before companions are added")
    p.set_defaults(func=cmd_toolface)


def cmd_collect(args: argparse.Namespace) -> int:
    from heart_distill.data.collect import collect

    return collect(args)


def cmd_datasets(args: argparse.Namespace) -> int:
    if args.action == "lint":
        return cmd_datasets_lint(args.rest)
    from heart_distill.data.build import main as build_main

    return build_main(args.rest)


def cmd_datasets_lint(argv: list[str]) -> int:
    """Check that a model's training template trains on exactly a role dataset's assistant turns."""
    parser = argparse.ArgumentParser(prog="heart datasets lint")
    parser.add_argument("dataset", help="a role dataset folder (runs/NAME/datasets/ROLE)")
    parser.add_argument("--model", default="smollm2-135m", help="whose tokenizer and chat template")
    parser.add_argument("--limit", type=positive_int, default=64, help="examples to check per split")
    args = parser.parse_args(argv)
    from datasets import load_from_disk
    from transformers import AutoTokenizer

    from heart_distill.data.loss_mask import LossMaskError, lint_loss_mask
    from heart.models import resolve_model
    from heart_distill.train.templates import template_for

    from heart.user_errors import UserError

    if not (Path(args.dataset) / "dataset_dict.json").is_file():
        what = "does not exist" if not Path(args.dataset).exists() else "is not a saved DatasetDict (no dataset_dict.json)"
        raise UserError(f"dataset {args.dataset} {what}: give a role dataset folder, e.g. runs/NAME/datasets/planner")
    try:
        tokenizer = AutoTokenizer.from_pretrained(resolve_model(args.model))
    except OSError as err:  # FileNotFoundError included: a missing folder, an unknown id offline
        raise UserError(f"--model {args.model!r}: cannot load its tokenizer: {str(err).splitlines()[0]}") from None
    template = template_for(tokenizer)
    status = 0
    for split, rows in load_from_disk(args.dataset).items():
        try:
            print(f"{split}: {lint_loss_mask(tokenizer, template, rows.select(range(min(args.limit, len(rows)))))}")
        except LossMaskError as err:
            print(f"{split}: {err}", file=sys.stderr)
            status = 1
    return status


def cmd_train(args: argparse.Namespace) -> int:
    from heart_distill.train.launch import run_roles

    roles = args.roles.split(",") if args.roles else None
    if args.publish:
        from heart_distill.train.launch import publish_roles

        return publish_roles(args.recipe, args.publish, roles, args.overrides)
    if args.joint:
        from heart_distill.train.launch import run_joint

        return run_joint(args.recipe, args.joint, roles, args.overrides, args.stop_after)
    return run_roles(args.recipe, roles, args.overrides, parallel=args.parallel, stop_after=args.stop_after)


def cmd_eval(args: argparse.Namespace) -> int:
    """Per-role and end-to-end evaluation (eval/ is imported here, never at module level)."""
    full = ["eval", args.action, *args.rest]
    if args.action == "roles":
        from heart_distill.eval.roles import main as roles_main

        return roles_main(args.rest, full)
    if args.action == "bench":
        from heart_distill.eval.bench_e2e import main as bench_main

        return bench_main(args.rest, full)
    if args.action == "rescore":
        from heart_distill.eval.rescore import main as rescore_main

        return rescore_main(args.rest, full)
    from heart_distill.eval.e2e import main as e2e_main

    return e2e_main(args.rest, full)


def cmd_report(args: argparse.Namespace) -> int:
    from heart_distill.eval.report import main as report_main

    return report_main(args.rest, ["report", *args.rest])


def cmd_optimize(args: argparse.Namespace) -> int:
    from heart_distill.eval.optimize.cli import main as optimize_main

    return optimize_main(args, sys.argv[1:])


def cmd_pipeline(args: argparse.Namespace) -> int:
    from heart_distill.pipeline import main as pipeline_main

    return pipeline_main(args)


def _loop_arguments(p: argparse.ArgumentParser, model_default: str, **loop_defaults) -> None:
    p.add_argument("--env", default="bfcl", choices=ENVIRONMENTS)
    custom_arguments(p)
    p.add_argument("--model", default=model_default,
                   help="embedded name (smollm2-135m, tiny-qwen3), a local folder, a HF id, 'gold' "
                        "(the gold-guided teacher) or openai:<url>#<model>")
    p.add_argument("--adapter", action="append", default=[], metavar="ROLE=PATH",
                   help="serve ROLE with the LoRA adapter at PATH (repeatable)")
    p.add_argument("--library", metavar="DIR",
                   help="a library (heart library): its admitted adapters serve by default (--adapter overrides a "
                        "role) and its admitted composite primitives join the environment's tools")
    p.add_argument("--short-prompt", action="append", default=[], metavar="ROLE",
                   help="send ROLE the short system prompt (its adapter was context-distilled)")
    p.add_argument("--trace", help="append trace events to this JSONL file")
    loop_arguments(p, RUN_SETTINGS, **loop_defaults)
    p.add_argument("--harness", metavar="DIR", help="a harness folder (role prompt edits + middleware; "
                                                    "heart optimize writes one, docs/optimize.md)")
    p.add_argument("--max-new-tokens", type=positive_int, default=512, help="per role call")
    p.add_argument("--fault-rate", type=probability, default=0.0, help="with --model gold: injected fault rate")
    p.add_argument("--seed", type=nonnegative_int, default=0)
    p.add_argument("--quantize", choices=["int8"], default=None,
                   help="in-process model: int8 dynamic-quantised base linears, role LoRA kept exact (CPU)")
    p.add_argument("--engine", choices=ENGINE_SPECS, default="peft",
                   help="in-process engine: transformers + peft, or llama.cpp (GGUF, CPU; same greedy answers up "
                        "to arithmetic order; llamacpp:f16 for f16 base weights)")


def cmd_serve(args: argparse.Namespace) -> int:
    from heart.serve import serve

    _check_quantize(args)
    args.adapters = _served_adapters(args)
    return serve(args)


def _serve_parser(sub) -> None:
    p = sub.add_parser("serve", help="OpenAI-compatible server: model name = role (planner, router, ..., base)")
    p.add_argument("--model", default="smollm2-135m", help="base: embedded name, local folder or HF id")
    p.add_argument("--adapter", action="append", default=[], metavar="ROLE=PATH", help="role adapter (repeatable)")
    p.add_argument("--library", metavar="DIR",
                   help="serve the library's admitted adapters by default (heart library; --adapter overrides a role)")
    p.add_argument("--engine", choices=[*ENGINE_SPECS, "vllm"], default="peft",
                   help="peft or llama.cpp in-process, or vLLM in a worker process (.venv-vllm, scripts/setup_vllm.sh)")
    p.add_argument("--quantize", choices=["int8"], default=None, help="peft engine: int8 base linears (CPU)")
    p.add_argument("--host", default="127.0.0.1",
                   help="bind address (default loopback); any other needs --api-key (heart.access)")
    p.add_argument("--api-key", default=None,
                   help=f"require 'Authorization: Bearer KEY' on every request (or set {API_KEY_ENV})")
    p.add_argument("--port", type=port, default=8000)
    p.add_argument("--max-batch-size", type=positive_int, default=8, help="most requests decoded in one batch")
    p.add_argument("--max-prompt-tokens", type=positive_int, default=8192, help="longer prompts get 400")
    p.add_argument("--max-new-tokens", type=positive_int, default=2048, help="largest max_tokens a request may ask")
    p.set_defaults(func=cmd_serve)


def cmd_mcp(args: argparse.Namespace) -> int:
    """``heart mcp serve``: HEART's primitives as an MCP server (heart/mcp.py)."""
    from heart.environments import load_environment
    from heart.mcp import HeartMCP, serve
    from heart.runtime.base import SamplingConfig
    from heart.traces import TraceWriter

    from heart.access import api_key_for

    # refused before any model loads; stdio is the client's own pipe: no key
    key = api_key_for(args.host, args.api_key, "heart mcp serve") if args.transport == "http" else None
    serving = _loop_serving(args)
    environment = _with_library(serving, load_environment(args.env, tasks=args.tasks, tools=args.tools))
    _check_middleware(args, environment)
    shared = None if serving.per_task else _backend(serving)  # a model loads once, before serving

    def episode_backend(task):
        return shared or _backend(serving, task, environment)

    heart = HeartMCP(environment, episode_backend, gold=serving.per_task, config=_loop_config(args, serving),
                     sampling={r: SamplingConfig(max_new_tokens=args.max_new_tokens) for r in ROLES},
                     split=args.split, seed=args.seed, trace=TraceWriter(args.trace) if args.trace else None,
                     exclusive=shared is not None and serving.in_process)
    return serve(args, heart, key)


def _mcp_parser(sub) -> None:
    p = sub.add_parser("mcp", help="MCP server: toolface_search, call_primitive and solve for outside agents")
    actions = p.add_subparsers(dest="action", required=True)
    s = actions.add_parser("serve", help="serve one environment's tools and the HEART loop over MCP "
                                         "(stdio by default, or streamable HTTP)")
    _loop_arguments(s, "smollm2-135m")
    s.add_argument("--split", choices=["train", "dev", "test"],
                   help="accept only this split's task ids (default: every task)")
    s.add_argument("--transport", choices=["stdio", "http"], default="stdio",
                   help="stdio (an MCP client starts this command) or streamable HTTP at http://HOST:PORT/mcp")
    s.add_argument("--host", default="127.0.0.1",
                   help="HTTP bind address (default loopback); any other needs --api-key (heart.access)")
    s.add_argument("--api-key", default=None,
                   help=f"HTTP: require 'Authorization: Bearer KEY' on every request (or set {API_KEY_ENV})")
    s.add_argument("--port", type=port, default=8765, help="HTTP port (default 8765)")
    s.set_defaults(func=cmd_mcp)


def cmd_check(args: argparse.Namespace) -> int:
    from heart.runtime.parity import main as parity_main

    return parity_main(args.rest)


def _check_parser(sub) -> None:
    p = sub.add_parser("check", help="checks: parity (peft vs vLLM vs int8, token for token, per role)")
    p.add_argument("what", choices=["parity"])
    p.add_argument("rest", nargs=argparse.REMAINDER, help="--adapters DIR [--model M] [--engines vllm,llamacpp,int8]")
    p.set_defaults(func=cmd_check)


def cmd_library(args: argparse.Namespace) -> int:
    from heart_distill.library_cli import main as library_main

    return library_main(args)


def _library_parser(sub) -> None:
    from heart_distill.library_cli import add_arguments

    p = sub.add_parser("library", help="the library: propose, validate and admit composite primitives and role "
                                       "adapters; history, list")
    add_arguments(p)
    p.set_defaults(func=cmd_library)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="heart", description="HEART role-model toolkit")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("run", help="run tasks through the HEART loop and print an account")
    _loop_arguments(p, "smollm2-135m")
    p.add_argument("--task", action="append", required=True, help="task id (repeatable)")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("demo", help="prepare the embedded model and run a few BFCL tasks, printing every role call (shows the loop)")
    # A few minutes on 2 cores: one re-plan, no clarification round (BFCL's user has no
    # more to say), plans of at most 4 steps.
    _loop_arguments(p, "smollm2-135m", replan_budget=1, max_clarifications=0, max_plan_steps=4)
    p.add_argument("--task", action="append", help=f"task id (default: {' '.join(DEMO_TASKS)})")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("models", help="embedded models")
    p.add_argument("action", choices=["prepare"])
    p.add_argument("name", help="smollm2-135m or tiny-qwen3")
    p.set_defaults(func=cmd_models)

    p = sub.add_parser("tasks", help="list task ids")
    p.add_argument("--env", default="bfcl", choices=ENVIRONMENTS)
    p.add_argument("--category", choices=BFCL_CATEGORIES, help="bfcl only (default multi_turn_base)")
    custom_arguments(p)
    p.add_argument("--split", choices=["train", "dev", "test"])
    p.set_defaults(func=cmd_tasks)

    p = sub.add_parser("collect", help="run a teacher over a split and record traces")
    collect_arguments(p)
    p.set_defaults(func=cmd_collect)

    p = sub.add_parser("datasets", help="build role datasets from a run's traces, or lint their loss mask")
    p.add_argument("action", choices=["build", "lint"])
    p.add_argument("rest", nargs=argparse.REMAINDER,
                   help="build: arguments of python -m heart_distill.data.build; lint: DATASET [--model M] [--limit N]")
    p.set_defaults(func=cmd_datasets)

    p = sub.add_parser("train", help="train role adapters from a roles recipe (or one role's recipe)")
    p.add_argument("--recipe", required=True, type=Path,
                   help="a roles.yaml (every role it lists), or one role's recipe such as router.yaml (that role)")
    p.add_argument("--roles", help="comma-separated subset of roles")
    p.add_argument("--parallel", action="store_true", help="run roles as parallel accelerate jobs")
    p.add_argument("--joint", metavar="ADAPTERS", type=Path,
                   help="one adapter for every role instead, in ADAPTERS/joint (served with --roles ADAPTERS): the "
                        "union of their rows, with their optimizer steps and recipe (the control of the role split)")
    p.add_argument("--stop-after", type=float, metavar="MINUTES",
                   help="stop at the first optimizer step after this many minutes, with a checkpoint, and exit 75; "
                        "the same command run again resumes there (a long training in bounded slots)")
    p.add_argument("--publish", metavar="DIR", type=Path,
                   help="train nothing: copy the adapters this command line trained to DIR/<role> (e.g. a results "
                        "folder to commit), their cards naming DIR; never overwrites")
    p.add_argument("overrides", nargs="*", help="key=value recipe overrides")
    p.set_defaults(func=cmd_train)

    _serve_parser(sub)
    _mcp_parser(sub)
    _check_parser(sub)
    _library_parser(sub)
    p = sub.add_parser("eval", help="evaluate roles on held-out inputs, or the whole loop end to end")
    p.add_argument("action", choices=["roles", "e2e", "bench", "rescore"])
    p.add_argument("rest", nargs=argparse.REMAINDER,
                   help="see heart eval roles --help / heart eval e2e --help / heart eval bench --help "
                        "(the whole-loop benchmark in chunks) / heart eval rescore --help (recorded answers "
                        "scored again under the checkout's metrics)")
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("report", help="one markdown page with tables and plots from heart_distill.eval results")
    p.add_argument("rest", nargs=argparse.REMAINDER, help="see heart report --help")
    p.set_defaults(func=cmd_report)
    from heart_distill.pipeline import add_arguments as pipeline_arguments

    p = sub.add_parser("pipeline", help="collect → datasets → train → evaluate → report, each stage content-addressed")
    pipeline_arguments(p)
    p.set_defaults(func=cmd_pipeline)
    _toolface_arguments(sub)
    p = sub.add_parser("optimize", help="optimize the harness (prompts + middleware) around a fixed model: "
                                        "PRISM's protocol, four arms (docs/optimize.md)")
    optimize_arguments(p)
    p.set_defaults(func=cmd_optimize)
    return parser


def main(argv: list[str] | None = None) -> int:
    from heart.progress import quiet_library_bars
    from heart.user_errors import UserError

    quiet_library_bars()
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except UserError as err:  # bad input: one line naming the problem, no traceback
        print(f"heart {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
