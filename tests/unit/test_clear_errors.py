"""Bad input ends in one line that names the problem and a non-zero exit, never a traceback.

Each case calls the command's ``main`` in-process: an exception escaping it is the
traceback a user would have seen (the test then fails with that exception).
"""

from __future__ import annotations

import json

import pytest

from heart.cli import main as heart

RECIPES = "recipes/smollm2-135m"


def run(argv: list[str], capsys) -> tuple[int, str]:
    try:
        code = heart(argv)
    except SystemExit as exit_:  # argparse and the commands' own `SystemExit("error: …")`
        code = exit_.code if isinstance(exit_.code, int) else 2
        if not isinstance(exit_.code, int):
            print(exit_.code, file=__import__("sys").stderr)
    captured = capsys.readouterr()
    return code, captured.err + captured.out


def assert_clear(code: int, output: str, *names: str) -> None:
    assert code != 0, output
    assert "Traceback" not in output
    assert output.strip().count("\n") <= 2, output  # a line or two, not a dump
    for name in names:
        assert name in output, f"{name!r} not named in: {output}"


def test_malformed_recipe_yaml(tmp_path, capsys):
    from train.sft import main as sft

    bad = tmp_path / "planner.yaml"
    bad.write_text("model: [unclosed\n")
    assert sft(["--recipe", str(bad)]) == 2
    assert_clear(2, capsys.readouterr().err, "planner.yaml", "malformed YAML", "line")


@pytest.mark.parametrize("content,problem", [
    (None, "does not exist"),
    ("- planner\n- router\n", "mapping"),
    ("roles: [planner]\n", "'roles' must map"),
    ("roles: {planner: [x\n", "malformed YAML"),
])
def test_missing_or_non_mapping_roles_yaml(tmp_path, capsys, content, problem):
    path = tmp_path / "roles.yaml"
    if content is not None:
        path.write_text(content)
    assert_clear(*run(["train", "--recipe", str(path)], capsys), "roles.yaml", problem)


@pytest.mark.parametrize("override,problem", [
    ("badoverride", "section.key=value"),
    ("sft.max_steps=[1", "not valid YAML"),
    ("sft.max_steps=abc", "sft.max_steps"),
    ("sft.nope=1", "sft.nope"),
])
def test_bad_override(capsys, override, problem):
    assert_clear(*run(["train", "--recipe", f"{RECIPES}/roles.yaml", "--roles", "planner", override], capsys),
                 problem)


def test_datasets_lint_on_a_missing_path(tmp_path, capsys):
    assert_clear(*run(["datasets", "lint", str(tmp_path / "nope")], capsys), "nope", "does not exist")


def test_datasets_lint_on_a_folder_that_is_no_dataset(tmp_path, capsys):
    assert_clear(*run(["datasets", "lint", str(tmp_path)], capsys), "dataset_dict.json")


def test_trace_line_that_is_not_an_object_stops_the_build(tmp_path, capsys):
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "shard.jsonl").write_text('["a list"]\n{"kind": "event"}\n')
    assert_clear(*run(["datasets", "build", str(tmp_path)], capsys), "shard.jsonl:1", "not a JSON object")


@pytest.mark.parametrize("spec", ["openai:foo", "openai:#model", "openai:ftp://h/v1#m"])
def test_malformed_openai_spec_in_run(capsys, spec):
    assert_clear(*run(["run", "--task", "multi_turn_base_0", "--model", spec], capsys), spec)


def test_missing_model_folder(tmp_path, capsys):
    folder = str(tmp_path / "no-model")
    assert_clear(*run(["run", "--task", "multi_turn_base_0", "--model", folder], capsys), "no-model", "does not exist")


def test_unknown_hub_id_while_offline(capsys):
    assert_clear(*run(["run", "--task", "multi_turn_base_0", "--model", "nobody/no-such-model"], capsys),
                 "nobody/no-such-model", "HF_HUB_OFFLINE")


def test_hf_prefix_in_run_means_what_it_means_for_collect(capsys):
    # Before: transformers was asked for the repo 'hf:nobody/no-such-model' (an invalid id).
    assert_clear(*run(["run", "--task", "multi_turn_base_0", "--model", "hf:nobody/no-such-model"], capsys),
                 "'nobody/no-such-model'", "HF_HUB_OFFLINE")


def test_bad_adapter_folder(tmp_path, capsys):
    assert_clear(*run(["run", "--task", "multi_turn_base_0", "--model", "tiny-qwen3",
                       "--adapter", f"planner={tmp_path}"], capsys), "adapter_config.json", str(tmp_path))


def test_broken_adapter_config(tmp_path, capsys):
    (tmp_path / "adapter_config.json").write_text("{not json")
    assert_clear(*run(["run", "--task", "multi_turn_base_0", "--model", "tiny-qwen3",
                       "--adapter", f"planner={tmp_path}"], capsys), "tiny-qwen3")


@pytest.mark.parametrize("model", ["gold", "openai:http://127.0.0.1:9/v1#role"])
def test_adapter_with_gold_or_openai_is_refused(tmp_path, capsys, model):
    assert_clear(*run(["run", "--task", "multi_turn_base_0", "--model", model,
                       "--adapter", f"planner={tmp_path}"], capsys), "--adapter")


def test_teacher_hf_naming_a_missing_model(tmp_path, capsys):
    assert_clear(*run(["collect", "--env", "bfcl", "--teacher", f"hf:{tmp_path / 'absent'}",
                       "--out", str(tmp_path / "run"), "--limit", "1"], capsys), "absent", "--teacher")


def test_collect_resume_on_a_corrupted_trace(tmp_path, capsys):
    out = tmp_path / "run"
    assert run(["collect", "--env", "bfcl", "--limit", "1", "--out", str(out)], capsys)[0] == 0
    (shard,) = (out / "traces").glob("*.jsonl")
    shard.write_text("garbage\n" + shard.read_text())
    assert_clear(*run(["collect", "--env", "bfcl", "--limit", "1", "--out", str(out), "--resume"], capsys),
                 shard.name, "malformed")
    assert json.loads((out / "manifest.json").read_text())  # still whole
