"""Argument definitions of commands whose implementation is heavy to import.

``heart --help`` and every ``heart`` command build the whole parser first; defining a
command's options here keeps that from importing the command's implementation (importing
``heart_distill.data.collect`` costs ~0.7-1.1 s on the 2-core machine: the loop, ToolFace,
the roles), which is imported inside the command only.
"""

from __future__ import annotations

import argparse

from heart.argtypes import nonnegative_int, positive_int, probability


def loop_policy_arguments(parser: argparse.ArgumentParser) -> None:
    """How the loop runs a turn, shared by ``heart collect``, ``heart run`` and their kin:
    re-plan budget, Verifier granularity, tool-boundary middleware."""
    parser.add_argument("--budget", type=nonnegative_int, default=3, help="re-plan budget B (default 3)")
    parser.add_argument("--verify", default="step", choices=["step", "attempt"],
                        help="Verifier granularity: per step (Algorithm 1, default) or per whole attempt")
    parser.add_argument("--middleware", default="default", metavar="PATH|default|none",
                        help="tool-boundary middleware (docs/middleware.md): default (the shipped silent "
                             "corrections), none (arguments bound as given), or a YAML intercept file")


def collect_arguments(parser: argparse.ArgumentParser) -> None:
    """``heart collect`` / ``python -m heart_distill.data.collect``."""
    parser.add_argument("--env", required=True, choices=["bfcl", "agentdojo"])
    parser.add_argument("--split", default="train", choices=["train", "dev", "test"])
    parser.add_argument("--teacher", default="gold", help="gold | openai:<url>#<model> | hf:<model>")
    parser.add_argument("--fault-rate", type=probability, default=0.0,
                        help="gold teacher: chance that a dispatch carries an injected fault (default 0)")
    parser.add_argument("--out", required=True, help="run folder (traces/, manifest.json)")
    parser.add_argument("--seeds", type=nonnegative_int, nargs="+", default=[0], help="one episode per task per seed")
    loop_policy_arguments(parser)
    parser.add_argument("--concurrency", type=positive_int, default=8, help="episodes run at once")
    parser.add_argument("--quantize", choices=["int8"], default=None,
                        help="hf teacher: int8 dynamic-quantised base linears (LoRA kept exact)")
    parser.add_argument("--max-batch-size", type=positive_int, default=8,
                        help="hf teacher: most role calls served in one batch across episodes")
    parser.add_argument("--limit", type=nonnegative_int, default=0,
                        help="only the first N tasks of the split (default 0: all)")
    parser.add_argument("--resume", action="store_true", help="continue a killed run in --out")
