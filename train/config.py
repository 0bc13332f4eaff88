"""Recipes: what one role's LoRA SFT run needs, one dataclass per concern.

A recipe YAML has the sections ``model``, ``lora``, ``sft``, ``data`` and ``output``, whose
keys are the fields below; each field's docstring is its help text (``field_help``).
``load_recipe`` validates the whole thing with pydantic and fails at load, before any model
or file is touched, with the offending field's dotted name in the message.

    recipe = load_recipe("recipes/smollm2-135m/planner.yaml", ["sft.max_steps=5"])
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field

from heart_distill.recipes import RecipeError, Role, read_yaml, validate_sections, yaml_problem

PositiveInt = Annotated[int, Field(gt=0)]
PositiveFloat = Annotated[float, Field(gt=0)]


@dataclass
class ModelConfig:
    name: str = "smollm2-135m"
    """Base model: an embedded name (smollm2-135m, tiny-qwen3), a local folder or a Hugging Face id."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Dtype the frozen base weights are loaded in (float32 on CPU: bf16 there has no fast kernels)."""
    attn_implementation: Literal["eager", "sdpa", "flash_attention_2", "flex_attention"] = "sdpa"
    """Attention kernel passed to from_pretrained."""


@dataclass
class LoraConfig:
    r: PositiveInt = 8
    """LoRA rank."""
    alpha: PositiveInt = 16
    """LoRA alpha (the update is scaled by alpha / r)."""
    dropout: Annotated[float, Field(ge=0, lt=1)] = 0.05
    """Dropout on the LoRA input."""
    target_modules: str | list[str] = "all-linear"
    """Modules that get LoRA: "all-linear" (every linear layer but the output head) or a list of names."""
    top_layers: Annotated[int, Field(ge=0)] = 0
    """Put LoRA only on the top N decoder layers (0 = every layer): the frozen layers below need no backward pass."""
    init_from: str | None = None
    """Adapter folder to start from instead of a fresh LoRA (continued training); must share the base."""


@dataclass
class SFTSettings:
    epochs: PositiveFloat = 1.0
    """Passes over the training split (ignored when max_steps > 0)."""
    max_steps: int = -1
    """Optimizer steps to run; -1 means use epochs."""
    learning_rate: PositiveFloat = 2.0e-4
    """Peak learning rate (LoRA tolerates ~10x a full fine-tune's)."""
    lr_scheduler: Literal["linear", "cosine", "constant", "constant_with_warmup"] = "cosine"
    """Learning-rate schedule after warmup."""
    warmup_ratio: Annotated[float, Field(ge=0, lt=1)] = 0.03
    """Fraction of the steps spent warming the learning rate up from 0."""
    batch_size: PositiveInt = 4
    """Examples per device per forward pass."""
    grad_accum: PositiveInt = 1
    """Forward passes accumulated per optimizer step (effective batch = batch_size x grad_accum x devices)."""
    max_length: PositiveInt = 1024
    """Longest example in tokens; longer ones are dropped and counted, never truncated (size it to the role's rows)."""
    logging_steps: PositiveInt = 1
    """Log train loss every this many steps."""
    eval_steps: int = 0
    """Evaluate on the validation split every this many steps; 0 evaluates only at the end."""
    save_steps: PositiveInt = 50
    """Write a resumable checkpoint every this many steps."""
    save_total_limit: PositiveInt = 2
    """Checkpoints kept in <output.dir>/checkpoints."""
    seed: int = 0
    """Seed for LoRA init, data order and dropout."""
    bf16: bool = False
    """bf16 mixed precision (GPU only; ~9x slower on CPUs without AMX)."""
    padding_free: bool = False
    """Concatenate each batch into one sequence with per-example positions (TRL padding_free): no pad tokens computed."""
    head_on_labels_only: bool = True
    """Project only the positions that carry a label (the assistant turn) through the LM head. TRL does this on
    CUDA/XPU; on other devices it projects every position (fixed tile shapes for graph compilers), which on a CPU
    spends a 49,152-row matmul on every prompt token for nothing."""
    gradient_checkpointing: bool = False
    """Recompute activations in backward to save memory (GPU recipes; slower)."""
    use_cpu: bool = True
    """Train on CPU even when an accelerator is present."""


@dataclass
class DataConfig:
    dataset_dir: str = ""
    """Folder of the role's DatasetDict (save_to_disk, splits train and validation, column messages)."""
    role: Role = "planner"
    """The HEART role this adapter serves."""
    system_prompt: Literal["full", "short"] = "full"
    """"full" trains on the dataset's system prompt; "short" swaps in the role's SHORT_SYSTEM_PROMPT (context distillation)."""
    max_train_examples: int = 0
    """Train on a seeded sample of N training examples (drawn across tasks); 0 uses all."""
    sample_seed: int = 0
    """Seed of that sample."""
    max_eval_examples: int = 64
    """Evaluate on at most the first N validation examples (evaluation is costly on a CPU); 0 uses all."""
    joint_roles: list[Role] = field(default_factory=list)
    """A joint adapter's roles (``heart train --joint``, :mod:`heart_distill.train.joint`): the
    dataset holds their rows (column ``role``) and the one adapter serves every one of them;
    empty: the adapter serves ``role`` alone."""
    mode: Literal["all", "call", "relevance", "messages"] = "all"
    """Primitive datasets only: train on the rows of this mode (column ``mode``): "call"
    (arguments for a request), "relevance" (does the tool apply, :mod:`heart.roles.relevance`),
    "messages" (what later steps need from a result, :mod:`heart.roles.primitive_messages`), or all."""


@dataclass
class OutputConfig:
    dir: str = ""
    """Adapter folder to write (adapter, manifest.json, README.md, loss.png; checkpoints/ while training)."""
    max_serving_rank: PositiveInt = 64
    """Largest rank the serving side accepts (vLLM --max-lora-rank); a larger lora.r fails at load."""
    keep_checkpoints: bool = False
    """Keep <dir>/checkpoints after a successful run (they are only needed to resume)."""
    overwrite: bool = False
    """Replace a finished adapter already in <dir>; without it a rerun on a finished dir is refused."""


@dataclass
class Recipe:
    model: ModelConfig = field(default_factory=ModelConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    sft: SFTSettings = field(default_factory=SFTSettings)
    data: DataConfig = field(default_factory=DataConfig)
    output: OutputConfig = field(default_factory=OutputConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def field_help(cls: type) -> dict[str, str]:
    """The one-line docstrings under a dataclass's fields, by field name (litgpt style)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body
    helps = {}
    for node, following in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant)):
            helps[node.target.id] = following.value.value.strip()
    return helps


def _apply_override(data: dict[str, Any], override: str) -> None:
    if "=" not in override:
        raise RecipeError(f"override {override!r} is not of the form section.key=value")
    dotted, raw = override.split("=", 1)
    parts = dotted.strip().split(".")
    if len(parts) != 2:
        raise RecipeError(f"override {override!r}: the key must be section.field, e.g. sft.max_steps=5")
    node = data.setdefault(parts[0], {})
    if not isinstance(node, dict):
        raise RecipeError(f"override {override!r}: '{parts[0]}' is not a section")
    try:
        node[parts[1]] = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as err:
        raise RecipeError(f"override {override!r}: the value is not valid YAML ({yaml_problem(err)})") from None


def check_dataset_dir(recipe: Recipe) -> None:
    folder = Path(recipe.data.dataset_dir)
    if not recipe.data.dataset_dir:
        raise RecipeError("'data.dataset_dir' is empty: give the role dataset folder")
    if not (folder / "dataset_dict.json").is_file():
        raise RecipeError(
            f"'data.dataset_dir': no role dataset at {folder} (expected a DatasetDict saved with "
            f"save_to_disk, with splits train and validation; build it with the data pipeline first)"
        )


def _adapter_base(folder: Path) -> tuple[str | None, str | None]:
    """(base_model_name_or_path, base content hash) recorded by an adapter folder."""
    config = json.loads((folder / "adapter_config.json").read_text())
    manifest_path = folder / "manifest.json"
    base_hash = None
    if manifest_path.is_file():
        base_hash = json.loads(manifest_path.read_text()).get("base_model", {}).get("content_hash")
    return config.get("base_model_name_or_path"), base_hash


def check_adapter_base(recipe: Recipe, adapter_dir: Path, field_name: str) -> None:
    """An adapter trained on another base cannot be continued on this one."""
    from heart.models import model_content_hash, resolve_model

    if not (adapter_dir / "adapter_config.json").is_file():
        raise RecipeError(f"'{field_name}': {adapter_dir} is not a peft adapter folder (no adapter_config.json)")
    recorded, recorded_hash = _adapter_base(adapter_dir)
    resolved = resolve_model(recipe.model.name)
    same_name = recorded in {recipe.model.name, resolved, str(Path(resolved).expanduser().resolve())}
    if recorded_hash is not None:
        current_hash = model_content_hash(resolved)
        if current_hash is not None and current_hash != recorded_hash:
            raise RecipeError(
                f"'{field_name}': adapter for another base: {adapter_dir} was trained on a base with content "
                f"hash {recorded_hash}, but model.name={recipe.model.name!r} has {current_hash}")
        same_name = same_name or current_hash == recorded_hash
    if not same_name:
        raise RecipeError(
            f"'{field_name}': adapter for another base: {adapter_dir} was trained on {recorded!r}, "
            f"but model.name={recipe.model.name!r} resolves to {resolved!r}")


def check_output_dir(recipe: Recipe) -> None:
    """A finished adapter (its manifest.json is written last) is never replaced silently."""
    manifest = Path(recipe.output.dir) / "manifest.json"
    if manifest.is_file() and not recipe.output.overwrite:
        raise RecipeError(
            f"'output.dir': {recipe.output.dir} already holds a trained adapter ({manifest.name}); "
            f"choose another output.dir, or pass output.overwrite=true to train again and replace it")


def check_recipe(recipe: Recipe) -> None:
    """What can only be checked against the file system: the dataset and any adapter to continue."""
    if recipe.lora.r > recipe.output.max_serving_rank:
        raise RecipeError(f"'lora.r'={recipe.lora.r} exceeds 'output.max_serving_rank'="
                          f"{recipe.output.max_serving_rank}: the serving side could not load the adapter")
    check_dataset_dir(recipe)
    check_output_dir(recipe)
    if recipe.lora.init_from:
        check_adapter_base(recipe, Path(recipe.lora.init_from), "lora.init_from")
    checkpoints = Path(recipe.output.dir) / "checkpoints"
    for folder in sorted(checkpoints.glob("checkpoint-*")) if checkpoints.is_dir() else []:
        check_adapter_base(recipe, folder, f"output.dir (checkpoint {folder.name})")
    if (Path(recipe.output.dir) / "adapter_config.json").is_file():
        check_adapter_base(recipe, Path(recipe.output.dir), "output.dir")


def load_recipe(path: str | Path, overrides: list[str] | None = None, check_paths: bool = True) -> Recipe:
    """Parse a recipe YAML, apply ``section.key=value`` overrides, validate, and check paths.

    Raises RecipeError naming the field for unknown keys, wrong types, invalid values, a missing
    dataset folder, or an adapter (to continue, or a checkpoint in output.dir) of another base.
    """
    path = Path(path)
    data = read_yaml(path, "recipe") or {}
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: a recipe is a mapping of sections, got {type(data).__name__}")
    for override in overrides or []:
        _apply_override(data, override)
    recipe = validate_sections(data, Recipe, str(path))
    if not recipe.output.dir:
        raise RecipeError(f"{path}: 'output.dir' is empty: give the adapter folder to write")
    if check_paths:
        check_recipe(recipe)
    return recipe


def role_overrides(path: str | Path, overrides: list[str] | None) -> list[str]:
    """``overrides`` for one role's recipe: ``{role}`` replaced by the recipe's role (``data.role``,
    or one set by an override), and an override scoped to a role (``planner:sft.epochs=2``) kept
    only for that role's recipe, so one override list can serve every role's recipe."""
    overrides = overrides or []
    if not any("{role}" in o or override_scope(o) for o in overrides):
        return overrides
    data = read_yaml(Path(path), "recipe") or {}
    role = (data.get("data") or {}).get("role") if isinstance(data, dict) else None
    for override in overrides:
        if not override_scope(override) and override.split("=", 1)[0].strip() == "data.role":
            role = override.split("=", 1)[1].strip()
    if not role:
        raise RecipeError(f"{path}: an override uses {{role}} or a role scope but the recipe names no data.role")
    kept = [o.split(":", 1)[1] if override_scope(o) else o for o in overrides if override_scope(o) in ("", role)]
    return [o.replace("{role}", str(role)) for o in kept]


def override_scope(override: str) -> str:
    """The role an override is scoped to (``planner`` in ``planner:sft.epochs=2``), or ''."""
    key = override.split("=", 1)[0]
    return key.split(":", 1)[0].strip() if ":" in key else ""
