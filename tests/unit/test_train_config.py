"""Recipe loading: every mistake fails at load, naming the field; `python -m heart_distill.train.sft` exits
non-zero and writes nothing."""

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from heart_distill.train.config import (DataConfig, LoraConfig, ModelConfig, OutputConfig, RecipeError, SFTSettings, field_help,
                          load_recipe)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture()
def dataset_dir(tmp_path):
    from heart_distill.train.synthetic import write_synthetic_role_dataset

    return write_synthetic_role_dataset(tmp_path / "datasets", "planner", 4, 2, compact=True)


def write_recipe(tmp_path, dataset_dir, **sections):
    recipe = {"model": {"name": "tiny-qwen3"}, "lora": {"r": 8},
              "data": {"dataset_dir": str(dataset_dir), "role": "planner"},
              "output": {"dir": str(tmp_path / "out")}}
    for section, values in sections.items():
        recipe.setdefault(section, {}).update(values)
    path = tmp_path / "recipe.yaml"
    path.write_text("# test recipe\n" + yaml.safe_dump(recipe))
    return path


@pytest.mark.parametrize("cls", [ModelConfig, LoraConfig, SFTSettings, DataConfig, OutputConfig])
def test_every_field_has_help(cls):
    assert set(field_help(cls)) == {f.name for f in dataclasses.fields(cls)}


def test_loads_and_applies_overrides(tmp_path, dataset_dir):
    recipe = load_recipe(write_recipe(tmp_path, dataset_dir), ["sft.max_steps=3", "sft.learning_rate=1e-3"])
    assert recipe.sft.max_steps == 3 and recipe.sft.learning_rate == 1e-3 and recipe.lora.r == 8


@pytest.mark.parametrize("sections, overrides, expected", [
    ({"lora": {"rank": 8}}, [], "unknown key 'lora.rank'"),
    ({"sft": {"learning_rte": 1e-4}}, [], "did you mean 'sft.learning_rate'"),
    ({}, ["sft.batch_size=four"], "'sft.batch_size'"),
    ({}, ["sft.bf16=maybe"], "'sft.bf16'"),
    ({}, ["data.role=boss"], "'data.role'"),
    ({}, ["lora.r=0"], "'lora.r'"),
    ({"output": {"max_serving_rank": 16}}, ["lora.r=32"], "'lora.r'=32 exceeds 'output.max_serving_rank'=16"),
    ({}, ["data.system_prompt=tiny"], "'data.system_prompt'"),
])
def test_bad_recipe_names_the_field(tmp_path, dataset_dir, sections, overrides, expected):
    with pytest.raises(RecipeError, match=re.escape(expected)):
        load_recipe(write_recipe(tmp_path, dataset_dir, **sections), overrides)


def test_missing_dataset(tmp_path, dataset_dir):
    with pytest.raises(RecipeError, match="'data.dataset_dir': no role dataset"):
        load_recipe(write_recipe(tmp_path, tmp_path / "nowhere"))


def fake_adapter(folder: Path, base: str, content_hash: str | None = None) -> Path:
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": base, "r": 8}))
    if content_hash:
        (folder / "manifest.json").write_text(json.dumps({"base_model": {"content_hash": content_hash}}))
    return folder


def test_adapter_for_another_base(tmp_path, dataset_dir, tiny_qwen3_path):
    other = fake_adapter(tmp_path / "other", "HuggingFaceTB/SmolLM2-135M-Instruct")
    with pytest.raises(RecipeError, match="'lora.init_from': adapter for another base"):
        load_recipe(write_recipe(tmp_path, dataset_dir, lora={"init_from": str(other)}))
    same_name_other_weights = fake_adapter(tmp_path / "hash", str(tiny_qwen3_path), "sha256:" + "0" * 64)
    with pytest.raises(RecipeError, match="content hash"):
        load_recipe(write_recipe(tmp_path, dataset_dir, lora={"init_from": str(same_name_other_weights)}))
    ours = fake_adapter(tmp_path / "ours", str(tiny_qwen3_path))
    assert load_recipe(write_recipe(tmp_path, dataset_dir, lora={"init_from": str(ours)})).lora.init_from


def test_checkpoint_of_another_base_in_output_dir(tmp_path, dataset_dir, tiny_qwen3_path):
    fake_adapter(tmp_path / "out" / "checkpoints" / "checkpoint-5", "Qwen/Qwen3-8B")
    with pytest.raises(RecipeError, match="output.dir .*adapter for another base"):
        load_recipe(write_recipe(tmp_path, dataset_dir))


def run_sft(recipe, *overrides):
    return subprocess.run([sys.executable, "-m", "heart_distill.train.sft", "--recipe", str(recipe), *overrides],
                          cwd=REPO, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("case, expected", [
    ("unknown_key", "unknown key 'sft.max_step'"),
    ("wrong_type", "'sft.max_steps'"),
    ("missing_dataset", "'data.dataset_dir'"),
    ("other_base", "adapter for another base"),
])
def test_entry_point_rejects_bad_recipe_and_writes_nothing(tmp_path, dataset_dir, tiny_qwen3_path, case, expected):
    sections = {
        "unknown_key": {"sft": {"max_step": 5}},
        "wrong_type": {"sft": {"max_steps": "five"}},
        "missing_dataset": {"data": {"dataset_dir": str(tmp_path / "missing")}},
        "other_base": {"lora": {"init_from": str(fake_adapter(tmp_path / "other", "Qwen/Qwen3-8B"))}},
    }[case]
    recipe = write_recipe(tmp_path, dataset_dir, **sections)
    result = run_sft(recipe)
    assert result.returncode != 0
    assert expected in result.stderr
    assert not (tmp_path / "out").exists()


def test_rerun_on_a_finished_output_dir_is_refused(tmp_path, dataset_dir):
    recipe = write_recipe(tmp_path, dataset_dir)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "manifest.json").write_text("{}")
    with pytest.raises(RecipeError, match=r"'output.dir': .* already holds a trained adapter.*output.overwrite=true"):
        load_recipe(recipe)
    assert load_recipe(recipe, ["output.overwrite=true"]).output.overwrite


def test_every_primitive_row_mode_the_builder_writes_is_a_recipe_mode(tmp_path):
    import typing

    from datasets import Dataset, DatasetDict

    from heart.roles import primitive, primitive_messages, relevance
    from heart_distill.data.build import to_example
    from heart_distill.data.filters import EpisodeFacts
    from heart_distill.train.role_data import load_role_dataset

    def traced(prompt: str, mode: str | None) -> dict:
        """A Primitive trace event as the loop writes it (extra["mode"] marks the call's mode)."""
        return {"messages": [{"role": "system", "content": prompt}, {"role": "user", "content": "x"}],
                "raw_output": "{}", "episode_id": "e", "task_id": "t", "env": "bfcl", "backend": "gold", "turn": 0,
                "attempt": 0, "step": 1, "role": "primitive", "extra": {"mode": mode} if mode else {}}

    checked = EpisodeFacts({"success": True})  # an episode the checker accepted
    rows = [to_example(traced(primitive.SYSTEM_PROMPT, None), checked),
            to_example(traced(relevance.SYSTEM_PROMPT, relevance.MODE), checked),
            to_example(traced(primitive_messages.SYSTEM_PROMPT, primitive_messages.MODE), checked)]
    written = {row["mode"] for row in rows}
    assert written == {"call", "relevance", "messages"}
    assert set(typing.get_args(typing.get_type_hints(DataConfig)["mode"])) == written | {"all"}

    DatasetDict({"train": Dataset.from_list(rows)}).save_to_disk(str(tmp_path / "primitive"))
    splits, info = load_role_dataset(DataConfig(dataset_dir=str(tmp_path / "primitive"), role="primitive",
                                                mode="messages"))
    assert info["sizes"] == {"train": 1}
    assert splits["train"][0]["messages"][0]["content"] == primitive_messages.SYSTEM_PROMPT
    DatasetDict({"train": Dataset.from_list(rows[:2])}).save_to_disk(str(tmp_path / "no-messages"))
    with pytest.raises(ValueError, match=r"data.mode=messages: .* no train row of this mode \(it has \['call', 'relevance'\]\)"):
        load_role_dataset(DataConfig(dataset_dir=str(tmp_path / "no-messages"), role="primitive", mode="messages"))
