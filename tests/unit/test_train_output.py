"""What a training run does to its output folder: a new adapter that fails the servable check
leaves the previous one untouched, and weights and manifest are replaced together; over-long
examples are counted in real token ids (the refusal to retrain a finished output.dir is in
test_train_config.py)."""

import json

import pytest

from heart_distill.train.adapter import UnservableAdapter, check_servable, publish_adapter, read_adapter_config
from heart_distill.train.role_data import drop_overlong, token_count


LINEAR = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}


def finished_adapter(folder, tag):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "adapter_config.json").write_text(json.dumps({"r": 8, "lora_alpha": 16, "lora_dropout": 0.05,
                                                            "target_modules": sorted(LINEAR), "tag": tag}))
    (folder / "adapter_model.safetensors").write_bytes(f"weights {tag}".encode())
    (folder / "manifest.json").write_text(json.dumps({"tag": tag}))
    (folder / "README.md").write_text(f"card {tag}")
    (folder / "loss.png").write_bytes(b"png")
    return folder


def test_unservable_new_adapter_leaves_the_previous_one_intact(tmp_path):
    out = finished_adapter(tmp_path / "out", "old")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    staged = finished_adapter(tmp_path / "out" / "checkpoints" / "final", "new")
    config = read_adapter_config(staged)
    config["modules_to_save"] = ["lm_head"]
    (staged / "adapter_config.json").write_text(json.dumps(config))

    class Output:
        max_serving_rank = 8

    class Lora:
        target_modules = "all-linear"

    class Recipe:
        output, lora = Output, Lora

    # train.sft's order: check what was staged, then publish; a failed check publishes nothing
    with pytest.raises(UnservableAdapter, match="modules_to_save"):
        check_servable(read_adapter_config(staged), Recipe, LINEAR)
        publish_adapter(staged, out, {"tag": "new"}, [])
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before


def test_publish_replaces_weights_and_manifest_together(tmp_path, monkeypatch):
    out = finished_adapter(tmp_path / "out", "old")
    staged = finished_adapter(tmp_path / "out" / "checkpoints" / "final", "new")
    monkeypatch.setattr("heart_distill.train.adapter.write_adapter_folder",
                        lambda folder, manifest, history: (folder / "manifest.json").write_text(json.dumps(manifest)))
    publish_adapter(staged, out, {"tag": "new"}, [])
    assert json.loads((out / "manifest.json").read_text()) == {"tag": "new"}
    assert (out / "adapter_model.safetensors").read_bytes() == b"weights new"
    assert not staged.exists()


class BatchEncodingTokenizer:
    """transformers 5's apply_chat_template(tokenize=True) returns a dict: len() of it is 2."""

    def apply_chat_template(self, messages, tokenize=True, return_dict=True):
        ids = [0] * sum(len(m["content"].split()) + 3 for m in messages)
        return ids if not return_dict else {"input_ids": ids, "attention_mask": [1] * len(ids)}


def test_over_long_examples_are_counted_in_real_tokens_and_dropped():
    from datasets import Dataset

    short = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]
    long = [*short[:2], {"role": "assistant", "content": "word " * 100}]
    tokenizer = BatchEncodingTokenizer()
    assert token_count(tokenizer, short) == 12 and token_count(tokenizer, long) == 111
    splits = {"train": Dataset.from_dict({"messages": [short, long, short]}),
              "validation": Dataset.from_dict({"messages": [long]})}
    kept, dropped = drop_overlong(splits, tokenizer, max_length=64)
    assert dropped == {"train": 1, "validation": 1}
    assert len(kept["train"]) == 2 and len(kept["validation"]) == 0
