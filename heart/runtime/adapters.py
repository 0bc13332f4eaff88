"""Adapter validation before load: refuse an adapter the serving base cannot serve.

An adapter folder is a plain peft folder plus the ``manifest.json`` that ``train/adapter.py``
writes (role, base model name + content hash, LoRA rank and target modules). Like vLLM's
LoRA manager, the config is checked before any weight is read: an adapter trained on another
base, with a rank above the serving limit, or targeting modules the base does not have, is
refused with a message that names both bases or the offending field.

The manifest is read as JSON here: ``heart`` never imports ``train`` at module level.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

MAX_SERVING_RANK = 64
"""Default rank ceiling, the same as the recipes' ``output.max_serving_rank``."""


class AdapterRefused(ValueError):
    """The adapter cannot be served on this base; the message says why."""


@dataclass(frozen=True)
class ServingBase:
    """What an adapter is checked against: the base that will serve it."""

    model_id: str
    """The base as the caller named it (embedded name, folder or hub id)."""
    content_hash: str | None
    """Content hash of the base weights (None for a hub id)."""
    linear_modules: frozenset[str]
    """Leaf names of the base's linear layers (``q_proj``, ``down_proj``...)."""
    max_rank: int = MAX_SERVING_RANK


def base_linear_modules(model_path: str) -> frozenset[str]:
    """Leaf names of the base's linear layers, from its config on the meta device (no weights)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return frozenset(name.rsplit(".", 1)[-1] for name, module in model.named_modules()
                     if isinstance(module, torch.nn.Linear))


def validate_adapter(role: str, path: str | Path, base: ServingBase) -> dict:
    """Check one adapter folder against ``base``; return its adapter config or raise AdapterRefused."""
    folder = Path(path)
    config_path = folder / "adapter_config.json"
    if not config_path.is_file():
        raise AdapterRefused(f"adapter for role {role!r}: no adapter_config.json in {folder}")
    try:
        config = json.loads(config_path.read_text())
    except json.JSONDecodeError as err:
        raise AdapterRefused(f"adapter for role {role!r}: {config_path} is not valid JSON ({err})") from None
    if config.get("peft_type") != "LORA":
        raise AdapterRefused(f"adapter for role {role!r} at {folder} is {config.get('peft_type')}, not LORA")

    manifest_path = folder / "manifest.json"
    if manifest_path.is_file():
        manifest = json.loads(manifest_path.read_text())
        trained_on = manifest.get("base_model", {})
        trained_hash = trained_on.get("content_hash")
        if trained_hash and base.content_hash and trained_hash != base.content_hash:
            raise AdapterRefused(
                f"adapter for role {role!r} at {folder} was trained on base {trained_on.get('name')!r} "
                f"(content hash {trained_hash[:16]}…), but the serving base is {base.model_id!r} "
                f"(content hash {base.content_hash[:16]}…)")
        if not (trained_hash and base.content_hash):
            # Without two hashes, compare names: any of the manifest's names for its base.
            names = {str(trained_on.get(k)) for k in ("name", "hf_id", "path") if trained_on.get(k)}
            if names and base.model_id not in names:
                raise AdapterRefused(
                    f"adapter for role {role!r} at {folder} was trained on base {sorted(names)}, but the "
                    f"serving base is {base.model_id!r} (no content hash on both sides to prove them equal)")

    rank = config.get("r")
    if not isinstance(rank, int) or rank < 1:
        raise AdapterRefused(f"adapter for role {role!r}: field 'r' is {rank!r}, not a positive rank")
    if rank > base.max_rank:
        raise AdapterRefused(f"adapter for role {role!r}: field 'r' = {rank} exceeds the serving limit "
                             f"max_rank = {base.max_rank}")
    targets = config.get("target_modules") or []
    if isinstance(targets, str):  # "all-linear" or a regex: peft resolves it against the base itself
        targets = []
    unknown = sorted({t.rsplit(".", 1)[-1] for t in targets} - base.linear_modules)
    if unknown:
        raise AdapterRefused(f"adapter for role {role!r}: field 'target_modules' names {unknown}, which are not "
                             f"linear layers of base {base.model_id!r} (it has {sorted(base.linear_modules)})")
    return config


def validate_role_adapters(model: str, model_path: str | Path, adapters: dict[str, str], max_rank: int,
                           reserved: str) -> list[dict]:
    """Every role's adapter checked against the base before any weight loads; returns their configs.

    ``reserved`` is the engine's own name for "no adapter", which no role may take. A missing
    folder raises FileNotFoundError (before the base's config is read), a refused adapter
    AdapterRefused.
    """
    from heart.models import model_content_hash

    for role, path in adapters.items():
        if role == reserved:
            raise ValueError(f"{reserved!r} is reserved for the bare base (no adapter) and cannot name a role")
        if not (Path(path) / "adapter_config.json").is_file():
            raise FileNotFoundError(f"adapter for role {role!r}: no adapter_config.json in {path}")
    if not adapters:
        return []
    serving = ServingBase(model, model_content_hash(model_path), base_linear_modules(str(model_path)), max_rank)
    return [validate_adapter(role, path, serving) for role, path in adapters.items()]
