"""Training throughput of train.sft vs a plain TRL SFT script, side by side in one run.

Both train the same synthetic role data with the same settings (SmolLM2-135M fp32, LoRA r=8
all-linear, assistant-only loss, same batch/length/steps/seed), each in its own process, one
after the other. Both count tokens the same way: the trainer's non-padding input tokens
(include_num_input_tokens_seen="non_padding") over its train_runtime.

    python bench/train_throughput.py [--steps 8] [--role planner] [--full-prompt]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def plain_trl(dataset_dir: str, out: str, steps: int, batch: int, max_length: int) -> dict:
    """The ~30-line baseline: what one would write with TRL + peft and nothing of ours."""
    import resource

    from datasets import load_from_disk
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    from heart.models import prepare_smollm2
    from train.templates import template_path

    base = str(prepare_smollm2())
    tokenizer = AutoTokenizer.from_pretrained(base)
    tokenizer.chat_template = template_path("smollm2.jinja").read_text()  # assistant_only_loss needs markers
    data = load_from_disk(dataset_dir)
    model = AutoModelForCausalLM.from_pretrained(base, dtype="float32", attn_implementation="sdpa")
    config = SFTConfig(output_dir=out, assistant_only_loss=True, max_length=max_length, max_steps=steps,
                       learning_rate=5e-4, per_device_train_batch_size=batch, logging_steps=1, save_strategy="no",
                       seed=0, bf16=False, gradient_checkpointing=False, use_cpu=True, report_to="none",
                       include_num_input_tokens_seen="non_padding")
    trainer = SFTTrainer(model=model, args=config, train_dataset=data["train"].select_columns(["messages"]),
                         processing_class=tokenizer,
                         peft_config=LoraConfig(r=8, lora_alpha=16, lora_dropout=0.05, target_modules="all-linear",
                                                task_type="CAUSAL_LM"))
    result = trainer.train()
    runtime = result.metrics["train_runtime"]
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    return {"steps": trainer.state.global_step, "train_runtime_s": runtime,
            "tokens_seen": trainer.state.num_input_tokens_seen,
            "tokens_per_s": trainer.state.num_input_tokens_seen / runtime,
            "steps_per_s": trainer.state.global_step / runtime, "train_loss_first": losses[0],
            "train_loss_last": losses[-1], "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def ours(dataset_dir: str, out: str, steps: int, batch: int, max_length: int, role: str) -> dict:
    command = [sys.executable, "-m", "train.sft", "--recipe", f"recipes/smollm2-135m/{role}.yaml",
               f"data.dataset_dir={dataset_dir}", f"output.dir={out}", f"sft.max_steps={steps}",
               f"sft.batch_size={batch}", f"sft.max_length={max_length}", "sft.learning_rate=5e-4",
               "sft.warmup_ratio=0", "sft.lr_scheduler=linear", "sft.save_steps=1000", "sft.logging_steps=1"]
    subprocess.run(command, cwd=REPO, check=True, stdout=subprocess.DEVNULL)
    return json.loads((Path(out) / "manifest.json").read_text())["metrics"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--max-length", type=int, default=1024)
    parser.add_argument("--role", default="planner")
    parser.add_argument("--full-prompt", action="store_true", help="full system prompt (default: compact rows)")
    parser.add_argument("--plain", nargs=2, metavar=("DATASET", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.plain:  # child process of the baseline
        print(json.dumps(plain_trl(args.plain[0], args.plain[1], args.steps, args.batch, args.max_length)))
        return

    from train.synthetic import write_synthetic_role_dataset

    with tempfile.TemporaryDirectory() as tmp:
        data = str(write_synthetic_role_dataset(tmp, args.role, 4 * args.steps * args.batch, 2,
                                                compact=not args.full_prompt))
        ours_metrics = ours(data, f"{tmp}/ours", args.steps, args.batch, args.max_length, args.role)
        child = subprocess.run([sys.executable, __file__, "--plain", data, f"{tmp}/plain", "--steps", str(args.steps),
                                "--batch", str(args.batch), "--max-length", str(args.max_length)],
                               cwd=REPO, check=True, capture_output=True, text=True, env={**os.environ})
        plain_metrics = json.loads(child.stdout.strip().splitlines()[-1])

    print(f"{'':14} {'steps/s':>8} {'tokens/s':>9} {'loss first→last':>17} {'peak RSS MB':>12}")
    for name, m in (("train.sft", ours_metrics), ("plain TRL", plain_metrics)):
        print(f"{name:14} {m['steps_per_s']:8.3f} {m['tokens_per_s']:9.1f} "
              f"{m['train_loss_first']:8.3f}→{m['train_loss_last']:<8.3f} {m['peak_rss_mb']:12.0f}")
    print(f"ratio train.sft / plain TRL tokens/s: {ours_metrics['tokens_per_s'] / plain_metrics['tokens_per_s']:.3f}")


if __name__ == "__main__":
    main()
