"""Real LoRA SFT runs on the embedded models (slow: minutes on 2 cores).

Compact synthetic role data (short system prompt, only the tools used: ~150-400 tokens per
example) keeps each run to a handful of optimizer steps.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from heart_distill.train.sft import main as sft_main
from heart_distill.train.synthetic import write_synthetic_role_dataset

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def overrides(dataset_dir, out, *extra):
    return [f"data.dataset_dir={dataset_dir}", f"output.dir={out}", "sft.batch_size=2", "sft.max_length=512",
            "sft.learning_rate=1e-3", "sft.warmup_ratio=0", "sft.logging_steps=1", *extra]


@pytest.fixture(scope="module")
def planner_data(tmp_path_factory):
    return write_synthetic_role_dataset(tmp_path_factory.mktemp("data"), "planner", 8, 2, compact=True)


def test_sft_on_smollm2_writes_a_servable_adapter(tmp_path, planner_data, smollm2_path):
    import torch
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    out = tmp_path / "planner"
    base_before = load_file(str(Path(smollm2_path) / "model.safetensors"))
    status = sft_main(["--recipe", str(REPO / "recipes/smollm2-135m/planner.yaml"),
                       # 2 rows at batch 2: every step sees the same batch, so its loss must fall
                       *overrides(planner_data, out, "sft.max_steps=4", "sft.save_steps=100",
                                  "data.max_train_examples=2")])
    assert status == 0
    assert {p.name for p in out.iterdir()} == {"adapter_config.json", "adapter_model.safetensors", "manifest.json",
                                               "README.md", "loss.png"}
    manifest = json.loads((out / "manifest.json").read_text())
    m = manifest["metrics"]
    assert m["train_loss_last"] < m["train_loss_first"], m
    assert manifest["role"] == "planner" and manifest["lora"]["r"] == 8
    assert manifest["base_model"]["content_hash"].startswith("sha256:")
    assert manifest["dataset"]["sizes"] == {"train": 2, "validation": 2}
    assert manifest["dataset"]["input_modes"] == {"subgoals": 0, "plan": 2}  # what serving is checked against
    assert manifest["dataset"]["fingerprint"].startswith("sha256:")
    assert manifest["recipe"]["sft"]["max_steps"] == 4 and manifest["system_prompt"] == "short"
    assert manifest["lora"]["layers"] == list(range(22, 30))  # the recipe's top 8 of 30 layers
    assert set(manifest["versions"]) >= {"torch", "transformers", "peft", "trl"}
    card = (out / "README.md").read_text()
    assert card.startswith("---\nbase_model: HuggingFaceTB/SmolLM2-135M-Instruct\nlibrary_name: peft")
    assert "--lora-modules planner=" in card
    config = json.loads((out / "adapter_config.json").read_text())
    assert not config.get("modules_to_save") and config["r"] == 8

    adapter = load_file(str(out / "adapter_model.safetensors"))
    lora_b = [t for k, t in adapter.items() if "lora_B" in k]
    assert len(lora_b) == 8 * 7 and all(t.abs().sum() > 0 for t in lora_b)  # B starts at zero
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(smollm2_path), str(out))
    base_after = {k.replace("base_model.model.", "").replace(".base_layer", ""): v
                  for k, v in model.state_dict().items() if "lora_" not in k}
    assert set(base_before) <= set(base_after)
    assert all(torch.equal(base_before[k], base_after[k]) for k in base_before)
    assert load_file(str(Path(smollm2_path) / "model.safetensors")).keys() == base_before.keys()


def test_sft_through_accelerate_launch(tmp_path, planner_data, smollm2_path):
    out = tmp_path / "planner"
    result = subprocess.run(
        [sys.executable, "-m", "accelerate.commands.launch", "--config_file", "recipes/accelerate/cpu.yaml",
         "-m", "heart_distill.train.sft", "--recipe", "recipes/smollm2-135m/planner.yaml",
         *overrides(planner_data, out, "sft.max_steps=2", "sft.save_steps=100")],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((out / "manifest.json").read_text())["metrics"]["steps"] == 2


def test_resume_after_kill(tmp_path, planner_data, smollm2_path):
    out = tmp_path / "planner"
    command = [sys.executable, "-m", "heart_distill.train.sft", "--recipe", "recipes/smollm2-135m/planner.yaml",
               *overrides(planner_data, out, "sft.max_steps=4", "sft.save_steps=2")]
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    checkpoint = out / "checkpoints" / "checkpoint-2"
    deadline = time.time() + 600
    while not (checkpoint / "trainer_state.json").is_file() and process.poll() is None and time.time() < deadline:
        time.sleep(0.5)
    time.sleep(1)  # let the checkpoint finish writing (rng state, scheduler)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    assert checkpoint.is_dir() and not (out / "manifest.json").exists()

    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((out / "manifest.json").read_text())["metrics"]
    assert metrics["resumed_from_step"] == 2 and metrics["steps"] == 4


def test_a_time_slot_stops_at_a_checkpoint_and_the_same_command_resumes(tmp_path, tiny_qwen3_path):
    """--stop-after 0: one optimizer step, a checkpoint, exit PAUSED and no adapter; the same
    command without a slot resumes at that step and finishes."""
    from heart_distill.train.sft import PAUSE_MARKER, PAUSED

    data = write_synthetic_role_dataset(tmp_path / "data", "router", 4, 2, compact=True)
    out = tmp_path / "router"
    command = ["--recipe", str(REPO / "recipes/smollm2-135m/router.yaml"), "model.name=tiny-qwen3",
               "output.max_serving_rank=8", "lora.top_layers=0",
               *overrides(data, out, "sft.max_steps=3", "sft.save_steps=100", "data.system_prompt=short")]
    assert sft_main(["--stop-after", "0", *command]) == PAUSED
    assert (out / "checkpoints" / "checkpoint-1" / "trainer_state.json").is_file()
    assert (out / "checkpoints" / PAUSE_MARKER).is_file() and not (out / "manifest.json").exists()
    assert sft_main([*command, "output.keep_checkpoints=true"]) == 0
    assert not (out / "checkpoints" / PAUSE_MARKER).exists()  # resumed: no longer a pause
    metrics = json.loads((out / "manifest.json").read_text())["metrics"]
    assert metrics["resumed_from_step"] == 1 and metrics["steps"] == 3


def test_tiny_qwen3_template_and_assistant_only_loss(tmp_path, tiny_qwen3_path):
    data = write_synthetic_role_dataset(tmp_path / "data", "router", 4, 2, compact=True)
    out = tmp_path / "router"
    status = sft_main(["--recipe", str(REPO / "recipes/smollm2-135m/router.yaml"), "model.name=tiny-qwen3",
                       "output.max_serving_rank=8", "lora.top_layers=0", *overrides(data, out, "sft.max_steps=2", "sft.save_steps=100",
                                                               "data.system_prompt=short")])
    assert status == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["base_model"]["name"] == "tiny-qwen3" and manifest["system_prompt"] == "short"
    assert 0 < manifest["loss_mask"]["masked_tokens"] < manifest["loss_mask"]["tokens"]


def test_over_long_example_is_dropped_and_counted_and_a_finished_dir_is_not_retrained(tmp_path, tiny_qwen3_path):
    from datasets import DatasetDict, concatenate_datasets, load_from_disk

    data = load_from_disk(str(write_synthetic_role_dataset(tmp_path / "data", "router", 4, 2, compact=True)))
    row = dict(data["train"][0])
    row["messages"] = [*row["messages"][:2], {"role": "assistant", "content": "{\"status\": \"READY\"} " * 300}]
    long_data = tmp_path / "long"
    DatasetDict({"train": concatenate_datasets([data["train"], data["train"].from_list([row])]),
                 "validation": data["validation"]}).save_to_disk(str(long_data))
    out = tmp_path / "router"
    args = ["--recipe", str(REPO / "recipes/smollm2-135m/router.yaml"), "model.name=tiny-qwen3", "lora.top_layers=1",
            *overrides(long_data, out, "sft.max_steps=1", "sft.save_steps=100")]
    assert sft_main(args) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["dataset"]["dropped_overlong"] == {"train": 1, "validation": 0}
    assert manifest["dataset"]["sizes"] == {"train": 4, "validation": 2}
    assert "1 of 5 train" in (out / "README.md").read_text()

    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert sft_main(args) == 2  # a finished adapter is not silently retrained and replaced
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
