"""heart optimize from a configurable seed harness, and the positive control.

The proposal rules are checked on failures a real tool boundary produces: BFCL's own tools
(``metropolitan_museum.get_top_artworks`` of BFCL multiple, GorillaFileSystem's ``rm`` of
multi_turn_base) called through :func:`heart.primitives.execute` — jsonschema's messages under
seed middleware ``none``, the coercion's own under ``default``, a tool's "No such file".

The search logic runs over a fake world (no model): a scripted Primitive writes scalars as
text on some tasks (``"5"`` for an integer, ``"POPULARITY"`` for ``popularity``) and the real
binding and middleware decide each episode. From the seed ``none`` the search must find the
known repair — the default middleware's coercion and casefold — and the scorecard must show it
recovering the reference arm's lift.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
import yaml

from heart.harness import Harness, load_harness
from heart.middleware import TurnCalls, load_middleware, parse_middleware
from heart.primitives import execute
from heart.runtime.base import Generation
from heart.toolface import Tool, ToolSpec
from heart_distill.eval.optimize.clusters import cluster
from heart_distill.eval.optimize.proposers import DeterministicProposer, schema_intercepts, with_edits
from heart_distill.eval.optimize.protocol import (ArgumentTypes, ProtocolConfig, load_recipe, retype,
                                                  scorecard_run, search_run)
from heart_distill.eval.optimize.report import recovery
from heart_distill.eval.optimize.rollouts import Episode, Evaluation, TaskRef


def episode_of(envelope, key: str = "t") -> Episode:
    """A failed episode whose one Primitive call got ``envelope``."""
    events = [{"role": "primitive", "extra": {"envelope": envelope.to_dict()}}]
    return Episode(TaskRef("bfcl:multiple", key), 0.0, False, True, 1, 1, {"checker": {}}, events)


def tool_clusters(envelope):
    return [c for c in cluster([episode_of(envelope)]) if c.kind == "tool_failure"]


def apply(rows, catalog):
    harness = with_edits(Harness("seed", middleware="none"), "c001", rows, catalog=catalog)
    return parse_middleware(yaml.safe_load(harness.middleware_text), "c001", catalog)


@pytest.fixture(scope="module")
def museum():
    """BFCL multiple's get_top_artworks (number: integer, sort_by: enum), bound to its session."""
    from heart_distill.eval.e2e import load_environment

    environment = load_environment("bfcl", "multiple")
    session = environment.start(environment.load_task("multiple_163"))
    session.start_turn(0)
    tool = next(t for t in session.tools if t.spec.name == "metropolitan_museum.get_top_artworks")
    return tool, environment.catalog()


def test_jsonschemas_own_messages_become_the_corrections_that_repair_them(museum):
    tool, catalog = museum
    call = {"number": "5", "sort_by": "POPULARITY"}
    first = execute(tool, call, middleware=load_middleware("none"))
    # jsonschema's own message (its best match of the two errors), not the coercion's
    assert first.details == "sort_by: 'POPULARITY' is not one of ['popularity', 'chronological', 'alphabetical']"
    [c] = tool_clusters(first)
    assert c.slot == "middleware" and c.parameter == "sort_by" and c.arguments == [call]
    rows = schema_intercepts(c, catalog)
    assert [(r["id"], r["guard"]) for r in rows] == [
        ("enum-casefold", {"tool": "*", "parameter": "*", "when": "not_in_enum"})]
    second = execute(tool, call, middleware=apply(rows, catalog))
    assert second.details == "number: '5' is not of type 'integer'"
    [c] = tool_clusters(second)
    more = schema_intercepts(c, catalog, rows)
    assert [(r["id"], r["guard"]["when"]) for r in more] == [("coerce-to-schema-type", "type_mismatch")]
    assert schema_intercepts(tool_clusters(first)[0], catalog, rows) == []  # the parent has it already
    fixed = execute(tool, call, middleware=apply(rows + more, catalog))
    assert fixed.ok, fixed.details
    assert fixed.bound_arguments == {"number": 5, "sort_by": "popularity"}
    # the corrections follow the schema: another tool of the catalog with an integer is fixed too
    assert rows[0]["guard"]["tool"] == "*"


@pytest.mark.parametrize("call, middleware", [
    ({"number": "five"}, "none"),                 # jsonschema refuses it, and no coercion reads it
    ({"number": 5, "sort_by": "newest"}, "none"),  # not an option in any case
    ({"number": "five"}, "default"),              # the shipped coercion tried: "cannot read"
])
def test_a_failure_no_correction_repairs_gets_no_correction(museum, call, middleware):
    tool, catalog = museum
    envelope = execute(tool, call, middleware=load_middleware(middleware))
    assert not envelope.ok
    assert all(schema_intercepts(c, catalog) == [] for c in tool_clusters(envelope))


def test_a_missing_prerequisite_at_a_bfcl_tool_becomes_a_prerequisite_block():
    from heart.environments import load_environment

    environment = load_environment("bfcl", category="multi_turn_base")
    session = environment.start(environment.load_task("multi_turn_base_0"))
    session.start_turn(0)
    tools = {t.spec.name: t for t in session.tools}
    failed = execute(tools["rm"], {"file_name": "nope.txt"}, middleware=load_middleware("none"))
    assert failed.failure_type == "RUNTIME_ERROR" and "No such file or directory" in failed.details
    [c] = tool_clusters(failed)
    assert c.slot == "middleware"
    [row] = schema_intercepts(c, environment.catalog())
    assert row["pattern"] == "prerequisite_blocking"
    assert row["guard"] == {"tool": "rm", "parameter": "file_name",
                            "when": "present and not prior_call(tool=find|ls)"}
    guards = apply([row], environment.catalog())
    calls = TurnCalls()
    blocked = execute(tools["rm"], {"file_name": "nope.txt"}, middleware=guards, calls=calls)
    assert blocked.failure_type == "CONSTRAINT_VIOLATION" and "call find or ls first" in blocked.details
    assert execute(tools["ls"], {}, middleware=guards, calls=calls).ok
    after = execute(tools["rm"], {"file_name": "nope.txt"}, middleware=guards, calls=calls)
    assert after.failure_type == "RUNTIME_ERROR"  # no longer blocked: the tool ran and said so itself


def test_the_planted_defect_types_scalars_as_text_in_the_primitives_answer_schema():
    from heart.roles import primitive

    schema = json.loads(ArgumentTypes.retyped(json.dumps(primitive.output_schema("t", {
        "type": "object", "properties": {"n": {"type": "integer"}, "x": {"type": "number"},
                                         "ok": {"type": "boolean"}, "unit": {"type": "string", "enum": ["cm", "m"]},
                                         "ids": {"type": "array", "items": {"type": "integer"}}},
        "required": ["n"]})), "string"))
    arguments = schema["anyOf"][0]["properties"]["arguments"]
    import jsonschema

    jsonschema.validate({"n": "5", "x": "2.5", "ok": "true", "unit": "CM", "ids": ["1"]}, arguments)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"n": 5}, arguments)
    assert arguments["required"] == ["n"] and arguments["additionalProperties"] is False
    assert retype({"type": "integer"}, "free") == {"anyOf": [{"type": "string", "maxLength": 64}, {"type": "integer"}]}


# -- the search from seed none: a fake world over the real tool boundary -------------------

SPEC = ToolSpec("top_artworks", "Top artworks.", {
    "type": "object", "properties": {"number": {"type": "integer"},
                                     "sort_by": {"type": "string", "enum": ["popularity", "chronological"]}},
    "required": ["number"]})
TOOL = Tool(SPEC, lambda number, sort_by="popularity": list(range(number)))


class TextScalars:
    """A Primitive that writes the integer as text on tasks whose number is divisible by 2 and
    the enum in capitals on those divisible by 3 (a fresh call costs one model call)."""

    name = "text-scalars"

    def __init__(self):
        self.calls = 0

    def generate(self, role, messages, sampling=None):
        self.calls += 1
        n = int(re.match(r"[^|]*\|[a-z]+_(\d+)", messages[-1]["content"]).group(1))
        if role == "primitive":
            call = {"number": str(n + 1) if n % 2 == 0 else n + 1, "sort_by": "POPULARITY" if n % 3 == 0 else "popularity"}
            return Generation(text=json.dumps(call), backend=self.name, prompt_tokens=10, completion_tokens=5)
        return Generation(text="PASS", backend=self.name, prompt_tokens=10, completion_tokens=1)


class World:
    def __init__(self):
        self.model = TextScalars()
        self.harnesses: list[str] = []

    def task_ids(self, condition, split):
        return [f"{split}_{i}" for i in range(12)]

    def catalogs(self):
        return {"bfcl:multiple": [SPEC]}

    def backend(self, arm):
        return self.model

    def run_episode(self, arm):
        def one(task: TaskRef, harness_dir, backend):
            harness = load_harness(harness_dir)
            self.harnesses.append(harness.middleware)
            g = backend.generate("primitive", [{"role": "user", "content": task.key}])
            envelope = execute(TOOL, json.loads(g.text), middleware=load_middleware(harness.middleware))
            v = backend.generate("verifier", [{"role": "user", "content": task.key + json.dumps(envelope.to_dict())}])
            events = [{"role": "primitive", "extra": {**g.meta, "envelope": envelope.to_dict()},
                       "prompt_tokens": 10, "completion_tokens": 5},
                      {"role": "verifier", "extra": dict(v.meta), "prompt_tokens": 1, "completion_tokens": 1,
                       "parsed": {"status": "PASS"}}]
            return {"score": 1.0 if envelope.ok else 0.0, "errored": False, "checker": {}}, events

        return one


def control(tmp_path: Path, **extra) -> ProtocolConfig:
    fields = dict(out=str(tmp_path / "out"), conditions=["bfcl:multiple"], arms={"base": "base"}, optimize=["base"],
                  pools={"repair": 12, "gate": 12, "scorecard": 12}, sizes={"repair": 6, "gate": 6, "scorecard": 6},
                  split_seeds=[0, 1], repeats=1, seed_middleware="none", slots=["middleware"],
                  search={"generations": 3, "mutations": 1, "population": 5, "budget": 48}, concurrency=1)
    return ProtocolConfig(**{**fields, **extra})


def test_from_seed_none_the_search_finds_the_known_repair_and_recovers_its_lift(tmp_path):
    config = control(tmp_path)
    world = World()
    for rid in config.run_ids():
        log = search_run(config, "base", rid, world, DeterministicProposer(), log=lambda m: None)
        assert log["seed"]["describe"] == "middleware:none"
        selected = next(c for c in log["candidates"] if c["id"] == log["selected"])
        rows = yaml.safe_load((Path(selected["folder"]) / "middleware.yaml").read_text())["intercepts"]
        assert {r["id"] for r in rows} == {"coerce-to-schema-type", "enum-casefold"}
        scorecard_run(config, rid, world, log=lambda m: None)
    cards = [json.loads((tmp_path / "out" / "scorecard" / f"{r}.json").read_text()) for r in config.run_ids()]
    assert set(cards[0]["arms"]) == {"base", "base+default", "base+harness"}
    result = recovery(cards, "base")
    assert result["n"] == 2 and result["reached"] == 2 and result["no_reference_lift"] == 0
    assert all(r["reference_lift"] > 0 and r["optimizer_lift"] == r["reference_lift"] for r in result["runs"])
    # the reference arm is the default set; the plain arm and the search's seed the recipe's none
    assert {"default", "none"} <= set(world.harnesses)


def test_a_gate_that_cannot_tell_a_repair_from_the_seed_leaves_the_choice_to_the_repair(tmp_path):
    """Gate tasks the defect never touches tie every candidate with the seed: the repair gain
    that admitted the candidate decides, never the scorecard."""
    from heart_distill.eval.optimize.search import SearchConfig, search

    repair = [TaskRef("bfcl:multiple", f"train_{i}") for i in range(4)]
    gate = [TaskRef("bfcl:multiple", f"dev_{i}") for i in range(4)]

    def evaluate(tasks, folder):
        fixed = "middleware.yaml" in {p.name for p in Path(folder).iterdir()}
        def score(t):  # the seed fails even repair tasks; the gate passes under every harness
            return 1.0 if t.task_id.startswith("dev") or fixed or t.task_id.endswith(("_1", "_3")) else 0.0
        envelope = execute(TOOL, {"number": "3"}, middleware=load_middleware("none"))
        return Evaluation({t.key: Episode(t, score(t), False, True, 1, 1, {"checker": {}},
                                          [{"role": "primitive", "extra": {"envelope": envelope.to_dict()}}])
                           for t in tasks})

    result = search(Harness("seed", middleware="none"), repair, gate, evaluate, DeterministicProposer(),
                    {"bfcl:multiple": [SPEC]}, SearchConfig(generations=1, mutations=1, budget=16,
                                                            slots=("middleware",)), random.Random(0), tmp_path)
    assert result.selected.id == "c001" and result.gate_lift == 0.0
    assert "repair 100.0% vs seed 50.0%" in result.why


def test_the_same_intercepts_proposed_twice_are_one_candidate():
    rows = [{"id": "enum-casefold", "pattern": "silent_correction", "guard": {"tool": "*", "parameter": "*",
                                                                              "when": "not_in_enum"},
             "action": {"correct": "enum_casefold"}, "reason": "case"}]
    seed = Harness("seed", middleware="none")
    assert with_edits(seed, "c001", rows).fingerprint() == with_edits(seed, "c004", rows).fingerprint()


def test_the_seed_is_configured_checked_at_load_and_recorded(tmp_path):
    path = tmp_path / "r.yaml"
    base = ("out: x\nconditions: [bfcl:simple]\npools: {repair: 2, gate: 2, scorecard: 2}\n"
            "sizes: {repair: 2, gate: 2, scorecard: 2}\nsearch: {generations: 1, mutations: 1, population: 2, budget: 8}\n")
    path.write_text(base + "seed_middleware: absent.yaml\n")
    with pytest.raises(ValueError, match=r"seed: .*absent\.yaml.*no such middleware file"):
        load_recipe(path)
    path.write_text(base + "seed_prompts: {judge: {append: x}}\n")
    with pytest.raises(ValueError, match=r"seed: seed_prompts: prompts\.judge: unknown role"):
        load_recipe(path)
    path.write_text(base + "loop: {argument_types: {primitive: text}}\n")
    with pytest.raises(ValueError, match="loop.argument_types"):
        load_recipe(path)
    path.write_text(base)
    assert load_recipe(path).reference_harness() is None  # the default seed has no reference arm
    config = load_recipe(path, {"seed_middleware": "none",
                                "seed_prompts": {"primitive": {"append": "Quote every value."}}})
    assert config.seed_harness().describe() == "primitive:append, middleware:none"
    assert config.reference_harness().describe() == "primitive:append, middleware:default"


def test_the_cli_takes_the_seed_middleware(tmp_path, capsys):
    import argparse

    from heart_distill.eval.optimize.cli import add_arguments, main

    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"out: {tmp_path / 'out'}\nconditions: [bfcl:simple]\npools: {{repair: 2, gate: 2, scorecard: 2}}\n"
                      "sizes: {repair: 2, gate: 2, scorecard: 2}\n"
                      "search: {generations: 1, mutations: 1, population: 2, budget: 8}\n")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--recipe", str(recipe), "--stage", "report", "--seed-middleware", "absent.yaml"])
    assert main(args) == 2 and "absent.yaml" in capsys.readouterr().err
    args = parser.parse_args(["--recipe", str(recipe), "--stage", "report", "--seed-middleware", "none"])
    assert main(args) == 0
    assert json.loads((tmp_path / "out" / "optimize.json").read_text())["seed"] == "middleware:none"


def test_a_finished_search_from_another_seed_is_not_reused(tmp_path):
    world = World()
    search_run(control(tmp_path), "base", "s0r0", world, DeterministicProposer(), log=lambda m: None)
    with pytest.raises(ValueError, match="made from another seed harness"):
        search_run(control(tmp_path, seed_middleware="default"), "base", "s0r0", world, DeterministicProposer(),
                   log=lambda m: None)


def test_optimize_episodes_get_their_harness_middleware_as_eval_and_run_do(monkeypatch, tmp_path):
    """heart optimize's episodes are heart eval e2e's (run_one), whose LoopConfig takes the
    harness's middleware, as heart run's --harness and --middleware do."""
    import heart.episode
    from heart.harness import save_harness
    from heart_distill.eval.optimize.protocol import World as ProtocolWorld

    seen = []

    def capture(environment, task, backend, config, **kwargs):
        seen.append(config.middleware)
        raise RuntimeError("captured")

    monkeypatch.setattr(heart.episode, "run_episode", capture)
    config = control(tmp_path, conditions=["bfcl:simple"])
    world = ProtocolWorld(config)
    world._models["base"] = type("M", (), {"short_prompts": (), "adapters": {}})()
    task = TaskRef("bfcl:simple", world.task_ids("bfcl:simple", "train")[0])
    for middleware in ("none", "default"):
        folder = save_harness(Harness("h", middleware=middleware), tmp_path / middleware)
        row, _ = world.run_episode("base")(task, str(folder), backend=None)
        assert row["errored"] and "captured" in row["error"]
    assert seen == ["none", "default"]
