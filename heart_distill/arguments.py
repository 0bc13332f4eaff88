"""Argument definitions of commands whose implementation is heavy to import.

``heart --help`` and every ``heart`` command build the whole parser first; defining a
command's options here keeps that from importing the command's implementation (importing
``heart_distill.data.collect`` costs ~0.7-1.1 s on the 2-core machine: the loop, ToolFace,
the roles), which is imported inside the command only.
"""

from __future__ import annotations

import argparse
import typing
from typing import Any, Literal, Sequence

from heart.argtypes import nonnegative_float, nonnegative_int, positive_int, probability
from heart.environments import BFCL_CATEGORIES, ENVIRONMENTS
from heart.settings import POLICY, LoopConfig, user_settings


def loop_arguments(parser: argparse.ArgumentParser, names: Sequence[str], **defaults: Any) -> None:
    """Flags for the :class:`heart.settings.LoopConfig` settings ``names``, derived from their
    fields (type, choices, default, help; a bool that is on by default gets ``--no-NAME``), so
    ``heart run``, ``heart collect`` and ``heart eval e2e`` spell, check and default a setting
    the same way; each flag's ``dest`` is the field's name (read back by :func:`loop_settings`).
    ``defaults`` changes what a command's parser starts from (``heart demo``'s short loop)."""
    from heart import argtypes

    fields = {f.name: f for f in user_settings()}
    hints = typing.get_type_hints(LoopConfig)
    for name in names:
        f = fields[name]
        meta = f.metadata
        flag = _flag(f)
        default = defaults.get(name, f.default)
        options = {"dest": name, "help": meta["help"]}
        if isinstance(f.default, bool):
            parser.add_argument(flag, *meta["aliases"], action="store_false" if f.default else "store_true",
                                default=default, **options)
            continue
        choices = typing.get_args(hints[name]) if typing.get_origin(hints[name]) is Literal else None
        kind = getattr(argtypes, meta["kind"]) if meta["kind"] else None
        help_default = "" if choices or f.default is None or isinstance(f.default, str) else f" (default {default})"
        parser.add_argument(flag, *meta["aliases"], default=default, choices=choices, type=kind,
                            metavar=meta["metavar"], **{**options, "help": options["help"] + help_default})


def _flag(f) -> str:
    """A setting's flag: its metadata's, else the field's name (``--no-NAME`` for a bool on by default)."""
    return f.metadata["flag"] or "--" + ("no-" if f.default is True else "") + f.name.replace("_", "-")


def loop_settings(args: argparse.Namespace, names: Sequence[str]) -> dict[str, Any]:
    """The LoopConfig fields :func:`loop_arguments` read for ``names``."""
    return {name: getattr(args, name) for name in names}


def loop_flags(settings: dict[str, Any]) -> list[str]:
    """The command-line flags that set ``settings`` (LoopConfig field → value), the inverse of
    :func:`loop_arguments`: how the pipeline hands a recipe's typed ``loop`` section to the
    commands it runs. A setting at its default gives no flag (the command line, and so the
    stage's key, names only what the recipe changed). ValueError for a key that is not a setting
    or a value the loop refuses."""
    fields = {f.name: f for f in user_settings()}
    unknown = [key for key in settings if key not in fields]
    if unknown:
        raise ValueError(f"not loop settings: {', '.join(map(str, unknown))} (known: {', '.join(fields)})")
    LoopConfig(**settings)  # values the loop refuses are refused here, naming the field
    flags: list[str] = []
    for name, value in settings.items():
        f = fields[name]
        if value == f.default:
            continue
        flags += [_flag(f)] if isinstance(f.default, bool) else [_flag(f), str(value)]
    return flags


def executor_arguments(parser: argparse.ArgumentParser) -> None:
    """Where episodes run (heart_distill.executors), shared by ``heart collect`` and ``heart eval e2e``."""
    parser.add_argument("--executor", choices=["local", "ray"], default="local",
                        help="local: threads in this process (default); ray: Ray Data actors on a Ray cluster "
                             "(pip install 'heart-distill[ray]'; docs/scaling.md)")
    parser.add_argument("--ray-address", default=None, metavar="ADDRESS",
                        help="ray: the cluster to join (default: RAY_ADDRESS, else the cluster `ray start` began "
                             "on this machine, else a new local instance)")
    parser.add_argument("--workers", type=positive_int, default=None,
                        help="ray: worker actors, each with its own environment and model client (default 2)")
    parser.add_argument("--shard-size", type=positive_int, default=None,
                        help="ray: episodes per shard, the unit a worker runs and Ray retries (default 16)")
    parser.add_argument("--worker-gpus", type=nonnegative_float, default=None,
                        help="ray: GPUs each worker reserves, for an in-process engine per worker (default 0)")


def custom_arguments(parser: argparse.ArgumentParser) -> None:
    """``--env custom``: a user's own tasks and tools (:mod:`heart.environments.custom`)."""
    parser.add_argument("--tasks", default=None, metavar="FILE",
                        help="custom: the tasks file (JSONL: id, request, optional expected_calls; docs/your-tools.md)")
    parser.add_argument("--tools", default=None, metavar="SPEC",
                        help="custom: a Python module or .py file of typed functions, 'mcp:COMMAND ARGS...' (a stdio "
                             "MCP server per episode) or an http(s):// MCP server URL")


def collect_arguments(parser: argparse.ArgumentParser) -> None:
    """``heart collect`` / ``python -m heart_distill.data.collect``."""
    parser.add_argument("--env", required=True, choices=ENVIRONMENTS)
    parser.add_argument("--category", default=None, choices=BFCL_CATEGORIES,
                        help="bfcl only (default multi_turn_base; multi_turn_miss_param: the user withholds a "
                             "parameter until asked; simple, multiple, parallel, parallel_multiple: single-turn)")
    custom_arguments(parser)
    parser.add_argument("--split", default="train", choices=["train", "dev", "test"])
    parser.add_argument("--teacher", default="gold", help="gold | openai:<url>#<model> | hf:<model>")
    parser.add_argument("--fault-rate", type=probability, default=0.0,
                        help="gold teacher: chance that a dispatch carries an injected fault (default 0)")
    parser.add_argument("--student", default=None, metavar="base|ADAPTERS",
                        help="gold teacher: a model whose Primitive answers some steps instead (natural faults): "
                             "'base' or an adapters folder (<dir>/primitive/)")
    parser.add_argument("--student-rate", type=probability, default=0.0,
                        help="gold teacher with --student: chance that a Primitive step, in a turn with no fault "
                             "yet, is the student's (default 0)")
    parser.add_argument("--student-engine", default="llamacpp:f16",
                        help="the engine that serves the student in process (default %(default)s)")
    parser.add_argument("--out", required=True, help="run folder (traces/, manifest.json)")
    parser.add_argument("--seeds", type=nonnegative_int, nargs="+", default=[0], help="one episode per task per seed")
    loop_arguments(parser, POLICY)
    parser.add_argument("--concurrency", type=positive_int, default=8,
                        help="episodes run at once (per worker with --executor ray)")
    parser.add_argument("--quantize", choices=["int8"], default=None,
                        help="hf teacher: int8 dynamic-quantised base linears (LoRA kept exact)")
    parser.add_argument("--max-batch-size", type=positive_int, default=8,
                        help="hf teacher: most role calls served in one batch across episodes")
    parser.add_argument("--limit", type=nonnegative_int, default=0,
                        help="only the first N tasks of the split (default 0: all)")
    parser.add_argument("--resume", action="store_true", help="continue a killed run in --out")
    executor_arguments(parser)


def optimize_arguments(parser: argparse.ArgumentParser) -> None:
    """``heart optimize`` (heart_distill.eval.optimize.cli)."""
    from pathlib import Path

    parser.add_argument("--recipe", required=True, type=Path, help="an optimize recipe (recipes/*/optimize.yaml)")
    parser.add_argument("--stage", choices=["search", "scorecard", "report", "all"], default="all")
    parser.add_argument("--arm", action="append", default=[], help="only this arm's searches (repeatable)")
    parser.add_argument("--runs", nargs="+", default=[], help="only these runs (s<split seed>r<repeat>)")
    parser.add_argument("--max-minutes", type=float, default=None,
                        help="stop after the piece that crosses this many minutes (resume by running again)")
    parser.add_argument("--out", help="override the recipe's out folder")
    parser.add_argument("--proposer", help="override the recipe's proposer (deterministic | openai:<url>#<model>)")
    parser.add_argument("--report-out", type=Path, help="also write the stamped report JSON here")
    parser.add_argument("--slots", nargs="+", choices=["middleware", "prompt", "joint"],
                        help="override the recipe's mutation slots (--slots middleware: the middleware surface alone)")
    parser.add_argument("--answers", help="where recorded role answers are kept (share them between variants)")
    parser.add_argument("--seed-middleware", metavar="PATH|default|none",
                        help="override the recipe's seed_middleware: the middleware every arm starts from "
                             "(not default: each arm is also scored with the default set, a reference arm)")
