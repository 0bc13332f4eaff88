"""CPU training throughput: a plain SmolLM2 recipe vs the shipped one, one epoch of the same rows each.

"Plain recipe" is LoRA r=8, dropout 0.05, on every linear layer of all 30 layers, batch 2
padded, full system prompt, every position through the LM head; "shipped" is
recipes/smollm2-135m/<role>.yaml (LoRA without dropout on the top layers only,
one example per micro-batch with gradients accumulated over 2, short system prompt, only the
labelled positions through the LM head); "shipped, full head" is the shipped recipe with every
position through the LM head (TRL's default off CUDA), to isolate that change. Each runs
``python -m heart_distill.train.sft`` in their own process, one after the other, on the same N rows of the
same role dataset for exactly one epoch, with the same max_length (no row dropped by either).
Tokens are the trainer's non-padding input tokens over its train_runtime; examples/s is the
epoch's rows over the same runtime (what decides whether an epoch fits the budget).

    python bench/train_throughput.py [--data runs/NAME/datasets/planner] [--examples 8] [--role planner]

Without --data the rows are synthetic (train.synthetic, full-prompt rows). The machine may be
shared: the two runs see the same contention only roughly, so repeat and compare ratios. What
it prints also goes to ``--out`` (default ``runs/bench/train_throughput.txt``) under the run's
provenance stamp; curated results live in ``bench/results/``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from heart_distill.eval.provenance import add_printed_out_argument, stamp, stamped_stdout  # noqa: E402  (after the path insert)

OUT = REPO / "runs" / "bench" / "train_throughput.txt"
"""Where a run's output goes by default (runs/ is not tracked)."""

# The plain recipe, as overrides of the shipped file: what each CPU speed-up is measured against.
TODAY = ["lora.top_layers=0", "lora.target_modules=all-linear", "lora.dropout=0.05", "sft.padding_free=false",
         "sft.batch_size=2", "sft.head_on_labels_only=false", "sft.grad_accum=1", "data.system_prompt=full"]
# The shipped recipe with TRL's CPU default of projecting every position through the LM head: isolates that change.
FULL_HEAD = ["sft.head_on_labels_only=false"]


def run_recipe(role: str, data: str, out: str, examples: int, max_length: int, extra: list[str]) -> dict:
    command = [sys.executable, "-m", "heart_distill.train.sft", "--recipe", f"recipes/smollm2-135m/{role}.yaml",
               f"data.dataset_dir={data}", f"output.dir={out}", f"data.max_train_examples={examples}",
               "data.max_eval_examples=1", "sft.max_steps=-1", "sft.epochs=1", f"sft.max_length={max_length}",
               "sft.save_steps=100000", "sft.logging_steps=1", *extra]
    subprocess.run(command, cwd=REPO, check=True, stdout=subprocess.DEVNULL)
    manifest = json.loads((Path(out) / "manifest.json").read_text())
    metrics = manifest["metrics"]
    metrics["examples"] = manifest["dataset"]["sizes"]["train"]
    metrics["examples_per_s"] = metrics["examples"] / metrics["train_runtime_s"]
    return metrics


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", help="a role dataset folder (default: synthetic rows)")
    parser.add_argument("--role", default="planner")
    parser.add_argument("--examples", type=int, default=8, help="rows trained on, one epoch")
    parser.add_argument("--max-length", type=int, default=4096, help="same for both; no row is dropped")
    add_printed_out_argument(parser, OUT)
    return parser


def main() -> None:
    args = build_parser().parse_args()
    with stamped_stdout(args.out, stamp(script=__file__)):
        measure(args)


def measure(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        data = args.data
        if not data:
            from heart_distill.train.synthetic import write_synthetic_role_dataset

            data = str(write_synthetic_role_dataset(tmp, args.role, args.examples, 2, compact=False))
        results = {}
        for name, extra in (("plain recipe", TODAY), ("shipped, full head", FULL_HEAD), ("shipped recipe", [])):
            results[name] = run_recipe(args.role, data, f"{tmp}/{len(results)}", args.examples, args.max_length, extra)
            print(f"{name}: done in {results[name]['train_runtime_s']:.0f} s", file=sys.stderr, flush=True)

    print(f"{args.role}, {args.examples} rows, one epoch each ({data if args.data else 'synthetic'})")
    print(f"{'':16} {'epoch s':>8} {'examples/s':>11} {'tokens/s':>9} {'tokens':>7} {'loss first→last':>17}")
    for name, m in results.items():
        print(f"{name:16} {m['train_runtime_s']:8.1f} {m['examples_per_s']:11.3f} {m['tokens_per_s']:9.1f} "
              f"{m['tokens_seen']:7d} {m['train_loss_first']:8.3f}→{m['train_loss_last']:<8.3f}")
    old = results["plain recipe"]
    for name in ("shipped, full head", "shipped recipe"):
        new = results[name]
        print(f"ratio {name} / plain: examples/s {new['examples_per_s'] / old['examples_per_s']:.2f}x, "
              f"tokens/s {new['tokens_per_s'] / old['tokens_per_s']:.2f}x")


if __name__ == "__main__":
    main()
