"""Reading a role dataset for training: splits, optional short system prompt, fingerprint.

Context distillation (``data.system_prompt: short``): the adapter is trained on the role's
SHORT_SYSTEM_PROMPT while the targets were produced under the full one, so at serving time
the long prompt can be dropped (fewer prompt tokens per call).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from heart.roles import get_role
from heart_distill.train.config import DataConfig


class RolePromptError(RuntimeError):
    """The role module does not provide the prompt a recipe asks for."""


def role_for_short_prompt(role: str):
    """The registered role whose short prompt ``data.system_prompt=short`` trains on."""
    try:
        return get_role(role)
    except ValueError as err:
        raise RolePromptError(f"data.system_prompt=short: {err}") from err


def input_modes(role: str, rows) -> dict[str, int]:
    """How many of ``rows`` (``messages`` rows of ``role``) are inputs of each of the role's
    modes (:meth:`heart.roles.registry.Role.mode_for`): the manifest records it, so an
    adapter trained on one mode's inputs (the Router's step mode, the Planner's sub-goals
    form) is not served another's unnoticed."""
    from heart.roles.common import role_input

    spec = get_role(role)
    counts = dict.fromkeys(spec.mode_names, 0)
    for row in rows:
        counts[spec.mode_for(role_input(row["messages"][:-1])).name] += 1
    return counts


def _with_system(messages: list[dict[str, str]], prompt: str) -> list[dict[str, str]]:
    if messages[0]["role"] != "system":
        raise ValueError("a role example must start with its system message")
    return [{"role": "system", "content": prompt}, *messages[1:]]


def dataset_fingerprint(folder: Path) -> str:
    """sha256 over the dataset's arrow files (names and bytes): stable across machines, unlike _fingerprint.

    ``cache-*.arrow`` files are what ``datasets`` leaves beside the data after a map or filter
    on disk: not part of the dataset.
    """
    digest = hashlib.sha256()
    for path in sorted(p for p in Path(folder).rglob("*.arrow") if not p.name.startswith("cache-")):
        digest.update(str(path.relative_to(folder)).encode() + b"\0")
        digest.update(path.read_bytes())
    return "sha256:" + digest.hexdigest()


def load_role_dataset(data: DataConfig) -> tuple[Any, dict[str, Any]]:
    """(DatasetDict with train/validation and only ``messages``, provenance for the manifest)."""
    from datasets import load_from_disk

    raw = load_from_disk(data.dataset_dir)
    if "train" not in raw:
        raise ValueError(f"data.dataset_dir={data.dataset_dir}: no train split (has {sorted(raw)})")
    # validation may be absent: a small run can hold out no task for it (then no eval).
    splits = {name: raw[name] for name in ("train", "validation") if name in raw}
    if data.mode != "all":
        if "mode" not in raw["train"].column_names:
            raise ValueError(f"data.mode={data.mode}: {data.dataset_dir} has no mode column (a Primitive dataset has one)")
        splits = {name: split.filter(lambda row: row["mode"] == data.mode, keep_in_memory=True)
                  for name, split in splits.items()}
        if not len(splits["train"]):
            modes = sorted(set(raw["train"]["mode"]))
            raise ValueError(f"data.mode={data.mode}: {data.dataset_dir} has no train row of this mode (it has {modes})")
    splits = {name: split.select_columns(["messages"]) for name, split in splits.items()}
    if data.max_train_examples:  # a seeded sample: the first N rows would be the first few tasks only
        sample = splits["train"].shuffle(seed=data.sample_seed, keep_in_memory=True)
        splits["train"] = sample.select(range(min(data.max_train_examples, len(sample))))
    if data.max_eval_examples and "validation" in splits:
        splits["validation"] = splits["validation"].select(range(min(data.max_eval_examples, len(splits["validation"]))))
    if data.system_prompt == "short" and not data.joint_roles:  # (a joint dataset's rows carry their roles' own)
        role = role_for_short_prompt(data.role)
        # each row's full prompt names its mode, and a mode with its own prompt gets its own
        # short one (the Primitive's relevance mode); keep_in_memory: training must not write
        # cache files into the dataset folder it reads
        splits = {name: split.map(lambda row: {"messages": _with_system(
                      row["messages"], role.short_system_prompt_for(row["messages"][0]["content"]))},
                      keep_in_memory=True)
                  for name, split in splits.items()}
    info = {
        "path": str(Path(data.dataset_dir).resolve()),
        "fingerprint": dataset_fingerprint(Path(data.dataset_dir)),
        "hf_fingerprints": {name: raw[name]._fingerprint for name in splits},
        "sizes": {name: len(split) for name, split in splits.items()},
        "system_prompt": data.system_prompt,
    }
    return splits, info


def joint_input_modes(data: DataConfig) -> dict[str, dict[str, int]]:
    """A joint adapter's input modes, per role it serves, read from that role's own rows of
    the joint dataset (column ``role``, :mod:`heart_distill.train.joint`)."""
    from datasets import load_from_disk

    train = load_from_disk(data.dataset_dir)["train"]
    roles = train["role"]
    return {role: input_modes(role, train.select([i for i, r in enumerate(roles) if r == role]))
            for role in data.joint_roles}


def token_count(tokenizer: Any, messages: list[dict[str, str]]) -> int:
    """Token ids of the conversation as the trainer tokenizes it (the chat template, whole).

    ``apply_chat_template(..., tokenize=True)`` returns a ``BatchEncoding`` in transformers 5,
    whose ``len()`` is its number of fields (2), not its tokens: ask for the bare id list.
    """
    ids = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False)
    return len(ids)


def drop_overlong(splits: dict[str, Any], tokenizer: Any, max_length: int) -> tuple[dict[str, Any], dict[str, int]]:
    """Drop examples whose rendered conversation exceeds ``max_length`` tokens; count them per split.

    Truncation would cut the assistant turn — the only part trained on — so an over-long
    example is left out and counted instead (the manifest and the adapter card report how many).
    """
    def fits(row: dict[str, Any]) -> bool:
        return token_count(tokenizer, row["messages"]) <= max_length

    kept = {name: split.filter(fits, keep_in_memory=True) for name, split in splits.items()}
    return kept, {name: len(splits[name]) - len(kept[name]) for name in splits}
