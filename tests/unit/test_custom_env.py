"""A user's own tools and tasks (heart.environments.custom): the tasks file, Python functions
as tools, the expected-call checker, splits, and a gold collection through `heart collect`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from heart.environments import load_environment, split_of
from heart.environments.base import ToolCall
from heart.environments.custom import (CustomEnvironment, TasksFileError, ToolRegistrationError, check_calls,
                                       load_tasks, python_tools)

TOOLS = str(Path(__file__).resolve().parents[1] / "data" / "custom_tools.py")


def tasks_file(tmp_path, n=40):
    cities = ["Paris", "Rome", "Oslo", "Lima", "Cairo", "Quito", "Hanoi", "Dakar"]
    lines = []
    for i in range(n):
        a, b = cities[i % 8], cities[(i + 3) % 8]
        if i % 2:
            lines.append({"id": f"weather-{i}", "request": f"What is the weather in {a} and in {b}?",
                          "expected_calls": [{"name": "get_weather", "arguments": {"city": a}},
                                             {"name": "get_weather", "arguments": {"city": b}}]})
        else:
            lines.append({"id": f"money-{i}", "request": f"Convert {10 + i} EUR to USD.",
                          "expected_calls": [{"name": "convert_currency",
                                              "arguments": {"amount": 10 + i, "source": "EUR", "target": "USD"}}]})
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    return path


@pytest.mark.parametrize("line, words", [
    ("not json", "line 2: not a JSON object"),
    ('{"request": "hi"}', "line 2: field 'id': Field required"),
    ('{"id": "x", "request": ""}', "line 2: field 'request'"),
    ('{"id": "x", "request": "hi", "expected_calls": [{"arguments": {}}]}', "line 2: field 'expected_calls"),
    ('{"id": "x", "request": ["a", "b"], "expected_calls": [{"name": "f"}]}', "1 turn(s) of calls for 2 turn(s)"),
    ('{"id": "ok", "request": "again"}', "line 2: field 'id': 'ok' is the id of an earlier task"),
    ('{"id": "x", "request": "hi", "extra": 1}', "line 2: field 'extra'"),
])
def test_a_malformed_tasks_file_is_refused_naming_the_line_and_field(tmp_path, line, words):
    path = tmp_path / "tasks.jsonl"
    path.write_text('{"id": "ok", "request": "hello"}\n' + line + "\n")
    with pytest.raises(TasksFileError, match=words.replace("(", r"\(").replace(")", r"\)")):
        load_tasks(path)


def test_typed_functions_become_tools_and_an_unsupported_signature_is_refused(tmp_path):
    tools = {t.name: t for t in python_tools(TOOLS)}
    assert list(tools) == ["get_weather", "convert_currency"]  # definition order, public functions only
    assert {t.spec.category for t in tools.values()} == {"custom_tools"}  # the module's own name
    assert tools["get_weather"].spec.parameters["required"] == ["city"]
    assert tools["convert_currency"].spec.parameters["properties"]["amount"]["type"] == "number"
    bad = tmp_path / "bad_tools.py"
    bad.write_text('def ok(x: int) -> int:\n    """Ok.\n\n    Args:\n        x: A number.\n    """\n    return x\n\n'
                   'def loose(*values):\n    """Sum."""\n    return sum(values)\n')
    with pytest.raises(ToolRegistrationError, match="function loose: parameters values are \\*args"):
        python_tools(bad)
    bad.write_text("def untyped(x):\n    return x\n")
    with pytest.raises(ToolRegistrationError, match="function untyped cannot be described as a tool"):
        python_tools(bad)


def test_the_checker_applies_the_ast_checkers_rules():
    want = [[ToolCall("get_weather", {"city": "Paris"}), ToolCall("get_weather", {"city": "Rome"})]]
    assert check_calls(want, [[ToolCall("get_weather", {"city": "rome"}), ToolCall("get_weather", {"city": "Paris"})]])[0]
    assert not check_calls(want, [[ToolCall("get_weather", {"city": "Paris"})]])[0]  # a call missing
    extra = [[*want[0], ToolCall("get_weather", {"city": "Oslo"})]]
    assert "beyond the expected" in check_calls(want, extra)[1]
    assert not check_calls(want, [[ToolCall("get_weather", {"city": "Paris", "unit": "kelvin"}), want[0][1]]])[0]
    assert check_calls([[ToolCall("f", {"x": 3})]], [[ToolCall("f", {"x": 3.0})]])[0]  # numbers as numbers


def test_custom_tasks_split_disjointly_by_id(tmp_path):
    env = CustomEnvironment(tasks_file(tmp_path), python_tools(TOOLS))
    parts = {s: set(env.task_ids(s)) for s in ("train", "dev", "test")}
    assert set().union(*parts.values()) == set(env.task_ids()) and sum(map(len, parts.values())) == 40
    assert not (parts["train"] & parts["test"]) and parts["train"] and parts["test"]
    assert all(split_of("custom", t) == "test" for t in parts["test"])


def test_load_environment_refuses_custom_without_its_files_and_files_without_custom(tmp_path):
    with pytest.raises(ValueError, match="--env custom needs --tasks FILE"):
        load_environment("custom")
    with pytest.raises(ValueError, match="apply to --env custom only"):
        load_environment("bfcl", tasks=str(tasks_file(tmp_path)))


def test_a_gold_collection_over_python_tools_is_scored_and_builds_datasets(tmp_path, capsys):
    from datasets import load_from_disk

    from heart_distill.cli import main

    tasks = tasks_file(tmp_path)
    out = tmp_path / "run"
    assert main(["collect", "--env", "custom", "--tasks", str(tasks), "--tools", TOOLS, "--split", "train",
                 "--teacher", "gold", "--out", str(out)]) == 0
    assert main(["tasks", "--env", "custom", "--tasks", str(tasks), "--tools", TOOLS, "--split", "test"]) == 0
    assert capsys.readouterr().out.split()  # the test tasks are listed
    records = [json.loads(line) for f in (out / "traces").glob("*.jsonl") for line in f.read_text().splitlines()
               if '"kind": "episode"' in line]
    assert records and all(r["success"] for r in records)  # the gold teacher's calls pass the checker
    manifest = json.loads((out / "manifest.json").read_text())
    (entry,) = manifest["collections"]
    assert entry["tasks_file"] == str(tasks) and entry["tools"] == TOOLS and len(entry["tasks_sha256"]) == 64
    assert main(["datasets", "build", str(out), "--out", str(out / "datasets")]) == 0
    planner = load_from_disk(str(out / "datasets" / "planner"))
    assert {row["env"] for row in planner["train"]} == {"custom"}


def test_the_whole_loop_is_evaluated_on_held_out_custom_tasks(tmp_path):
    from heart_distill.cli import main

    tasks = tasks_file(tmp_path)
    out = tmp_path / "e2e"
    assert main(["eval", "e2e", "--env", "custom", "--tasks", str(tasks), "--tools", TOOLS, "--roles",
                 "teacher:gold", "--limit", "4", "--out", str(out)]) == 0
    results = json.loads((out / "e2e.json").read_text())
    assert results["figures"]["success_rate"]["value"] == 1.0 and results["figures"]["success_rate"]["n"] == 4
    assert json.loads((out / "e2e-run.json").read_text())["tasks_file"] == str(tasks)


def test_heart_run_takes_the_custom_environment(tmp_path, capsys):
    from heart_distill.cli import main

    tasks = tasks_file(tmp_path)
    task = CustomEnvironment(tasks, python_tools(TOOLS)).task_ids("train")[0]
    assert main(["run", "--env", "custom", "--tasks", str(tasks), "--tools", TOOLS, "--model", "gold",
                 "--task", task]) == 0
    assert f"{task}=1.00" in capsys.readouterr().out
    assert main(["run", "--env", "custom", "--task", task]) == 2
    assert "--env custom needs --tasks FILE" in capsys.readouterr().err
