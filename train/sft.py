"""LoRA SFT of one HEART role on a shared frozen base; writes a servable adapter folder.

    accelerate launch -m heart_distill.train.sft --recipe recipes/smollm2-135m/planner.yaml [section.key=value ...]
    python -m heart_distill.train.sft --recipe recipes/smollm2-135m/planner.yaml sft.max_steps=5
    python -m heart_distill.train.sft --recipe planner.yaml --recipe router.yaml output.dir=runs/x/adapters/{role}

Several ``--recipe``s train one after another in one process: on a CPU, starting Python and
importing torch, transformers and TRL costs ~15 s per process, a tenth of a small role's
training. ``{role}`` in an override's value is replaced by each recipe's ``data.role``.

A killed run rerun with the same output.dir resumes from its last checkpoint (output.dir/checkpoints);
a finished output.dir (it holds manifest.json) is refused unless output.overwrite=true.
``--stop-after MINUTES`` stops a training that would outlast a time slot at the first optimizer
step past it, with a checkpoint, and exits with :data:`PAUSED`: the same command run again
resumes there, so a long training runs in slots of a bounded length.
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import shutil
import sys
import time
import warnings
from pathlib import Path

from heart.progress import quiet_console, quiet_library_bars
from heart_distill.train.config import RecipeError, load_recipe, role_overrides

PAUSED = 75
"""Exit status of a training ``--stop-after`` stopped at a checkpoint (sysexits' EX_TEMPFAIL:
run the same command again to resume)."""
PAUSE_MARKER = "paused.json"
"""Written to ``<output.dir>/checkpoints`` when ``--stop-after`` stops a training, removed when
it resumes: what tells a launcher the pause apart from a failure (``accelerate launch`` exits
1 for any non-zero status of its child)."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", required=True, action="append",
                        help="recipe YAML (recipes/<model>/<role>.yaml); repeat it to train several roles in "
                             "this one process, one after another")
    parser.add_argument("overrides", nargs="*",
                        help="section.key=value, e.g. sft.max_steps=5; '{role}' in a value is each recipe's role")
    parser.add_argument("--stop-after", type=float, metavar="MINUTES", default=None,
                        help=f"stop at the first optimizer step after this many minutes, with a checkpoint, and exit "
                             f"{PAUSED}; run the same command again to resume (roles not started wait for that run)")
    args = parser.parse_args(argv)
    deadline = time.monotonic() + 60.0 * args.stop_after if args.stop_after is not None else None
    quiet_library_bars()
    # peft reads a model's is_gradient_checkpointing, which transformers 5 deprecates in favour
    # of is_activation_checkpointing: a note between two libraries, nothing a recipe can change
    warnings.filterwarnings("ignore", message=r".*is_gradient_checkpointing.*", category=FutureWarning)
    recipes = []
    for path in args.recipe:  # everything a recipe can get wrong fails here, before anything is loaded or written
        try:
            recipes.append(load_recipe(path, role_overrides(path, args.overrides)))
        except RecipeError as err:
            print(f"train.sft: {err}", file=sys.stderr)
            return 2
    for index, recipe in enumerate(recipes):
        if index and deadline is not None and time.monotonic() >= deadline:
            print(f"train.sft: --stop-after {args.stop_after:g} min reached; not started: "
                  f"{', '.join(r.data.role for r in recipes[index:])} (run the same command again)", file=sys.stderr)
            return PAUSED
        status = train_role(recipe, deadline)
        if status != 0:
            return status
    return 0


def stop_at_deadline(deadline: float):
    """A TrainerCallback that saves a checkpoint and stops at the first optimizer step past
    ``deadline`` (``time.monotonic()``); its ``stopped_at`` is that step, else None."""
    from transformers import TrainerCallback

    class StopAtDeadline(TrainerCallback):
        stopped_at: int | None = None

        def on_step_end(self, args, state, control, **kwargs):
            if time.monotonic() >= deadline and state.global_step < state.max_steps:
                control.should_save = control.should_training_stop = True
                self.stopped_at = state.global_step
            return control

    return StopAtDeadline()


def train_role(recipe, deadline: float | None = None) -> int:
    """Train one role's adapter from a loaded recipe and publish it to ``output.dir``; with a
    ``deadline`` (``time.monotonic()``) past which it stops at a checkpoint, :data:`PAUSED`."""
    import torch
    from peft import LoraConfig, PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.trainer_callback import PrinterCallback
    from transformers.trainer_utils import get_last_checkpoint
    from trl import SFTConfig, SFTTrainer

    from heart_distill.data.loss_mask import lint_loss_mask
    from heart.models import model_content_hash, read_manifest, resolve_model
    from heart_distill.train.adapter import (build_manifest, check_servable, linear_module_names, lora_placement,
                               publish_adapter, read_adapter_config)
    from heart_distill.train.role_data import drop_overlong, input_modes, joint_input_modes, load_role_dataset
    from heart_distill.train.templates import template_for

    checkpoints = Path(recipe.output.dir) / "checkpoints"
    if recipe.output.overwrite and (Path(recipe.output.dir) / "manifest.json").is_file() and checkpoints.is_dir():
        shutil.rmtree(checkpoints)  # kept checkpoints of the finished run: train again, do not resume it
    (checkpoints / PAUSE_MARKER).unlink(missing_ok=True)  # this run resumes the pause, or starts afresh

    base_path = resolve_model(recipe.model.name)
    tokenizer = AutoTokenizer.from_pretrained(base_path)
    tokenizer.chat_template = template_for(tokenizer)  # same text, plus {% generation %} markers
    splits, dataset_info = load_role_dataset(recipe.data)
    splits, dataset_info["dropped_overlong"] = drop_overlong(splits, tokenizer, recipe.sft.max_length)
    dataset_info["max_length"] = recipe.sft.max_length
    dataset_info["sizes"] = {name: len(split) for name, split in splits.items()}  # what is trained on
    label = f"joint adapter of {', '.join(recipe.data.joint_roles)}" if recipe.data.joint_roles else recipe.data.role
    dataset_info["input_modes"] = (joint_input_modes(recipe.data) if recipe.data.joint_roles
                                   else input_modes(recipe.data.role, splits["train"]))
    dropped = ", ".join(f"{name} {n}" for name, n in dataset_info["dropped_overlong"].items())
    if len(splits["train"]) == 0:
        print(f"train.sft: {label}: no train example fits sft.max_length={recipe.sft.max_length} "
              f"(over-long examples dropped: {dropped})", file=sys.stderr)
        return 2
    lint = lint_loss_mask(tokenizer, tokenizer.chat_template, splits["train"].select(range(min(16, len(splits["train"])))))
    print(f"train.sft: {label}: over-long examples (> {recipe.sft.max_length} tokens) dropped: {dropped}; "
          f"{lint}", file=sys.stderr)

    model = AutoModelForCausalLM.from_pretrained(base_path, dtype=getattr(torch, recipe.model.dtype),
                                                 attn_implementation=recipe.model.attn_implementation)
    linear_names = linear_module_names(model)
    lora, s, out = recipe.lora, recipe.sft, Path(recipe.output.dir)
    peft_config = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                             task_type="CAUSAL_LM", **lora_placement(lora, model, linear_names))
    if lora.init_from:  # continue an adapter of the same base (checked at load)
        model, peft_config = PeftModel.from_pretrained(model, lora.init_from, is_trainable=True), None

    quiet = quiet_console()
    config = SFTConfig(
        # drop_overlong already enforced max_length (dropping, not truncating); padding-free batches
        # refuse a max_length they cannot enforce themselves, so they get None.
        output_dir=str(out / "checkpoints"), assistant_only_loss=True, max_length=None if s.padding_free else s.max_length,
        num_train_epochs=s.epochs, max_steps=s.max_steps, learning_rate=s.learning_rate,
        lr_scheduler_type=s.lr_scheduler, warmup_steps=s.warmup_ratio, per_device_train_batch_size=s.batch_size,
        per_device_eval_batch_size=s.batch_size, gradient_accumulation_steps=s.grad_accum,
        logging_steps=s.logging_steps, logging_first_step=True, save_steps=s.save_steps,
        save_total_limit=s.save_total_limit, eval_strategy="steps" if s.eval_steps and "validation" in splits else "no",
        eval_steps=s.eval_steps or None, seed=s.seed, bf16=s.bf16, activation_checkpointing=s.gradient_checkpointing,
        use_cpu=s.use_cpu, include_num_input_tokens_seen="non_padding", report_to="none",
        padding_free=s.padding_free, disable_tqdm=quiet,
    )
    score_labelled_positions_only(s.head_on_labels_only)
    trainer = SFTTrainer(model=model, args=config, train_dataset=splits["train"], eval_dataset=splits.get("validation"),
                         processing_class=tokenizer, peft_config=peft_config)
    if quiet:  # off a terminal the per-step logs go to the adapter's training history, not the console
        trainer.remove_callback(PrinterCallback)
    checkpoint = get_last_checkpoint(config.output_dir) if Path(config.output_dir).is_dir() else None
    start_step = int(checkpoint.rsplit("-", 1)[1]) if checkpoint else 0
    tokens_before = json.loads((Path(checkpoint) / "trainer_state.json").read_text()).get(
        "num_input_tokens_seen", 0) if checkpoint else 0
    stopper = stop_at_deadline(deadline) if deadline is not None else None
    if stopper is not None:
        trainer.add_callback(stopper)
    result = trainer.train(resume_from_checkpoint=checkpoint)
    if stopper is not None and stopper.stopped_at is not None:
        (checkpoints / PAUSE_MARKER).write_text(json.dumps(
            {"step": stopper.stopped_at, "max_steps": trainer.state.max_steps}) + "\n")
        print(f"train.sft: {label}: stopped by --stop-after at step {stopper.stopped_at} of "
              f"{trainer.state.max_steps} with a checkpoint in {checkpoints}; run the same command again "
              f"to resume", file=sys.stderr)
        del trainer, model
        gc.collect()
        return PAUSED
    eval_metrics = trainer.evaluate() if "validation" in splits else {"eval_loss": None}

    if trainer.is_fsdp_enabled:  # checkpoints are sharded; the adapter we ship is one plain file
        trainer.accelerator.state.fsdp_plugin.set_state_dict_type("FULL_STATE_DICT")
    staged = out / "checkpoints" / "final"
    trainer.save_model(str(staged))
    if not trainer.accelerator.is_main_process:
        return 0
    adapter_config = read_adapter_config(staged)
    check_servable(adapter_config, recipe, linear_names)  # before anything in output.dir changes

    history = trainer.state.log_history
    train_losses = [e["loss"] for e in history if "loss" in e]
    tokens = trainer.state.num_input_tokens_seen - tokens_before
    runtime = result.metrics["train_runtime"]
    metrics = {
        "train_loss_first": train_losses[0], "train_loss_last": train_losses[-1],
        "train_loss_mean": result.metrics["train_loss"], "eval_loss": eval_metrics["eval_loss"],
        "steps": trainer.state.global_step, "resumed_from_step": start_step,
        "train_runtime_s": runtime, "steps_per_s": (trainer.state.global_step - start_step) / runtime,
        "tokens_seen": tokens, "tokens_per_s": tokens / runtime,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        # this process's GPU (rank 0 under FSDP/ZeRO-3): what sizes a GPU for the recipe
        "peak_gpu_memory_gb": torch.cuda.max_memory_allocated() / 1e9 if torch.cuda.is_available() else None,
    }
    base = {"name": recipe.model.name, "path": base_path, "content_hash": model_content_hash(base_path),
            "hf_id": (read_manifest(Path(base_path)) or {}).get("hf_id") if Path(base_path).is_dir() else base_path}
    lint_info = {"examples": lint.examples, "masked_tokens": lint.masked_tokens, "tokens": lint.tokens}
    publish_adapter(staged, out, build_manifest(recipe, adapter_config, base, dataset_info, metrics, lint_info), history)
    if not recipe.output.keep_checkpoints:
        shutil.rmtree(out / "checkpoints")
    print(f"train.sft: wrote {out} (loss {metrics['train_loss_first']:.3f} -> {metrics['train_loss_last']:.3f}, "
          f"{metrics['tokens_per_s']:.0f} tokens/s)", file=sys.stderr)
    del trainer, model  # the next role of this process starts from a fresh base
    gc.collect()
    return 0


def score_labelled_positions_only(enabled: bool) -> None:
    """Make TRL's fused LM head project only labelled positions on a CPU too, or restore it.

    TRL's ``add_fused_lm_head`` scores "compact" (the positions whose next token has a label)
    only where its Triton kernel runs; elsewhere it projects every position so that tile
    shapes never change (graph compilers such as Neuron would recompile). Eager CPU training
    recompiles nothing, and with ``assistant_only_loss`` ~2/3 of a role example's positions are
    prompt: projecting them through SmolLM2's 49,152 x 576 head is a fifth of the forward pass
    spent on nothing. The per-token results are the same either way (masked positions are zeroed).
    TRL picks the mode through ``trl.trainer.utils._use_triton``; its kernel keeps its own copy
    of that function, so the torch tile path still runs on a CPU.
    """
    import trl.trainer.utils as trl_utils
    from trl.kernels.chunked_logprob import _use_triton

    trl_utils._use_triton = (lambda device: device.type == "cpu" or _use_triton(device)) if enabled else _use_triton


if __name__ == "__main__":
    sys.exit(main())
