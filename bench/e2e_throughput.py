"""End-to-end throughput: episodes per hour at a few episodes in flight against a full engine.

    python bench/e2e_throughput.py                      # the committed role-benchmark adapters
    python bench/e2e_throughput.py --adapters runs/smollm2-benchmark/adapters --limit 16 --arms 4 16
    python bench/e2e_throughput.py --limit 8 --arms 4:scattered 16   # against the engine before contiguous slots

Each arm runs ``heart eval e2e``'s own runner (:func:`eval.e2e.run_sides`) on the same tasks
(the first ``--limit`` BFCL ``--category`` test tasks), both sides at once — the distilled
``--adapters`` and the unadapted base on one in-process engine (``--engine``, default
llamacpp:f16, the benchmark's) — with ``--arms`` episodes in flight per side: 4 is what every
run used before the engine's default (:data:`eval.e2e.EPISODES_IN_FLIGHT`), the others fill
the engine. An arm written ``N:scattered`` takes slots by cached prefix alone, as the engine
did before it kept each context's busy slots consecutive
(:attr:`heart.runtime.llamacpp.LlamaCppBackend.contiguous_slots`): llama.cpp then decodes
each scattered row in its own micro-batch. The arms run one after another in one process, so
they share the machine's state; the figure to read is the ratio of episodes per hour, beside the engine's mean rows per
decoding step (what batching bought). Greedy decoding gives every arm the same answers up to
the order in which calls share batches, so the success rates of the arms are printed beside
it as a check, not a result.

What it prints also goes to ``--out`` (default ``runs/bench/e2e_throughput.json``) under the
run's provenance stamp; curated results live in ``bench/results/``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from heart_distill.eval.provenance import stamp, usable_cores, write_stamped_json  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "runs" / "bench" / "e2e_throughput.json"
ADAPTERS = REPO / "docs" / "results" / "role-benchmark" / "adapters"
"""The committed role-benchmark adapters (the Router in step mode)."""


def build_parser() -> argparse.ArgumentParser:
    from heart.argtypes import positive_int
    from heart.runtime.engines import ENGINE_SPECS

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--adapters", default=str(ADAPTERS), help="the distilled side's adapters folder "
                                                                 "(default: the committed role-benchmark ones)")
    parser.add_argument("--category", default="multi_turn_base")
    parser.add_argument("--limit", type=positive_int, default=16, help="first N BFCL test tasks (per side)")
    parser.add_argument("--arms", type=arm_spec, nargs="+", default=[(4, True), (16, True)],
                        help="episodes in flight per side, N or N:scattered (slots chosen by cached prefix alone)")
    parser.add_argument("--engine", choices=ENGINE_SPECS, default="llamacpp:f16")
    parser.add_argument("--max-plan-steps", type=positive_int, default=4)
    parser.add_argument("--router-mode", choices=["plan", "step"], default="step")
    parser.add_argument("--out", type=Path, default=OUT)
    return parser


def arm_spec(text: str) -> tuple[int, bool]:
    """``N`` or ``N:scattered`` → (episodes in flight per side, contiguous slots)."""
    count, _, policy = text.partition(":")
    if policy not in ("", "scattered") or not count.isdigit() or int(count) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected N or N:scattered with N >= 1")
    return int(count), policy != "scattered"


def run_arm(args: argparse.Namespace, in_flight: int, contiguous: bool, folder: Path) -> dict:
    """One arm: both sides on the same tasks with ``in_flight`` episodes each."""
    from heart.runtime.llamacpp import LlamaCppBackend
    from heart.settings import LoopConfig
    from heart_distill.eval.e2e import E2EConfig, run_sides
    from heart_distill.eval.models import with_base_side

    LlamaCppBackend.contiguous_slots = contiguous  # read when the arm's engine makes its contexts

    config = E2EConfig(env="bfcl", out=str(folder / "distilled"), category=args.category, roles_spec=args.adapters,
                       limit=args.limit, concurrency=in_flight, engine=args.engine,
                       loop=LoopConfig(max_plan_steps=args.max_plan_steps, router_mode=args.router_mode))
    distilled, base = run_sides(with_base_side(config, str(folder / "base")))
    throughput = distilled["throughput"]
    return {"episodes_in_flight_per_side": in_flight, "contiguous_slots": contiguous,
            "episodes": throughput["episodes_run"],
            "wall_s": distilled["counts"]["wall_s"], "episodes_per_hour": throughput["episodes_per_hour"],
            "batching": throughput["batching"],
            "success": {"distilled": distilled["figures"]["success_rate"]["value"],
                        "base": base["figures"]["success_rate"]["value"]},
            "errored": distilled["counts"]["errored"] + base["counts"]["errored"]}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    run_stamp = stamp(argv, __file__)
    arms = []
    with tempfile.TemporaryDirectory(prefix="e2e-throughput-") as tmp:
        for i, (in_flight, contiguous) in enumerate(args.arms):
            arm = run_arm(args, in_flight, contiguous, Path(tmp) / f"arm-{i}")
            arms.append(arm)
            b = arm["batching"] or {}
            print(f"  {_label(arm):>14}: {arm['episodes']} episodes in {arm['wall_s']:.0f} s, "
                  f"{arm['episodes_per_hour']} episodes/hour, {b.get('rows_per_step')} rows per decoding step "
                  f"(max {b.get('max_rows')}), {b.get('ms_per_step')} ms a step; model {b.get('prefill_s')} s "
                  f"prefilling, {b.get('step_s')} s stepping; success distilled {arm['success']['distilled']:.2f}, "
                  f"base {arm['success']['base']:.2f}", flush=True)
    reference = arms[0]["episodes_per_hour"]
    for arm in arms:
        arm["over_first_arm"] = round(arm["episodes_per_hour"] / reference, 2) if reference else None
    report = {"engine": args.engine, "category": args.category, "tasks_per_side": args.limit,
              "adapters": args.adapters, "max_plan_steps": args.max_plan_steps, "router_mode": args.router_mode,
              "cpus": usable_cores(), "arms": arms}
    write_stamped_json(args.out, report, run_stamp, indent=1)
    ratios = ", ".join(f"{a['over_first_arm']}x at {_label(a)}" for a in arms)
    print(f"e2e_throughput: episodes per hour over the first arm: {ratios}; wrote {args.out}")
    return 0


def _label(arm: dict) -> str:
    return f"{arm['episodes_in_flight_per_side']}{'' if arm['contiguous_slots'] else ':scattered'} in flight"


if __name__ == "__main__":
    sys.exit(main())
