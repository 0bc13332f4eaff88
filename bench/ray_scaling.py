"""Collection throughput on Ray: 2 worker actors against 1, and the local executor, in one run.

    python bench/ray_scaling.py                              # BFCL train, gold teacher, 2 seeds
    python bench/ray_scaling.py --limit 40 --repeats 1 --out runs/bench/ray_quick.json

Starts one local Ray instance (``--cpus``, default every core), then runs the same gold
collection (``heart collect --teacher gold --fault-rate 0.3``) into a fresh folder per arm:
``--executor ray --workers 1``, ``--executor ray --workers 2`` and the local executor (threads
in this process), arms interleaved A B C C B A over ``--repeats`` rounds so drift in the
machine's load falls on every arm alike. Each arm's wall time runs from the command's start
to its last episode: Ray's actor start-up (each worker imports the loop and loads the
environment) counts, as a user pays it. Written to ``--out`` (default
``runs/bench/ray_scaling.json``) under the run's provenance stamp, with episodes/s per arm and
the ratios 2 workers / 1 worker and 2 workers / local.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from heart.traces import read_trace  # noqa: E402  (after the path insert)
from heart_distill.cli import build_parser as heart_parser  # noqa: E402
from heart_distill.eval.provenance import stamp, write_stamped_json  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "runs" / "bench" / "ray_scaling.json"
"""Where a run's result goes by default (runs/ is not tracked)."""
ARMS = {"ray_1_worker": ["--executor", "ray", "--workers", "1"],
        "ray_2_workers": ["--executor", "ray", "--workers", "2"],
        "local": []}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env", default="bfcl", choices=["bfcl", "agentdojo"])
    parser.add_argument("--limit", type=int, default=0, help="first N train tasks (0: the whole split)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--concurrency", type=int, default=4, help="episodes at once per worker (and locally)")
    parser.add_argument("--shard-size", type=int, default=16)
    parser.add_argument("--cpus", type=int, default=None, help="CPUs of the Ray instance (default: every core)")
    parser.add_argument("--repeats", type=int, default=2, help="rounds of the interleaved arms")
    parser.add_argument("--out", type=Path, default=OUT, help="result JSON, stamped (default: %(default)s)")
    return parser


def run_arm(args: argparse.Namespace, extra: list[str], folder: Path) -> dict:
    argv = ["collect", "--env", args.env, "--split", "train", "--teacher", "gold", "--fault-rate", "0.3",
            "--seeds", *map(str, args.seeds), "--concurrency", str(args.concurrency), "--out", str(folder),
            *(["--limit", str(args.limit)] if args.limit else []),
            *(["--shard-size", str(args.shard_size)] if extra else []), *extra]
    command = heart_parser().parse_args(argv)
    started = time.perf_counter()
    with contextlib.redirect_stderr(io.StringIO()):  # the per-run summaries; the result says it all
        status = command.func(command)
    wall = time.perf_counter() - started
    episodes = [row["episode_id"] for shard in (folder / "traces").glob("*.jsonl") for row in read_trace(shard)
                if row["kind"] == "episode"]
    if status != 0 or len(episodes) != len(set(episodes)):
        raise SystemExit(f"error: {' '.join(extra) or 'local'}: exit {status}, {len(episodes)} episode records "
                         f"({len(set(episodes))} distinct)")
    return {"wall_s": round(wall, 3), "episodes": len(episodes), "episodes_per_s": round(len(episodes) / wall, 3)}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import ray

    ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    resources = ray.cluster_resources()
    order = list(ARMS) + list(reversed(ARMS))
    runs: dict[str, list[dict]] = {name: [] for name in ARMS}
    try:
        with tempfile.TemporaryDirectory(prefix="ray-scaling-") as scratch:
            for round_ in range(args.repeats):
                for index, name in enumerate(order):
                    result = run_arm(args, ARMS[name], Path(scratch) / f"{round_}-{index}-{name}")
                    runs[name].append(result)
                    print(f"{name}: {result['episodes']} episodes in {result['wall_s']:.1f} s "
                          f"({result['episodes_per_s']:.2f}/s)", file=sys.stderr)
    finally:
        ray.shutdown()
    counts = {r["episodes"] for rs in runs.values() for r in rs}
    if len(counts) != 1:
        raise SystemExit(f"error: the arms wrote different numbers of episodes: {counts}")
    rate = {name: statistics.median(r["episodes_per_s"] for r in rs) for name, rs in runs.items()}
    result = {
        "settings": {"env": args.env, "limit": args.limit, "seeds": args.seeds, "concurrency": args.concurrency,
                     "shard_size": args.shard_size, "repeats": args.repeats, "teacher": "gold, fault rate 0.3",
                     "ray_cpus": resources.get("CPU")},
        "episodes_per_arm": counts.pop(),
        "episodes_per_s_median": {name: round(value, 3) for name, value in rate.items()},
        "ratio_2_workers_over_1": round(rate["ray_2_workers"] / rate["ray_1_worker"], 3),
        "ratio_2_workers_over_local": round(rate["ray_2_workers"] / rate["local"], 3),
        "runs": runs,
        "note": "wall time from the command's start to its last episode, Ray actor start-up included; "
                "medians over the repeats of each arm",
    }
    path = write_stamped_json(args.out, result, stamp(argv))
    print(f"2 workers / 1 worker: {result['ratio_2_workers_over_1']:.2f}x; 2 workers / local: "
          f"{result['ratio_2_workers_over_local']:.2f}x  → {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
