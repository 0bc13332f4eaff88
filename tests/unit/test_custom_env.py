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


GIT_TASKS = Path(__file__).resolve().parents[2] / "examples" / "your-tools" / "git-tasks.jsonl"


def test_a_task_with_setup_runs_its_stdio_server_in_a_fresh_directory_of_its_own():
    """The worked example's git tasks: each episode's repository is built by the task's setup,
    a commit in one episode is not seen by the next, and the directory goes with the session."""
    environment = load_environment("custom", tasks=str(GIT_TASKS), tools="mcp:python -m mcp_server_git")
    task = environment.load_task("commit-1")
    first = environment.start(task)
    directory = Path(first.workdir.name)
    assert (directory / "project" / ".git").is_dir()
    first.start_turn(0)
    tools = {t.name: t.fn for t in first.tools}
    assert "CHANGELOG.md" in tools["git_status"](repo_path="project")  # staged by the setup
    tools["git_commit"](repo_path="project", message="Add changelog")
    assert "Add changelog" in tools["git_log"](repo_path="project", max_count=1)
    first.finish_turn(0, "Committed.")
    assert not first.score().success  # the calls beyond the expected one count against it  # the expected call, made through the server
    second = environment.start(task)
    try:
        assert Path(second.workdir.name) != directory
        second.start_turn(0)
        log = {t.name: t.fn for t in second.tools}["git_log"](repo_path="project", max_count=1)
        assert "Add changelog" not in log and "Test addition" in log  # the setup's history, not the first episode's
    finally:
        second.close()
        first.close()
    assert not directory.exists()


def test_a_failing_setup_fails_its_episode_naming_the_task_and_the_rest_go_on(tmp_path):
    from heart_distill.cli import main

    (tmp_path / "make.py").write_text("import sys\nsys.exit('no repository today')\n")
    good = json.loads(GIT_TASKS.read_text().splitlines()[0])
    tasks = tmp_path / "tasks.jsonl"
    fixture = Path(GIT_TASKS).parent / "make_repo.py"
    test_ids = [f"task-{i}" for i in range(200) if split_of("custom", f"task-{i}") == "test"][:4]
    broken, *fine = test_ids
    lines = [{**good, "id": task_id, "setup": f"python {fixture}"} for task_id in fine]
    lines.append({**good, "id": broken, "setup": "python make.py"})
    tasks.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "e2e"
    assert main(["eval", "e2e", "--env", "custom", "--tasks", str(tasks), "--tools", "mcp:python -m mcp_server_git",
                 "--roles", "teacher:gold", "--limit", "4", "--out", str(out)]) == 0
    rows = {r["task_id"]: r for r in map(json.loads, (out / "episodes.jsonl").read_text().splitlines())}
    assert rows[broken]["errored"] and f"task {broken}: setup" in rows[broken]["error"]
    assert "no repository today" in rows[broken]["error"]
    assert all(rows[task_id]["success"] and not rows[task_id]["errored"] for task_id in fine)


def test_setup_is_refused_for_tools_that_run_in_this_process_and_an_empty_one_names_its_line(tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "a", "request": "hi", "setup": "python make.py"}) + "\n")
    with pytest.raises(TasksFileError, match="task 'a': field 'setup' prepares a directory for a stdio MCP server"):
        CustomEnvironment(tasks, python_tools(TOOLS))
    tasks.write_text(json.dumps({"id": "a", "request": "hi", "setup": "   "}) + "\n")
    with pytest.raises(TasksFileError, match="line 1: field 'setup'"):
        load_tasks(tasks)
