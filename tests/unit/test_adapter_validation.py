"""Adapter validation before load: another base, a rank over the limit, unknown target
modules are refused with a message naming both bases or the field; nothing loads first."""

import json

import pytest

from heart.runtime.adapters import AdapterRefused, ServingBase, validate_adapter

BASE = ServingBase("smollm2-135m", "a" * 64, frozenset({"q_proj", "k_proj", "v_proj", "o_proj",
                                                        "gate_proj", "up_proj", "down_proj"}), max_rank=16)


def adapter(tmp_path, r=8, targets=("q_proj", "v_proj"), base_model=None, peft_type="LORA"):
    folder = tmp_path / "planner"
    folder.mkdir(exist_ok=True)
    (folder / "adapter_config.json").write_text(json.dumps(
        {"peft_type": peft_type, "r": r, "lora_alpha": 16, "target_modules": list(targets)}))
    if base_model is not None:
        (folder / "manifest.json").write_text(json.dumps({"role": "planner", "base_model": base_model}))
    return folder


def test_a_matching_adapter_passes(tmp_path):
    folder = adapter(tmp_path, base_model={"name": "smollm2-135m", "content_hash": "a" * 64})
    assert validate_adapter("planner", folder, BASE)["r"] == 8


def test_another_base_by_hash_is_refused_naming_both(tmp_path):
    folder = adapter(tmp_path, base_model={"name": "tiny-qwen3", "content_hash": "b" * 64})
    with pytest.raises(AdapterRefused) as err:
        validate_adapter("planner", folder, BASE)
    assert "'tiny-qwen3'" in str(err.value) and "'smollm2-135m'" in str(err.value)
    assert "bbbbbbbb" in str(err.value) and "aaaaaaaa" in str(err.value)


def test_another_base_by_name_is_refused_without_hashes(tmp_path):
    folder = adapter(tmp_path, base_model={"name": "Qwen/Qwen3-8B"})
    with pytest.raises(AdapterRefused, match=r"Qwen/Qwen3-8B.*'smollm2-135m'"):
        validate_adapter("planner", folder, BASE)


def test_rank_above_the_serving_limit_is_refused_naming_the_field(tmp_path):
    with pytest.raises(AdapterRefused, match=r"field 'r' = 32 exceeds the serving limit max_rank = 16"):
        validate_adapter("planner", adapter(tmp_path, r=32), BASE)


def test_unknown_target_modules_are_refused_naming_them(tmp_path):
    folder = adapter(tmp_path, targets=("q_proj", "model.layers.0.attn.c_attn"))
    with pytest.raises(AdapterRefused, match=r"'target_modules' names \['c_attn'\]"):
        validate_adapter("planner", folder, BASE)


def test_not_lora_or_missing_config_is_refused(tmp_path):
    with pytest.raises(AdapterRefused, match="not LORA"):
        validate_adapter("planner", adapter(tmp_path, peft_type="IA3"), BASE)
    with pytest.raises(AdapterRefused, match="no adapter_config.json"):
        validate_adapter("router", tmp_path / "missing", BASE)


def test_the_backend_refuses_before_any_weight_loads(tmp_path, tiny_qwen3_path, monkeypatch):
    import transformers

    from heart.runtime.hf import TransformersBackend

    def no_loading(*args, **kwargs):
        raise AssertionError("weights were loaded before the adapter was checked")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_loading)
    folder = adapter(tmp_path, base_model={"name": "smollm2-135m", "content_hash": "c" * 64})
    with pytest.raises(AdapterRefused, match=r"trained on base 'smollm2-135m'.*serving base is 'tiny-qwen3'"):
        TransformersBackend("tiny-qwen3", adapters={"planner": str(folder)})
