"""Capacity and schedule of one role, chosen on its validation rows (never on test).

    python bench/role_sweep.py --datasets runs/smollm2-benchmark/datasets --role planner \\
        --variant lr1e-3:sft.learning_rate=1e-3 --variant ep2:sft.learning_rate=1e-3,sft.epochs=2

Each ``--variant NAME:KEY=VALUE,...`` trains the role's adapter on every train row of
``<datasets>/<role>`` with the CPU recipe (``recipes/smollm2-135m/roles.yaml``) and those
overrides, then scores it with ``heart eval roles`` on the same dataset's *validation* split
(tasks disjoint from training; the test split is read once, by the benchmark). Per variant:
the role's primary metric with its interval and n, every other figure, training wall time.
A variant whose evaluation is already in ``--work`` is read back, not run again (a killed sweep
resumes). Written to ``--out`` (default ``runs/bench/role_sweep_<role>.json``) under the run's
provenance stamp; at n of a few dozen validation rows, variants whose intervals overlap are
not told apart.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from heart import ROLES  # noqa: E402  (after the path insert)
from heart_distill.eval.provenance import stamp, write_stamped_json  # noqa: E402
from heart_distill.eval.metrics import HEADLINE  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "smollm2-135m" / "roles.yaml"
DEFAULT_VARIANTS = ("lr1e-3:sft.learning_rate=1e-3", "lr2e-3:sft.learning_rate=2e-3",
                    "ep2:sft.learning_rate=1e-3,sft.epochs=2", "layers16:sft.learning_rate=1e-3,lora.top_layers=16")
"""The benchmark's schedule (lr 1e-3, one epoch, r = 8 on the top 8 layers) and one step away
from it along the learning rate, the epochs and the layers."""


def parse_variant(text: str) -> tuple[str, list[str]]:
    """``NAME:KEY=VALUE,KEY=VALUE`` → (NAME, ["KEY=VALUE", ...]); a bad one is a clear error."""
    name, _, overrides = text.partition(":")
    items = [o for o in overrides.split(",") if o]
    if not name or not name.replace("-", "").replace("_", "").replace(".", "").isalnum():
        raise argparse.ArgumentTypeError(f"variant {text!r}: its name (before ':') must be letters, digits, - _ .")
    bad = [o for o in items if "=" not in o or "." not in o.split("=", 1)[0]]
    if bad:
        raise argparse.ArgumentTypeError(f"variant {text!r}: {bad[0]!r} is not section.key=value")
    return name, items


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--datasets", type=Path, default=REPO / "runs" / "smollm2-benchmark" / "datasets",
                        help="role datasets folder (<datasets>/<role>; default: the benchmark's)")
    parser.add_argument("--role", default="planner", choices=ROLES)
    parser.add_argument("--variant", type=parse_variant, action="append", default=None,
                        help="NAME:KEY=VALUE,... recipe overrides (repeatable; default: "
                             + " ".join(DEFAULT_VARIANTS) + ")")
    parser.add_argument("--trained", action="append", default=[], metavar="NAME=ADAPTERS",
                        help="variant NAME is already trained: its adapters folder (<ADAPTERS>/<role>), "
                             "e.g. the benchmark's own; evaluated, not trained again")
    parser.add_argument("--train-data", action="append", default=[], metavar="NAME=DATASETS",
                        help="variant NAME trains on another role datasets folder's train rows (a data "
                             "variant: another collection), and is scored on --datasets' validation rows "
                             "like the others; their validation tasks must not be its train tasks (checked)")
    parser.add_argument("--limit", type=int, default=0, help="validation rows scored (0: all)")
    parser.add_argument("--engine", default="llamacpp:f16")
    parser.add_argument("--work", type=Path, default=REPO / "runs" / "bench" / "role_sweep",
                        help="adapters and evaluations, one folder per variant")
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "bench" / "role_sweep.json",
                        help="result JSON, stamped, one entry per role swept (default: %(default)s)")
    return parser


def run(command: list[str]) -> None:
    from heart_distill.pipeline import heart_argv

    print("role_sweep: $ " + " ".join(command), flush=True)
    subprocess.run(heart_argv(command), check=True, cwd=REPO)  # this interpreter's heart, whatever PATH holds


def check_disjoint(train_data: Path, datasets: Path, role: str) -> None:
    """ValueError when a validation task of ``datasets`` is a train task of ``train_data``."""
    from datasets import load_from_disk

    def tasks(folder: Path, split: str) -> set[tuple[str, str]]:
        rows = load_from_disk(str(folder / role))[split]
        return set(zip(rows["env"], rows["task_id"]))

    shared = tasks(train_data, "train") & tasks(datasets, "validation")
    if shared:
        raise ValueError(f"{train_data} trains on {len(shared)} validation task(s) of {datasets}, "
                         f"e.g. {sorted(shared)[:3]}")


def run_variant(args: argparse.Namespace, name: str, overrides: list[str], trained: Path | None = None,
                train_data: Path | None = None) -> dict:
    folder = args.work / args.role / name
    adapters = trained or folder / "adapters"
    evaluated = folder / "eval" / "roles.json"
    recorded = folder / "variant.json"
    if evaluated.is_file() and recorded.is_file() and json.loads(recorded.read_text())["overrides"] == overrides:
        print(f"role_sweep: {name}: evaluated before, read back", flush=True)
        train_s = json.loads(recorded.read_text()).get("train_s")
    else:
        folder.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        if trained is None:
            run(["heart", "train", "--recipe", str(RECIPE), "--roles", args.role,
                 f"data.dataset_dir={(train_data or args.datasets) / args.role}", f"output.dir={adapters / args.role}",
                 "output.overwrite=true", "data.max_train_examples=0", *overrides])
        train_s = round(time.perf_counter() - started, 1) if trained is None else None
        run(["heart", "eval", "roles", "--data", str(args.datasets), "--split", "validation",
             "--adapters", str(adapters), "--only", args.role, "--engine", args.engine,
             "--batch-size", "16", *(["--limit", str(args.limit)] if args.limit else []),
             "--out", str(folder / "eval")])
        recorded.write_text(json.dumps({"overrides": overrides, "train_s": train_s}) + "\n")
    figures = json.loads(evaluated.read_text())["figures"][args.role]
    return {"name": name, "overrides": overrides, "train_data": str(train_data or args.datasets), "train_s": train_s,
            "primary": HEADLINE[args.role], "primary_figure": figures[HEADLINE[args.role]], "figures": figures}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    run_stamp = stamp(argv, __file__)
    if not (args.datasets / args.role).is_dir():
        print(f"error: no role dataset {args.datasets / args.role}", file=sys.stderr)
        return 2
    variants = args.variant or [parse_variant(v) for v in DEFAULT_VARIANTS]
    trained = dict(t.split("=", 1) for t in args.trained if "=" in t)
    unknown = set(trained) - {name for name, _ in variants}
    if unknown or len(trained) != len(args.trained):
        print(f"error: --trained must be NAME=ADAPTERS for a variant's NAME, got {args.trained}", file=sys.stderr)
        return 2
    train_data = {name: Path(folder) for name, folder in (t.split("=", 1) for t in args.train_data if "=" in t)}
    if set(train_data) - {name for name, _ in variants} or len(train_data) != len(args.train_data):
        print(f"error: --train-data must be NAME=DATASETS for a variant's NAME, got {args.train_data}", file=sys.stderr)
        return 2
    for folder in train_data.values():
        try:
            check_disjoint(folder, args.datasets, args.role)
        except (ValueError, FileNotFoundError) as err:
            print(f"error: --train-data: {err}", file=sys.stderr)
            return 2
    results = [run_variant(args, name, overrides, Path(trained[name]) if name in trained else None,
                           train_data.get(name)) for name, overrides in variants]
    best = max(results, key=lambda r: r["primary_figure"]["value"] or 0.0)
    out = args.out
    # one file for every role swept: another role's entry (and its stamp) is kept as it was
    roles = json.loads(out.read_text()).get("roles", {}) if out.is_file() else {}
    roles[args.role] = {"stamp": run_stamp, "datasets": str(args.datasets), "split": "validation",
                        "variants": results, "best": best["name"]}
    write_stamped_json(out, {"roles": roles}, run_stamp)
    for r in results:
        f = r["primary_figure"]
        trained_in = f"trained in {r['train_s']} s" if r["train_s"] is not None else "trained before"
        print(f"  {r['name']:<16} {r['primary']} {100 * f['value']:.1f} [{100 * f['low']:.1f}, {100 * f['high']:.1f}] "
              f"(n={f['n']}), {trained_in}")
    print(f"role_sweep: best on validation: {best['name']}; wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
