"""The adapter folder a training run leaves: servable checks, manifest, card, loss plot.

    <output.dir>/adapter_config.json, adapter_model.safetensors   plain peft (vLLM --lora-modules)
    <output.dir>/manifest.json   role, base id + content hash, LoRA, dataset fingerprint, recipe, metrics
    <output.dir>/README.md       adapter card
    <output.dir>/loss.png        train / eval loss from the trainer's log history
"""

from __future__ import annotations

import importlib.metadata
import json
import shutil
import time
from pathlib import Path
from typing import Any

from heart.atomic import publish_files
from heart_distill.train.config import Recipe

MANIFEST_VERSION = 1
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
PACKAGES = ("torch", "transformers", "peft", "trl", "accelerate", "datasets")


class UnservableAdapter(RuntimeError):
    """The adapter would not load in vLLM's multi-LoRA serving unchanged."""


def linear_module_names(model) -> set[str]:
    """Leaf names of the base's linear layers, as peft's "all-linear" picks them (no output head)."""
    import torch

    output_head = model.get_output_embeddings()
    return {name.rsplit(".", 1)[-1] for name, module in model.named_modules()
            if isinstance(module, torch.nn.Linear) and module is not output_head and "lora_" not in name}


def lora_placement(lora, model, linear_names: set[str]) -> dict[str, Any]:
    """peft's target_modules (+ layers_to_transform for ``lora.top_layers``).

    peft takes layers_to_transform only with a list of module names, so "all-linear" is spelled
    out as the base's linear leaf names (the same set peft would pick).
    """
    if not lora.top_layers:
        return {"target_modules": lora.target_modules}
    layers = model.config.get_text_config().num_hidden_layers
    if lora.top_layers > layers:
        raise ValueError(f"lora.top_layers={lora.top_layers} but the base has {layers} decoder layers")
    targets = sorted(linear_names) if lora.target_modules == "all-linear" else list(lora.target_modules)
    return {"target_modules": targets, "layers_to_transform": list(range(layers - lora.top_layers, layers))}


def check_servable(adapter_config: dict[str, Any], recipe: Recipe, linear_names: set[str]) -> None:
    if adapter_config.get("modules_to_save"):
        raise UnservableAdapter(f"modules_to_save={adapter_config['modules_to_save']}: vLLM cannot serve full "
                                "module copies in a LoRA adapter")
    if adapter_config.get("trainable_token_indices"):
        raise UnservableAdapter("trainable_token_indices is set (new tokens were added): vLLM cannot serve it")
    if adapter_config["r"] > recipe.output.max_serving_rank:
        raise UnservableAdapter(f"rank {adapter_config['r']} > output.max_serving_rank={recipe.output.max_serving_rank}")
    # peft writes leaf names ("q_proj") or, for some models, full paths ("model.layers.0.self_attn.q_proj")
    targets = {name.rsplit(".", 1)[-1] for name in adapter_config["target_modules"]}
    if not targets <= linear_names:
        raise UnservableAdapter(f"target modules {sorted(targets - linear_names)} are not linear layers of the base")
    if recipe.lora.target_modules == "all-linear" and targets != linear_names:  # per layer, top_layers or not
        raise UnservableAdapter(f"all-linear adapter misses linear layers {sorted(linear_names - targets)}")


def read_adapter_config(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "adapter_config.json").read_text())


def publish_adapter(staged: Path, out: Path, manifest: dict[str, Any], log_history: list[dict[str, Any]]) -> None:
    """Move a checked adapter from ``staged`` (what Trainer.save_model wrote) into ``out``.

    Check it (``check_servable``) before calling this: nothing in ``out`` changes until then.
    The card and plot are written beside the staged weights first; any previous manifest is
    removed before the weights are replaced and the new manifest lands last (atomic rename),
    so a folder with a manifest always holds the weights that manifest describes.
    """
    write_adapter_folder(staged, manifest, log_history)
    publish_files(staged, out, (*ADAPTER_FILES, "README.md", "loss.png"), marker="manifest.json")
    shutil.rmtree(staged)  # the tokenizer and training args save_model adds are not part of the adapter


def loss_curves(log_history: list[dict[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    return {
        "train": [(e["step"], e["loss"]) for e in log_history if "loss" in e],
        "eval": [(e["step"], e["eval_loss"]) for e in log_history if "eval_loss" in e],
    }


def plot_loss(log_history: list[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = loss_curves(log_history)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for name, marker in (("train", None), ("eval", "o")):
        if curves[name]:
            steps, losses = zip(*curves[name])
            ax.plot(steps, losses, marker=marker, label=f"{name} loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (assistant tokens)")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def build_manifest(recipe: Recipe, adapter_config: dict[str, Any], base: dict[str, Any], dataset: dict[str, Any],
                   metrics: dict[str, Any], lint: dict[str, Any]) -> dict[str, Any]:
    return {
        "format_version": MANIFEST_VERSION,
        "role": "joint" if recipe.data.joint_roles else recipe.data.role,
        "roles": list(recipe.data.joint_roles) or [recipe.data.role],
        "base_model": base,
        "lora": {"r": adapter_config["r"], "alpha": adapter_config["lora_alpha"],
                 "dropout": adapter_config["lora_dropout"],
                 "target_modules": sorted({m.rsplit(".", 1)[-1] for m in adapter_config["target_modules"]}),
                 "layers": adapter_config.get("layers_to_transform")},
        "dataset": dataset,
        "system_prompt": recipe.data.system_prompt,
        "loss_mask": lint,
        "metrics": metrics,
        "recipe": recipe.to_dict(),
        "versions": {name: importlib.metadata.version(name) for name in PACKAGES},
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _fmt(value: Any) -> str:
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def _layers(lora: dict[str, Any]) -> str:
    layers = lora.get("layers")
    return f" of layers {layers[0]}-{layers[-1]}" if layers else ""


def _dropped(dataset: dict[str, Any]) -> str:
    dropped = dataset.get("dropped_overlong") or {}
    return ", ".join(f"{n} of {dataset['sizes'].get(split, 0) + n} {split}" for split, n in dropped.items()) or "none"


def _serves(manifest: dict[str, Any]) -> str:
    roles = manifest.get("roles") or [manifest["role"]]
    if manifest["role"] != "joint":
        return ""
    return (f" for every one of {', '.join(roles)} (one adapter on the union of their rows, the control of the "
            "role split: `heart train --joint`)")


def adapter_card(manifest: dict[str, Any], out: Path, published: Path | None = None) -> str:
    """The card of the adapter in ``out``; its commands name ``published`` where it was copied
    to (:func:`copy_adapter`), else the recipe's output folder."""
    role, base, m = manifest["role"], manifest["base_model"], manifest["metrics"]
    base_id = base.get("hf_id") or base["name"]
    lora = manifest["lora"]
    data = manifest["dataset"]
    rows = "\n".join(f"| {k} | {_fmt(v)} |" for k, v in m.items())
    # the folder the adapter is published to, not the staging folder the card is written in
    out = Path(published or ((manifest.get("recipe") or {}).get("output") or {}).get("dir") or out)
    # a joint adapter is one module per role it serves (the model name is the role)
    modules = " ".join(f"{served}={out}" for served in manifest.get("roles") or [role])
    return f"""---
base_model: {base_id}
library_name: peft
pipeline_tag: text-generation
tags:
- lora
- sft
- trl
- heart
- heart-{role}
---

# HEART {role} adapter for {base_id}

A LoRA adapter (r={lora['r']}, alpha={lora['alpha']}, on {', '.join(lora['target_modules'])}{_layers(lora)}) that makes
`{base_id}` act as the HEART **{role}**{_serves(manifest)}: it reads the role's system prompt and
input block and answers with the role's JSON object. Trained with TRL SFT on the assistant tokens only.

- Base: `{base['name']}` (content hash `{base.get('content_hash')}`)
- Data: `{data['path']}` (fingerprint `{data['fingerprint'][:19]}…`), {data['sizes']['train']} train /
  {data['sizes'].get('validation', 0)} validation examples, system prompt: **{manifest['system_prompt']}**
  {"(serve it with the role's SHORT_SYSTEM_PROMPT)" if manifest['system_prompt'] == 'short' else ''}
- Over-long examples dropped (longer than {data.get('max_length')} tokens; never truncated):
  {_dropped(data)}
- Full provenance, recipe, package versions and the trainer's log history: `manifest.json`; loss curves: `loss.png`.

## Metrics

| metric | value |
|---|---|
{rows}

## Use

With peft, one base and several role adapters:

```python
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

base = AutoModelForCausalLM.from_pretrained("{base['path']}")
tokenizer = AutoTokenizer.from_pretrained("{base['path']}")
model = PeftModel.from_pretrained(base, "{out}", adapter_name="{role}")
```

With vLLM multi-LoRA (the role is the model name):

```bash
vllm serve {base['path']} --enable-lora --max-lora-rank {max(8, lora['r'])} \\
    --lora-modules {modules}
```
"""


def copy_adapter(src: Path, dest: Path) -> None:
    """Copy the finished adapter folder ``src`` to ``dest`` (e.g. from a run folder to a results
    folder that is committed), its card rewritten to name ``dest``; the manifest is unchanged
    (it records where the adapter was trained). Raises ValueError where ``src`` holds no finished
    adapter or ``dest`` exists (nothing is overwritten)."""
    src, dest = Path(src), Path(dest)
    missing = [name for name in (*ADAPTER_FILES, "manifest.json") if not (src / name).is_file()]
    if missing:
        raise ValueError(f"{src} holds no finished adapter (no {', '.join(missing)}): train it first")
    if dest.exists():
        raise ValueError(f"{dest} exists: publishing never overwrites an adapter folder")
    manifest = json.loads((src / "manifest.json").read_text())
    staging = dest.with_name(dest.name + ".publishing")
    shutil.rmtree(staging, ignore_errors=True)
    # checkpoints of a paused or kept run are not part of the adapter
    shutil.copytree(src, staging, ignore=shutil.ignore_patterns("checkpoints"))
    (staging / "README.md").write_text(adapter_card(manifest, src, published=dest))
    staging.rename(dest)


def write_adapter_folder(out: Path, manifest: dict[str, Any], log_history: list[dict[str, Any]]) -> None:
    # the trainer's log history (loss, grad norm, learning rate per logged step) in full: off a
    # terminal it is not printed, and the checkpoints that held it are removed
    manifest = {**manifest, "log_history": log_history}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2, default=str) + "\n")
    (out / "README.md").write_text(adapter_card(manifest, out))
    plot_loss(log_history, out / "loss.png", f"{manifest['role']} on {manifest['base_model']['name']}")
