"""The Planner's sub-goals form: the request's sub-goals first, then one plan step per sub-goal.

The input says which form it asks for (``plan_form: subgoals``, from
``LoopConfig.planner_form``); its prompt, serving schema and parser follow from the input, and
the gold teacher writes one grounded sub-goal per gold call. The plain form is unchanged.
"""

from __future__ import annotations

import ast
import json

import jsonschema
import pytest

from heart.environments import load_environment
from heart.grounding import grounded
from heart.episode import run_episode
from heart.loop import LoopConfig
from heart.roles import planner
from heart.roles.common import role_input
from heart.roles.registry import PLANNER
from heart_distill.data.gold_teacher import GoldTeacher
from heart.traces import TraceWriter, read_trace

TOOLS = [{"name": "get_weather", "description": "Get the weather of a city", "category": "weather"},
         {"name": "get_time", "description": "Get the local time of a city", "category": "time"}]


def answer(subgoals, tools):
    plan = [{"step": i, "tool_category": "weather", "tool_hint": t, "objective": "", "dependencies": []}
            for i, t in enumerate(tools, 1)]
    out = {"status": "SUFFICIENT", "intent": {"task": "", "objective": "", "tool_categories": [], "constraints": []}}
    if subgoals is not None:
        out["subgoals"] = subgoals
    return {**out, "plan": plan, "replanned": False}


def test_the_input_chooses_the_form_its_prompt_and_its_schema():
    plain = planner.build_payload("Weather in Paris and Rome?", TOOLS)
    asked = planner.build_payload("Weather in Paris and Rome?", TOOLS, form="subgoals")
    assert "plan_form" not in plain and asked["plan_form"] == "subgoals"
    assert PLANNER.mode_for(plain).name == "plan" and PLANNER.mode_for(asked).name == "subgoals"
    assert '"subgoals"' in PLANNER.system_prompt(asked) and '"subgoals"' not in PLANNER.system_prompt(plain)
    schema = planner.schema_for_input(asked)
    jsonschema.validate(answer(["Paris weather", "Rome weather"], ["get_weather", "get_weather"]), schema)
    with pytest.raises(jsonschema.ValidationError):  # one step per sub-goal, held by the grammar itself
        jsonschema.validate(answer(["Paris weather", "Rome weather"], ["get_weather"]), schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(answer(None, ["get_weather"]), schema)
    jsonschema.validate(answer(None, ["get_weather"]), planner.schema_for_input(plain))


def test_the_parser_holds_the_form_the_input_asked_for():
    asked = planner.build_payload("Weather in Paris and Rome?", TOOLS, form="subgoals")
    plain = planner.build_payload("Weather in Paris and Rome?", TOOLS)
    two = json.dumps(answer(["Paris weather", "Rome weather"], ["get_weather", "get_weather"]))
    assert planner.parse_for_input(two, asked).ok
    assert "sub-goals were not asked for" in planner.parse_for_input(two, plain).error
    missing = planner.parse_for_input(json.dumps(answer(None, ["get_weather"])), asked)
    assert "asks for sub-goals" in missing.error
    uneven = planner.parse_for_input(json.dumps(answer(["Paris weather", "Rome weather"], ["get_weather"])), asked)
    assert "one step per sub-goal" in uneven.error


@pytest.mark.parametrize("form", ["plan", "subgoals"])
def test_the_gold_teacher_writes_one_grounded_subgoal_per_step(form, tmp_path):
    environment = load_environment("bfcl", "parallel")
    config = LoopConfig(planner_form=form)
    with TraceWriter(tmp_path / "t.jsonl", fsync=False) as trace:
        for task_id in environment.task_ids("train")[:4]:
            task = environment.load_task(task_id)
            result = run_episode(environment, task, GoldTeacher(task, environment.catalog()), trace=trace,
                                 config=config)
            assert result.record.score == 1.0, task_id  # the form changes no call: still valid
    plans = [row for row in read_trace(tmp_path / "t.jsonl") if row["kind"] == "event" and row["role"] == "planner"]
    assert plans
    for row in plans:
        payload, target = role_input(row["messages"]), json.loads(row["raw_output"])
        assert planner.parse_for_input(row["raw_output"], payload).ok
        if form == "plan":
            assert "subgoals" not in target and "plan_form" not in payload
            continue
        assert list(target) == ["status", "intent", "subgoals", "plan", "replanned"]  # sub-goals before the plan
        assert len(target["subgoals"]) == len(target["plan"]) >= 2  # BFCL parallel: several calls
        assert len(set(target["subgoals"])) == len(target["subgoals"])  # each names what tells it apart
        query = " ".join(payload["user_query"].split())
        for subgoal in target["subgoals"]:
            values = [ast.literal_eval(part.split("=", 1)[1]) for part in subgoal.split(": ", 1)[-1].split(", ")
                      if "=" in part]
            assert values and all(grounded(value, query) for value in values), (subgoal, query)  # the request's
