"""One adapter for every role: the control of the role split (``heart train --joint ADAPTERS``).

α-UMi's claim, and the reason this toolkit trains four adapters, is that a split of roles
beats one model trained on the same data. The joint adapter is that one model, matched to the
four it is compared with:

- **the same rows**: each role's rows exactly as its own recipe trains on them
  (:func:`heart_distill.train.role_data.load_role_dataset`: its seeded sample, its Primitive
  mode, its short system prompt, so a row still says which role it asks for; the roles must
  agree on the kind of system prompt, which the adapter is then served with);
- **the same optimizer steps**: each role's rows repeated by its recipe's whole epochs, then
  all of them shuffled together and trained for one epoch — as many steps as the four
  trainings together, at the same batch size;
- **the same recipe**: the roles' model, LoRA and optimizer settings, which must agree (a
  setting that differs between the roles' recipes is refused, naming it: give it once as an
  override); the longest ``sft.max_length`` of the roles.

``ADAPTERS`` is an adapters folder, served like any other (``heart eval --roles ADAPTERS``,
:func:`heart_distill.eval.models.resolve_role_models`): the adapter goes to ``ADAPTERS/joint``,
the dataset (columns ``messages`` and ``role``) and the recipe that trains on it to
``ADAPTERS/joint-data``. Its manifest names ``role: joint`` and the roles it serves, each with
the input modes of its own rows.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import yaml

from heart_distill.train.config import Recipe, RecipeError

JOINT = "joint"
"""The role name of a joint adapter's manifest, and its folder in an adapters folder."""
SHARED_SECTIONS = ("model", "lora")
"""Recipe sections every role must agree on, whole."""
SHARED_SFT = ("learning_rate", "lr_scheduler", "warmup_ratio", "batch_size", "grad_accum", "seed", "bf16",
              "padding_free", "head_on_labels_only", "gradient_checkpointing", "use_cpu")
"""Optimizer settings every role must agree on (epochs and max_length may differ: see the module docstring)."""


def shared_settings(recipes: dict[str, Recipe]) -> None:
    """RecipeError naming the first setting the roles' recipes do not share."""
    first_role, first = next(iter(recipes.items()))
    for role, recipe in recipes.items():
        for section in SHARED_SECTIONS:
            if getattr(recipe, section) != getattr(first, section):
                raise RecipeError(f"--joint: {role}'s {section} section differs from {first_role}'s "
                                  f"({getattr(recipe, section)} vs {getattr(first, section)}): one adapter has one")
        for name in SHARED_SFT:
            if getattr(recipe.sft, name) != getattr(first.sft, name):
                raise RecipeError(f"--joint: {role}'s sft.{name} is {getattr(recipe.sft, name)!r}, {first_role}'s "
                                  f"{getattr(first.sft, name)!r}: give it once as an override (sft.{name}=...)")
        if recipe.data.system_prompt != first.data.system_prompt:
            raise RecipeError(f"--joint: {role} trains on the {recipe.data.system_prompt} system prompt, {first_role} "
                              f"on the {first.data.system_prompt} one: one adapter is served with one kind")
        if recipe.sft.max_steps > 0 or recipe.sft.epochs != int(recipe.sft.epochs):
            raise RecipeError(f"--joint: {role} trains for sft.max_steps={recipe.sft.max_steps}, "
                              f"sft.epochs={recipe.sft.epochs}: the joint rows repeat each role's whole epochs")


def joint_rows(recipes: dict[str, Recipe]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(DatasetDict of every role's training rows, repeated by its epochs and shuffled with
    the shared seed, and its validation rows; per-role counts for the manifest)."""
    from datasets import DatasetDict, concatenate_datasets

    from heart_distill.train.role_data import load_role_dataset

    train, validation, counts = [], [], {}
    for role, recipe in recipes.items():
        splits, info = load_role_dataset(recipe.data)
        tagged = {name: split.map(lambda row, r=role: {"role": r}, keep_in_memory=True) for name, split in splits.items()}
        epochs = int(recipe.sft.epochs)
        train += [tagged["train"]] * epochs
        if "validation" in tagged:
            validation.append(tagged["validation"])
        counts[role] = {"rows": len(tagged["train"]), "epochs": epochs, "dataset": info["path"],
                        "fingerprint": info["fingerprint"]}
    seed = next(iter(recipes.values())).sft.seed
    joined = {"train": concatenate_datasets(train).shuffle(seed=seed, keep_in_memory=True)}
    if validation:
        joined["validation"] = concatenate_datasets(validation)
    return DatasetDict(joined), counts


def write_joint(recipes: dict[str, Recipe], adapters: str | Path) -> Path:
    """Write the joint dataset and its recipe to ``<adapters>/joint-data``; the recipe's path
    (it trains ``<adapters>/joint``). Raises RecipeError when the roles' recipes cannot share
    one adapter."""
    shared_settings(recipes)
    out = Path(adapters) / JOINT
    folder = Path(adapters) / f"{JOINT}-data"
    dataset, counts = joint_rows(recipes)
    dataset.save_to_disk(str(folder / "data"))
    first = next(iter(recipes.values()))
    recipe = dataclasses.replace(
        first,
        sft=dataclasses.replace(first.sft, epochs=1.0, max_length=max(r.sft.max_length for r in recipes.values())),
        data=dataclasses.replace(first.data, dataset_dir=str(folder / "data"), max_train_examples=0, max_eval_examples=0,
                                 mode="all", joint_roles=list(recipes)),
        output=dataclasses.replace(first.output, dir=str(out)))
    path = folder / "recipe.yaml"
    steps = {role: math.ceil(c["rows"] * c["epochs"] / (first.sft.batch_size * first.sft.grad_accum))
             for role, c in counts.items()}
    header = (f"# python -m heart_distill.train.sft --recipe {path}\n"
              f"# The joint adapter of {', '.join(recipes)} (heart train --joint): each role's rows as its own recipe\n"
              f"# trains on them, repeated by its epochs: {counts}\n"
              f"# optimizer steps the roles' own trainings take: {steps} (together {sum(steps.values())}).\n")
    path.write_text(header + yaml.safe_dump(recipe.to_dict(), sort_keys=False))
    return path
