"""Bad input ends in one line that names the problem and a non-zero exit, never a traceback.

Each case calls the command's ``main`` in-process: an exception escaping it is the
traceback a user would have seen (the test then fails with that exception).
"""

from __future__ import annotations

import json

import pytest

from heart_distill.cli import main as heart

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
    from heart_distill.train.sft import main as sft

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


# -- numbers out of range: argparse's own one-line error at parse time, exit 2 ------------------

def parse_error(argv: list[str], capsys) -> tuple[int, str]:
    """(exit status, last line of stderr) of a command argparse refuses."""
    with pytest.raises(SystemExit) as exit_:
        heart(argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return exit_.value.code, err.strip().splitlines()[-1]


def test_collect_concurrency_zero_is_refused_at_parse_time(tmp_path, capsys):
    # before: ValueError: max_workers must be greater than 0, from inside the thread pool
    code, line = parse_error(["collect", "--env", "bfcl", "--out", str(tmp_path), "--concurrency", "0"], capsys)
    assert (code, line) == (2, "heart collect: error: argument --concurrency: must be > 0, got 0")
    assert not (tmp_path / "manifest.json").exists()


def test_collect_negative_limit_is_refused_not_sliced(tmp_path, capsys):
    # before: task_ids[:-3], every task but the last three, silently
    code, line = parse_error(["collect", "--env", "bfcl", "--out", str(tmp_path), "--limit", "-3"], capsys)
    assert (code, line) == (2, "heart collect: error: argument --limit: must be >= 0, got -3")


@pytest.mark.parametrize("argv,expected", [
    (["run", "--task", "t", "--budget", "-1"], "heart run: error: argument --replan-budget/--budget: must be >= 0, got -1"),
    (["run", "--task", "t", "--model", "gold", "--fault-rate", "1.5"],
     "heart run: error: argument --fault-rate: must be within [0, 1], got 1.5"),
    (["run", "--task", "t", "--max-new-tokens", "abc"],
     "heart run: error: argument --max-new-tokens: must be an integer, got 'abc'"),
    (["demo", "--max-plan-steps", "0"], "heart demo: error: argument --max-plan-steps: must be > 0, got 0"),
    (["toolface", "--k", "0"], "heart toolface: error: argument --k: must be > 0, got 0"),
    (["serve", "--port", "70000"], "heart serve: error: argument --port: must be a TCP port within [1, 65535], got 70000"),
    (["serve", "--max-batch-size", "0"], "heart serve: error: argument --max-batch-size: must be > 0, got 0"),
    (["collect", "--env", "bfcl", "--out", "o", "--seeds", "0", "-1"],
     "heart collect: error: argument --seeds: must be >= 0, got -1"),
    (["collect", "--env", "bfcl", "--out", "o", "--fault-rate", "nan"],
     "heart collect: error: argument --fault-rate: must be a finite number, got 'nan'"),
    (["datasets", "build", "run", "--validation-fraction", "1"],
     "python -m heart_distill.data.build: error: argument --validation-fraction: must be within [0, 1), got 1"),
    (["datasets", "build", "run", "--verifier-balance", "0.5"],
     "python -m heart_distill.data.build: error: argument --verifier-balance: must be >= 1 or 'none', got 0.5"),
    (["datasets", "lint", "d", "--limit", "0"], "heart datasets lint: error: argument --limit: must be > 0, got 0"),
    (["eval", "e2e", "--env", "bfcl", "--out", "o", "--concurrency", "0"],
     "heart eval e2e: error: argument --concurrency: must be > 0, got 0"),
    (["eval", "e2e", "--env", "bfcl", "--out", "o", "--temperature", "-0.5"],
     "heart eval e2e: error: argument --temperature: must be >= 0, got -0.5"),
    (["eval", "roles", "--data", "d", "--out", "o", "--batch-size", "0"],
     "heart eval roles: error: argument --batch-size: must be > 0, got 0"),
    (["check", "parity", "--adapters", "d", "--max-new-tokens", "0"],
     "heart check parity: error: argument --max-new-tokens: must be > 0, got 0"),
])
def test_numbers_out_of_range_are_refused_at_parse_time(argv, expected, capsys):
    assert parse_error(argv, capsys) == (2, expected)


def test_the_range_types():
    import argparse

    from heart.argtypes import fraction, nonnegative_int, port, positive_int, probability, ratio_or_none

    assert positive_int("3") == 3 and nonnegative_int("0") == 0 and probability("1") == 1.0
    assert fraction("0") == 0.0 and ratio_or_none("none") is None and ratio_or_none("2") == 2.0 and port("8000") == 8000
    for check, text in [(positive_int, "0"), (positive_int, "1.5"), (nonnegative_int, "-1"), (probability, "-0.1"),
                        (probability, "inf"), (fraction, "1"), (ratio_or_none, "0.9"), (port, "0")]:
        with pytest.raises(argparse.ArgumentTypeError):
            check(text)


def test_range_checked_defaults_still_parse():
    from heart_distill.cli import build_parser

    args = build_parser().parse_args(["collect", "--env", "bfcl", "--out", "o"])
    assert (args.concurrency, args.limit, args.fault_rate, args.seeds) == (8, 0, 0.0, [0])
    args = build_parser().parse_args(["serve"])
    assert (args.port, args.max_batch_size) == (8000, 8)


# -- heart train with one role's recipe -----------------------------------------------------------

def test_train_with_one_roles_recipe_trains_that_role(tmp_path, monkeypatch, capsys):
    """The per-role recipe a user tries first: before, "unknown key(s) ['data', 'lora', ...]"."""
    import subprocess

    from heart_distill.train.synthetic import write_synthetic_role_dataset

    started = []
    monkeypatch.setattr(subprocess, "call", lambda command: started.append(command) or 0)
    write_synthetic_role_dataset(tmp_path, "router", 2, 1, compact=True)
    overrides = [f"data.dataset_dir={tmp_path}/router", f"output.dir={tmp_path}/adapters/router"]
    assert heart(["train", "--recipe", f"{RECIPES}/router.yaml", *overrides]) == 0
    (command,) = started
    recipes = [command[i + 1] for i, arg in enumerate(command) if arg == "--recipe"]
    assert recipes == [f"{RECIPES}/router.yaml"]
    # the accelerate config of the roles.yaml beside it
    assert command[command.index("--config_file") + 1].endswith("smollm2-135m/../accelerate/cpu.yaml")
    assert command[-2:] == overrides
    assert "router role's recipe: training router alone" in capsys.readouterr().err


def test_train_with_a_lone_role_recipe_uses_accelerates_defaults(tmp_path, monkeypatch, capsys):
    import subprocess

    from heart_distill.train.synthetic import write_synthetic_role_dataset

    started = []
    monkeypatch.setattr(subprocess, "call", lambda command: started.append(command) or 0)
    write_synthetic_role_dataset(tmp_path, "verifier", 2, 1, compact=True)
    recipe = tmp_path / "mine.yaml"
    recipe.write_text(f"data:\n  role: verifier\n  dataset_dir: {tmp_path}/verifier\n"
                      f"output:\n  dir: {tmp_path}/adapters/verifier\n")
    assert heart(["train", "--recipe", str(recipe)]) == 0
    (command,) = started
    assert "--config_file" not in command and command[command.index("--recipe") + 1] == str(recipe)
    assert "accelerate's defaults" in capsys.readouterr().err


def test_train_with_one_roles_recipe_and_another_role_is_clear(capsys):
    assert_clear(*run(["train", "--recipe", f"{RECIPES}/router.yaml", "--roles", "planner"], capsys),
                 "router.yaml", "no recipe for role(s) ['planner']", "router")


def test_train_with_a_pipeline_recipe_names_heart_pipeline(capsys):
    assert_clear(*run(["train", "--recipe", f"{RECIPES}/pipeline.yaml"], capsys),
                 "pipeline.yaml", "heart pipeline --recipe")
