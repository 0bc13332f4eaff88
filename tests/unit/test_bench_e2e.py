"""heart eval bench: the whole-loop benchmark in chunks, a ledger that resumes, a report from all chunks so far."""

from __future__ import annotations

import json

import pytest
import yaml

from heart_distill.eval import bench_e2e


def recipe(tmp_path, **over):
    data = {"out": str(tmp_path / "bench"), "chunk_tasks": 2, "concurrency": 2,
            "arms": [{"name": "teacher", "roles": "teacher:gold"}],
            "conditions": [{"name": "simple", "env": "bfcl", "category": "simple", "tasks": 3}], **over}
    path = tmp_path / "bench.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def finish_multi_turn_chunk(config, chunk, checkers):
    """Write ``chunk`` as finished: each arm's failed episodes with the given checker records
    (one per task, in order), and a stamp holding every command of the chunk."""
    for arm, records in checkers.items():
        folder = chunk.folder / arm
        folder.mkdir(parents=True)
        (folder / "episodes.jsonl").write_text("".join(
            json.dumps({"task_id": t, "success": False, "errored": False, "checker": r}) + "\n"
            for t, r in zip(chunk.tasks, records)))
    commands = {",".join(bench_e2e.command_arms(c)): {"key": "sha256:x", "wall_s": 1.0}
                for c in bench_e2e.chunk_commands(config, chunk)}
    (chunk.folder / "stamp.json").write_text(json.dumps({"tasks": chunk.tasks, "wall_s": 2.0,
                                                         "finished_at": "now", "commands": commands}))


REPORT_STAMP = {"command": "c", "commit": "x", "dirty": False, "date": "d", "machine": {}}


def test_the_base_runs_beside_the_first_adapter_set_and_other_arms_alone(tmp_path):
    (tmp_path / "adapters").mkdir()
    config = bench_e2e.load_bench(recipe(tmp_path, arms=[
        {"name": "base", "roles": "base"}, {"name": "distilled", "roles": str(tmp_path / "adapters")},
        {"name": "teacher", "roles": "teacher:gold"}]))
    chunk = bench_e2e.plan_chunks(config)[0]
    commands = bench_e2e.chunk_commands(config, chunk)
    assert len(commands) == 2
    paired, teacher = commands
    assert paired[paired.index("--roles") + 1] == str(tmp_path / "adapters")
    assert paired[paired.index("--base-out") + 1] == str(chunk.folder / "base")
    assert teacher[teacher.index("--roles") + 1] == "teacher:gold" and "--base-out" not in teacher
    assert [paired[i + 1] for i, a in enumerate(paired) if a == "--task"] == chunk.tasks
    assert len(chunk.tasks) == 2 and all(t.startswith("simple_python_") for t in chunk.tasks)


def test_a_condition_sets_its_own_chunk_size_and_concurrency_without_touching_the_others(tmp_path):
    config = bench_e2e.load_bench(recipe(tmp_path, conditions=[
        {"name": "simple", "env": "bfcl", "category": "simple", "tasks": 3},
        {"name": "multi", "env": "bfcl", "category": "multi_turn_base", "tasks": 3, "chunk_tasks": 1,
         "concurrency": 4}]))
    chunks = bench_e2e.plan_chunks(config)
    assert [(c.condition.name, len(c.tasks)) for c in chunks] == [("simple", 2), ("simple", 1), ("multi", 1),
                                                                  ("multi", 1), ("multi", 1)]
    flags = [(cmd := bench_e2e.chunk_commands(config, c)[0])[cmd.index("--concurrency") + 1]
             for c in (chunks[0], chunks[2])]
    assert flags == ["2", "4"]


def test_an_arm_limited_to_some_conditions_runs_only_there_and_leaves_the_others_commands_alone(tmp_path):
    """A seed arm on the single-turn conditions only: the multi-turn chunks keep the commands
    (and so the keys) they had without it, and a condition name the recipe lacks is refused."""
    (tmp_path / "adapters").mkdir()
    arms = [{"name": "base", "roles": "base"}, {"name": "distilled", "roles": str(tmp_path / "adapters")}]
    conditions = [{"name": "simple", "env": "bfcl", "category": "simple", "tasks": 2},
                  {"name": "multi", "env": "bfcl", "category": "multi_turn_base", "tasks": 2}]
    before = bench_e2e.load_bench(recipe(tmp_path, arms=arms, conditions=conditions))
    seed = {"name": "seed-1", "roles": str(tmp_path / "adapters"), "seed_of": "distilled", "conditions": ["simple"]}
    after = bench_e2e.load_bench(recipe(tmp_path, arms=[*arms, seed], conditions=conditions))
    simple, multi = bench_e2e.plan_chunks(after)
    assert [bench_e2e.command_arms(c) for c in bench_e2e.chunk_commands(after, simple)] == [["distilled", "base"],
                                                                                             ["seed-1"]]
    assert bench_e2e.chunk_commands(after, multi) == bench_e2e.chunk_commands(before, bench_e2e.plan_chunks(before)[1])
    with pytest.raises(bench_e2e.RecipeError, match=r"arm seed-1: conditions names no condition .*\['simpel'\]"):
        bench_e2e.load_bench(recipe(tmp_path, arms=[*arms, {**seed, "conditions": ["simpel"]}], conditions=conditions))


@pytest.mark.parametrize("bad, words", [({"arms": [{"name": "a", "roles": "base"}, {"name": "b", "roles": "base"}]},
                                         "at most one arm is the base"),
                                        ({"conditions": [{"name": "x", "env": "agentdojo", "category": "simple"}]},
                                         "category applies to bfcl only"),
                                        ({"chunk_tasks": 0}, "chunk_tasks"),
                                        ({"conditions": [{"name": "x", "env": "agentdojo", "chunk_tasks": 0}]},
                                         "chunk_tasks"),
                                        ({"loop": {"router_mode": "sideways"}}, "router_mode")])
def test_a_bad_recipe_is_refused_naming_the_field(tmp_path, bad, words, capsys):
    assert bench_e2e.main(["--recipe", str(recipe(tmp_path, **bad))]) == 2
    assert words in capsys.readouterr().err


def test_chunks_append_to_the_ledger_and_the_report_counts_every_chunk_so_far(tmp_path, capsys):
    path = recipe(tmp_path)
    out = tmp_path / "bench"
    assert bench_e2e.main(["--recipe", str(path)]) == 0  # one chunk per call by default
    report = json.loads((out / "report.json").read_text())
    condition = report["conditions"][0]
    assert (condition["tasks_so_far"], condition["planned_tasks"]) == (2, 3)
    assert condition["arms"]["teacher"]["tasks"] == 2 and condition["arms"]["teacher"]["success"]["value"] == 1.0
    assert "2 of 3" in (out / "report.md").read_text()
    first_stamp = (out / "simple" / "chunk-000" / "stamp.json").read_text()
    assert bench_e2e.main(["--recipe", str(path), "--max-chunks", "5"]) == 0  # the rest; chunk 0 is not rerun
    assert (out / "simple" / "chunk-000" / "stamp.json").read_text() == first_stamp
    report = json.loads((out / "report.json").read_text())
    condition = report["conditions"][0]
    assert condition["tasks_so_far"] == 3 and len(condition["chunks"]) == 2
    # the single-turn conditions pooled: every task of every single-turn condition, per arm
    assert report["single_turn"]["teacher"]["tasks"] == 3
    assert report["single_turn"]["teacher"]["success"] == condition["arms"]["teacher"]["success"]
    assert "| **BFCL single-turn, pooled** | 3 |" in (out / "report.md").read_text()
    assert "0 of 2 left" in capsys.readouterr().out.splitlines()[-1]
    # another configuration makes the finished chunks stale: they run again
    config = bench_e2e.load_bench(recipe(tmp_path, loop={"max_plan_steps": 3}))
    assert {bench_e2e.chunk_state(config, c) for c in bench_e2e.plan_chunks(config)} == {"stale"}


def test_an_arm_added_later_runs_alone_on_the_finished_chunks(tmp_path):
    path = recipe(tmp_path)
    out = tmp_path / "bench"
    assert bench_e2e.main(["--recipe", str(path), "--max-chunks", "5"]) == 0
    chunk = out / "simple" / "chunk-000"
    teacher_trace = (chunk / "teacher" / "trace.jsonl.gz").read_bytes()
    first_stamp = json.loads((chunk / "stamp.json").read_text())
    path = recipe(tmp_path, arms=[{"name": "teacher", "roles": "teacher:gold"},
                                  {"name": "again", "roles": "teacher:gold"}])
    config = bench_e2e.load_bench(path)
    assert {bench_e2e.chunk_state(config, c) for c in bench_e2e.plan_chunks(config)} == {"new"}
    assert bench_e2e.main(["--recipe", str(path), "--report-only"]) == 0
    assert "| simple | again |" not in (out / "report.md").read_text()  # no episode yet: no failure row
    assert bench_e2e.main(["--recipe", str(path), "--max-chunks", "5"]) == 0
    assert "| simple | again | 0 |" in (out / "report.md").read_text()
    stamp = json.loads((chunk / "stamp.json").read_text())
    assert stamp["commands"]["teacher"] == first_stamp["commands"]["teacher"]  # not run again
    assert (chunk / "teacher" / "trace.jsonl.gz").read_bytes() == teacher_trace
    assert set(stamp["commands"]) == {"teacher", "again"}
    report = json.loads((out / "report.json").read_text())
    assert report["conditions"][0]["arms"]["again"]["tasks"] == 3
    # the chunk's time is now two calls' sum; the report names the longest call, the one bounded
    calls = {c["arms"]: c["wall_s"] for c in report["conditions"][0]["chunks"][0]["calls"]}
    assert calls == {name: stamp["commands"][name]["wall_s"] for name in ("teacher", "again")}
    longest = max(calls, key=calls.get)
    assert f"in 2 calls, the longest {calls[longest] / 60:.1f} min ({longest})" in (out / "report.md").read_text()


def test_max_calls_bounds_a_call_inside_a_chunk_and_the_next_call_finishes_it(tmp_path, capsys):
    arms = [{"name": "teacher", "roles": "teacher:gold"}, {"name": "again", "roles": "teacher:gold"}]
    path = recipe(tmp_path, arms=arms)
    out = tmp_path / "bench"
    assert bench_e2e.main(["--recipe", str(path), "--max-calls", "1"]) == 0
    stamp = json.loads((out / "simple" / "chunk-000" / "stamp.json").read_text())
    assert set(stamp["commands"]) == {"teacher"}  # one arm's call; the chunk is not done
    assert "the rest left for the next call" in capsys.readouterr().out
    arms = json.loads((out / "report.json").read_text())["conditions"][0]["arms"]
    assert (arms["teacher"]["tasks"], arms["again"]["tasks"]) == (2, 0)  # each arm's n: its finished calls
    assert bench_e2e.main(["--recipe", str(path), "--max-calls", "1", "--max-chunks", "5"]) == 0
    stamp = json.loads((out / "simple" / "chunk-000" / "stamp.json").read_text())
    assert set(stamp["commands"]) == {"teacher", "again"}
    assert not (out / "simple" / "chunk-001").exists()  # its one call was spent on chunk 0
    assert json.loads((out / "report.json").read_text())["conditions"][0]["arms"]["again"]["tasks"] == 2
    assert bench_e2e.main(["--recipe", str(path), "--max-calls", "0"]) == 2
    assert "--max-calls must be at least 1, not 0" in capsys.readouterr().err


def test_distillation_seeds_get_lift_statistics_over_the_base(tmp_path):
    """Three seed arms against the base, on episodes written as ``heart eval e2e`` writes them."""
    seeds = {"d0": [1, 1, 0, 0], "d1": [1, 0, 0, 0], "d2": [0, 0, 0, 0]}
    arms = [{"name": "base", "roles": "base"}, {"name": "d0", "roles": str(tmp_path / "a0")},
            *({"name": n, "roles": str(tmp_path / n), "seed_of": "d0"} for n in ("d1", "d2"))]
    config = bench_e2e.load_bench(recipe(tmp_path, arms=arms, chunk_tasks=4, contrasts=[["d0", "d2"]], conditions=[
        {"name": "simple", "env": "bfcl", "category": "simple", "tasks": 4}]))
    (chunk,) = bench_e2e.plan_chunks(config)
    base_success = [0, 1, 0, 0]
    for arm, success in [("base", base_success), *seeds.items()]:
        folder = chunk.folder / arm
        folder.mkdir(parents=True)
        (folder / "episodes.jsonl").write_text("".join(
            json.dumps({"task_id": t, "success": bool(s), "errored": False, "checker": {}}) + "\n"
            for t, s in zip(chunk.tasks, success)))
    commands = {",".join(bench_e2e.command_arms(c)): {"key": "sha256:x"}
                for c in bench_e2e.chunk_commands(config, chunk)}
    (chunk.folder / "stamp.json").write_text(json.dumps({"tasks": chunk.tasks, "wall_s": 1.0,
                                                         "finished_at": "now", "commands": commands}))
    report = bench_e2e.build_report(config, [chunk])
    # a stamp from before calls were timed one by one: its calls share the chunk's time
    (calls,) = [c["calls"] for c in report["conditions"][0]["chunks"]]
    assert calls == [{"arms": " and ".join(commands) + " together", "wall_s": 1.0, "finished_at": None}]
    # a contrast between two arms: d0 solves tasks 0 and 1, d2 none
    assert report["conditions"][0]["contrasts"]["d0 − d2"]["value"] == 0.5
    assert report["single_turn_contrasts"]["d0 − d2"]["value"] == 0.5
    assert "| simple | 50.0 [" in bench_e2e.render_report(report, {"command": "c", "commit": "x", "dirty": False,
                                                                    "date": "d", "machine": {}})
    group = report["seeds"]["d0"]
    assert [p["lift"] for p in group["per_seed"]] == [25.0, 0.0, -25.0]
    assert group["mean_lift"] == 0.0 and group["rr0"] == pytest.approx(1 / 3)
    assert group["worst_lift"] == 0.0 and group["rel_lift95"] == -25.0
    with pytest.raises(bench_e2e.RecipeError, match=r"contrasts: \[d0, nobody\] must name two different arms"):
        bench_e2e.load_bench(recipe(tmp_path, arms=arms, contrasts=[["d0", "nobody"]]))
    with pytest.raises(bench_e2e.RecipeError, match="seed_of names no other arm"):
        bench_e2e.load_bench(recipe(tmp_path, arms=[{"name": "x", "roles": "base", "seed_of": "nobody"}]))


def test_a_failed_episode_is_attributed_to_the_first_place_it_broke():
    from heart.environments.base import ToolCall

    gold = [[ToolCall("area", {"r": 3}), ToolCall("area", {"r": 5})]]

    def plan(*tools, parse_error=None):
        steps = [{"step": i, "tool_hint": t} for i, t in enumerate(tools, 1)]
        return {"role": "planner", "turn": 0, "attempt": 0, "parse_error": parse_error,
                "parsed": None if parse_error else {"status": "SUFFICIENT", "plan": steps}}

    failed = {"success": False, "verdicts": ["FAIL"], "replans_used": [1]}
    point = bench_e2e.failure_point
    assert point([plan(parse_error="not JSON")], failed, gold, 3) == "planner_unparsed"
    assert point([plan("volume", "area")], failed, gold, 3) == "plan_tools"  # a tool not needed
    assert point([plan("volume")], failed, gold, 3) == "plan_tools"  # a gold tool missing
    assert point([plan("area")], failed, gold, 3) == "plan_length"  # the one-step plan of a two-call request
    primitive = {"role": "primitive", "turn": 0, "extra": {"envelope": {"status": "FAILURE"}}}
    assert point([plan("area", "area"), primitive], failed, gold, 3) == "primitive_failure"
    assert point([plan("area", "area")], {**failed, "verdicts": ["PASS"]}, gold, 3) == "verifier_pass"
    assert point([plan("area", "area")], {**failed, "replans_used": [3]}, gold, 3) == "replan_budget"
    assert point([plan("area", "area")], failed, gold, 3) == "other"
    # where the benchmark's checker can judge calls, a Router that bound other values broke it first
    def router(step, r, attempt=0):
        return {"role": "router", "turn": 0, "attempt": attempt, "parse_error": None,
                "parsed": {"status": "READY", "dispatch": [{"step": step, "target_tool": "area",
                                                            "resolved_bindings": {"r": r}}]}}

    def accepts(calls):
        return [c.arguments for c in calls] == [{"r": 3}, {"r": 5}]

    assert bench_e2e.router_calls([router(2, 5), router(1, 3), router(1, 4, attempt=1)]) == gold[0]
    assert point([plan("area", "area"), router(1, 3), router(2, 3), primitive], failed, gold, 3,
                 accepts) == "router_binding"
    assert point([plan("area", "area"), router(1, 3), router(2, 5), primitive], failed, gold, 3,
                 accepts) == "primitive_failure"


def test_a_routers_bindings_are_judged_by_bfcls_own_checker():
    """The BFCL single-turn environment checks a list of calls as it scores an episode's."""
    from heart.environments import load_environment
    from heart.environments.base import ToolCall

    environment = load_environment("bfcl", "simple")
    task = environment.load_task("simple_python_27")  # initial_velocity 10, acceleration 2, time 5
    assert environment.check(task.task_id, task.gold[0])["valid"]
    wrong = [ToolCall(c.name, {**c.arguments, "initial_velocity": 2}) for c in task.gold[0]]
    result = environment.check(task.task_id, wrong)
    assert not result["valid"] and result["error_type"].startswith("value_error")


def test_a_first_plan_is_right_when_it_holds_the_gold_calls_tools_as_often_as_they_do():
    from heart.environments.base import ToolCall

    offered = {"role": "user", "content": "Plan this query.\n" + json.dumps(
        {"user_query": "q", "available_tools": {"code": {"compute": "c"}, "": {"area": "a", "volume": "v"}}})}

    def plan(*tools, turn=0, status="SUFFICIENT"):
        steps = [{"step": i, "tool_hint": t} for i, t in enumerate(tools, 1)] + [{"step": 9, "family": "code",
                                                                                   "tool_hint": "compute"}]
        return {"role": "planner", "turn": turn, "messages": [offered], "parsed": {"status": status, "plan": steps}}

    assert bench_e2e.offered_tools(plan("area")) == ["area", "volume"]  # the code family left out
    two = [[ToolCall("area", {"r": 3}), ToolCall("area", {"r": 5})]]
    assert bench_e2e.first_plans([plan("area", "area"), plan("area", turn=0)], two) == [(True, False)]
    assert bench_e2e.first_plans([plan("area")], two) == [(False, False)]  # one step for two calls
    assert bench_e2e.first_plans([plan("area", status="INSUFFICIENT")], [[ToolCall("area", {})]]) == [(False, True)]
    # the trivial rule is right where one call of the first offered tool is all the turn needs
    assert bench_e2e.first_plans([plan("area")], [[ToolCall("area", {})]]) == [(True, True)]
    # a turn without gold calls, or without a Planner call, is not counted
    assert bench_e2e.first_plans([plan("volume", turn=1)], [[], [ToolCall("volume", {})], [ToolCall("area", {})]]) \
        == [(True, False)]


def test_multi_turn_conditions_report_per_turn_success(tmp_path):
    path = recipe(tmp_path, conditions=[{"name": "base", "env": "bfcl", "category": "multi_turn_base", "tasks": 1}])
    assert bench_e2e.main(["--recipe", str(path)]) == 0
    (condition,) = json.loads((tmp_path / "bench" / "report.json").read_text())["conditions"]
    teacher = condition["arms"]["teacher"]
    assert teacher["per_turn_success"]["n"] == 1 and teacher["per_turn_success"]["value"] == teacher["success"]["value"]
    assert "per-turn success" in (tmp_path / "bench" / "report.md").read_text()


def test_per_turn_success_is_paired_over_the_base_and_between_the_recipes_arms(tmp_path):
    """Whole multi-turn tasks all fail here, yet the paired per-turn differences move."""
    turns_passed = {"base": [0, 1, 0], "d0": [2, 1, 1], "d1": [0, 0, 1]}  # of 4 turns each
    arms = [{"name": "base", "roles": "base"}, {"name": "d0", "roles": str(tmp_path / "d0")},
            {"name": "d1", "roles": str(tmp_path / "d1")}]
    config = bench_e2e.load_bench(recipe(tmp_path, arms=arms, chunk_tasks=3, contrasts=[["d0", "d1"]], conditions=[
        {"name": "mt", "env": "bfcl", "category": "multi_turn_base", "tasks": 3}]))
    (chunk,) = bench_e2e.plan_chunks(config)
    finish_multi_turn_chunk(config, chunk, {arm: [{"turns": 4, "turns_passed": n} for n in passed]
                                            for arm, passed in turns_passed.items()})
    report = bench_e2e.build_report(config, [chunk])
    (condition,) = report["conditions"]
    assert condition["arms"]["d0"]["delta_vs_base"]["value"] == 0.0  # success: nothing to tell apart
    assert condition["arms"]["d0"]["per_turn_delta_vs_base"]["value"] == pytest.approx(3 / 12)
    assert condition["arms"]["d1"]["per_turn_delta_vs_base"]["value"] == 0.0
    assert condition["per_turn_contrasts"]["d0 − d1"]["value"] == pytest.approx(3 / 12)
    rendered = bench_e2e.render_report(report, REPORT_STAMP)
    assert "| Δ d0 − base | Δ d1 − base | d0 − d1 |" in rendered
    assert "| mt | 8.3 [" in rendered and "| 25.0 [" in rendered


def test_clarifications_are_reported_per_arm_where_a_turn_withholds_a_parameter(tmp_path):
    """miss_param: the base never asks; d0 asks in both turns that need it and once where none does."""
    records = {"base": [{"needed": [1], "asked": []}, {"needed": [2], "asked": []}],
               "d0": [{"needed": [1], "asked": [1, 3]}, {"needed": [2], "asked": [2]}]}
    arms = [{"name": "base", "roles": "base"}, {"name": "d0", "roles": str(tmp_path / "d0")}]
    config = bench_e2e.load_bench(recipe(tmp_path, arms=arms, chunk_tasks=2, conditions=[
        {"name": "mp", "env": "bfcl", "category": "multi_turn_miss_param", "tasks": 2}]))
    (chunk,) = bench_e2e.plan_chunks(config)
    finish_multi_turn_chunk(config, chunk, {arm: [{"turns": 4, "turns_passed": 0, "clarifications": r} for r in rs]
                                            for arm, rs in records.items()})
    report = bench_e2e.build_report(config, [chunk])
    (condition,) = report["conditions"]
    assert condition["arms"]["base"]["clarification_recall"]["value"] == 0.0
    assert condition["arms"]["base"]["clarification_precision"]["value"] is None  # it asked nothing
    assert condition["arms"]["d0"]["clarification_recall"]["value"] == 1.0
    assert condition["arms"]["d0"]["clarification_precision"]["value"] == pytest.approx(2 / 3)
    rendered = bench_e2e.render_report(report, REPORT_STAMP)
    assert "| mp | base | 0.0 [0.0, 0.0] | – | 0.00 / 1.00 |" in rendered
    assert "| mp | d0 | 100.0 [100.0, 100.0] | 66.7 [50.0, 100.0] | 1.50 / 1.00 |" in rendered


def test_a_finished_chunks_traces_are_gzipped_and_read_back_the_same(tmp_path):
    arm = tmp_path / "chunk-000" / "base"
    arm.mkdir(parents=True)
    lines = [json.dumps({"task_id": "t", "role": "planner", "n": i}) for i in range(50)]
    (arm / "trace.jsonl").write_text("\n".join(lines) + "\n")
    plain = bench_e2e._trace_lines(arm)
    bench_e2e.compress_traces(tmp_path / "chunk-000")
    assert not (arm / "trace.jsonl").exists() and (arm / "trace.jsonl.gz").is_file()
    assert bench_e2e._trace_lines(arm) == plain == lines


def test_a_routers_bindings_are_judged_as_the_tool_boundary_binds_them():
    """A value the boundary's default corrections fix (the string "10" for an integer) is not
    the Router's mistake; a wrong value is."""
    from heart.environments import load_environment
    from heart.environments.base import ToolCall

    environment = load_environment("bfcl", "simple")
    (gold,) = environment.load_task("simple_python_27").gold[0]
    as_text = ToolCall(gold.name, {**gold.arguments, "initial_velocity": "10"})
    assert not environment.check("simple_python_27", [as_text])["valid"]
    assert bench_e2e.bindings_accepted(environment, "simple_python_27", [as_text])
    assert not bench_e2e.bindings_accepted(environment, "simple_python_27",
                                           [ToolCall(gold.name, {**gold.arguments, "initial_velocity": 2})])
