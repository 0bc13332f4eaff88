"""Argument definitions of commands whose implementation is heavy to import.

``heart --help`` and every ``heart`` command build the whole parser first; defining a
command's options here keeps that from importing the command's implementation (importing
``heart_distill.data.collect`` costs ~0.7-1.1 s on the 2-core machine: the loop, ToolFace,
the roles), which is imported inside the command only.
"""

from __future__ import annotations

import argparse
import hashlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from heart.argtypes import nonnegative_float, nonnegative_int, positive_int, probability
from heart.roles import router


def loop_policy_arguments(parser: argparse.ArgumentParser) -> None:
    """How the loop runs a turn, shared by ``heart collect``, ``heart run``, ``heart eval e2e``
    and their kin: re-plan budget, Verifier granularity, tool-boundary middleware, relevance,
    messages, carried validation (read back as one :class:`LoopPolicy`)."""
    parser.add_argument("--budget", type=nonnegative_int, default=3, help="re-plan budget B (default 3)")
    parser.add_argument("--verify", default="step", choices=["step", "attempt"],
                        help="Verifier granularity: per step (Algorithm 1, default) or per whole attempt")
    parser.add_argument("--middleware", default="default", metavar="PATH|default|none",
                        help="tool-boundary middleware (docs/middleware.md): default (the shipped silent "
                             "corrections), none (arguments bound as given), or a YAML intercept file")
    parser.add_argument("--relevance", action="store_true",
                        help="relevance before selection: ToolFace's top 20 each judge, in the Primitive's "
                             "relevance mode, whether they apply; the Planner is shown those that do (≤ 10; "
                             "the gold teacher answers with gold relevance; docs/toolface.md)")
    parser.add_argument("--no-messages", action="store_true",
                        help="no messages between primitives (a passed step's Primitive tells the steps that "
                             "read its result which field they need; docs/primitives.md)")
    parser.add_argument("--router-mode", default=router.DEFAULT_MODE, choices=list(router.MODES),
                        help=f"plan: one Router call dispatches the whole plan (HEART D.2); step: one call per step, "
                             f"after its dependencies ran, shown their results (default {router.DEFAULT_MODE}; "
                             "docs/loop.md)")
    parser.add_argument("--validation", default="default", metavar="PATH|default|none",
                        help="carried validation after execution (docs/primitives.md): default (the shipped "
                             "mined result shapes + state-change checks), none, or a result-shapes file")


@dataclass(frozen=True)
class LoopPolicy:
    """The loop-policy flags (:func:`loop_policy_arguments`) as one value: what ``heart run``,
    ``heart collect`` and ``heart eval e2e`` hand the loop, and what a collection's
    ``manifest.json`` and an evaluation's ``e2e-run.json`` record about how their episodes ran."""

    budget: int = 3
    """Re-plan budget B (``LoopConfig.replan_budget``)."""
    verify: str = "step"
    """Verifier granularity: "step" or "attempt"."""
    middleware: str = "default"
    """"default", "none" or the path of a YAML intercept file."""
    relevance: bool = False
    """Relevance before selection."""
    messages: bool = True
    """Messages between primitives."""
    validation: str = "default"
    """Carried validation: "default", "none" or the path of a result-shapes file."""
    router_mode: str = router.DEFAULT_MODE
    """The Router's mode: "plan" (whole-plan dispatch) or "step" (one call per step)."""

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "LoopPolicy":
        return cls(budget=args.budget, verify=args.verify, middleware=args.middleware, relevance=args.relevance,
                   messages=not args.no_messages, validation=args.validation, router_mode=args.router_mode)

    def loop_fields(self) -> dict[str, Any]:
        """The ``heart.loop.LoopConfig`` fields this policy sets."""
        return {"replan_budget": self.budget, "verify": self.verify, "middleware": self.middleware,
                "relevance": self.relevance, "messages": self.messages, "validation": self.validation,
                "router_mode": self.router_mode}

    def check_files(self, catalog) -> None:
        """Refuse, before any episode runs, a --middleware file that does not fit ``catalog``
        (the environment's tools) or a --validation file that is not a result-shapes file
        (MiddlewareError / ShapesFormatError: UserErrors naming the file and field)."""
        from heart.middleware import load_middleware

        load_middleware(self.middleware, catalog=catalog)
        if self.validation not in ("default", "none"):
            from heart.validation import load_result_shapes

            load_result_shapes(self.validation)

    def record(self) -> dict[str, Any]:
        """The policy as run folders record it: a file named by --middleware or --validation
        with the sha256 of its content, so an edited file counts as another policy."""
        return {**asdict(self), "middleware_sha256": _file_sha256("--middleware", self.middleware),
                "validation_sha256": _file_sha256("--validation", self.validation)}


def _file_sha256(flag: str, value: str) -> str | None:
    """The content hash of the file ``value`` names (None for the keywords default and none)."""
    if value in ("default", "none"):
        return None
    try:
        return hashlib.sha256(Path(value).read_bytes()).hexdigest()
    except OSError as err:
        raise ValueError(f"{flag} {value}: cannot read it ({err.strerror})") from None


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


def collect_arguments(parser: argparse.ArgumentParser) -> None:
    """``heart collect`` / ``python -m heart_distill.data.collect``."""
    parser.add_argument("--env", required=True, choices=["bfcl", "agentdojo"])
    parser.add_argument("--category", default=None,
                        help="bfcl: the multi-turn category (multi_turn_base by default, multi_turn_long_context, "
                             "multi_turn_miss_param: the user withholds a parameter until asked)")
    parser.add_argument("--split", default="train", choices=["train", "dev", "test"])
    parser.add_argument("--teacher", default="gold", help="gold | openai:<url>#<model> | hf:<model>")
    parser.add_argument("--fault-rate", type=probability, default=0.0,
                        help="gold teacher: chance that a dispatch carries an injected fault (default 0)")
    parser.add_argument("--out", required=True, help="run folder (traces/, manifest.json)")
    parser.add_argument("--seeds", type=nonnegative_int, nargs="+", default=[0], help="one episode per task per seed")
    loop_policy_arguments(parser)
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
