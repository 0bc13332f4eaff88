"""heart optimize: the harness format, exact replay, the search, the protocol's discipline.

A fake world stands in for models and benchmarks (logic only): a "weather" tool whose
real binding and middleware (heart.primitives.execute) decide each episode, and a scripted
model that calls it with ``loc`` instead of ``location`` on some tasks — the schema failure
a deterministic rename repairs. The OpenAI-compatible proposer is tested against a real
local HTTP server.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
import yaml

from heart.harness import Harness, HarnessError, load_harness, save_harness
from heart.loop import HeartLoop, LoopConfig
from heart.middleware import load_middleware
from heart.primitives import execute
from heart.roles import router
from heart.runtime.base import Generation
from heart.toolface import Tool, ToolSpec
from heart_distill.eval.optimize.proposers import DeterministicProposer, OpenAIProposer
from heart_distill.eval.optimize.protocol import ProtocolConfig, load_recipe, scorecard_run, search_run
from heart_distill.eval.optimize.rollouts import AnswerRecord, ReplayBackend, TaskRef, evaluate

SPEC = ToolSpec("get_weather", "Weather of a city.", {
    "type": "object", "properties": {"location": {"type": "string"}, "unit": {"type": "string"}},
    "required": ["location"]})
TOOL = Tool(SPEC, lambda location, unit="c": {"city": location, "temp": 20})


class FakeModel:
    """Calls the tool with ``loc`` on tasks whose number is even; its Verifier says PASS."""

    name = "fake"

    def __init__(self):
        self.calls = 0

    def generate(self, role, messages, sampling=None):
        self.calls += 1
        task = messages[-1]["content"]
        if role == "primitive":
            n = int(task.rsplit("_", 1)[1])
            key = "loc" if n % 2 == 0 else "location"
            return Generation(text=json.dumps({key: "Paris"}), backend=self.name, prompt_tokens=10, completion_tokens=5)
        return Generation(text="PASS", backend=self.name, prompt_tokens=10, completion_tokens=1)


class FakeWorld:
    """The protocol's World, faked: conditions' tasks, catalogs, a model, one episode."""

    def __init__(self, poison_scorecard: str | None = None):
        self.model = FakeModel()
        self.poison = poison_scorecard
        self.scorecard_episodes = 0

    def task_ids(self, condition, split):
        return [f"{split}_{i}" for i in range(6)]

    def catalogs(self):
        return {"bfcl:simple": [SPEC], "bfcl:multiple": [SPEC]}

    def backend(self, arm):
        return self.model

    def run_episode(self, arm):
        def one(task: TaskRef, harness_dir, backend):
            harness = load_harness(harness_dir) if harness_dir else Harness()
            system = "SYS " + " ".join(t for _, _, t in harness.prompts)
            events = []
            g = backend.generate("primitive", [{"role": "system", "content": system},
                                               {"role": "user", "content": task.key}])
            envelope = execute(TOOL, json.loads(g.text), middleware=load_middleware(harness.middleware))
            events.append({"role": "primitive", "extra": {**g.meta, "envelope": envelope.to_dict()},
                           "prompt_tokens": g.prompt_tokens, "completion_tokens": g.completion_tokens})
            v = backend.generate("verifier", [{"role": "system", "content": "V"},
                                              {"role": "user", "content": task.key + json.dumps(envelope.to_dict())}])
            events.append({"role": "verifier", "extra": dict(v.meta), "prompt_tokens": 1, "completion_tokens": 1,
                           "parsed": {"status": "PASS"}})
            score = 1.0 if envelope.ok else 0.0
            if task.task_id.startswith("test_"):
                self.scorecard_episodes += 1
                if self.poison == "raise":
                    raise RuntimeError("poisoned scorecard checker")
                if self.poison == "invert":
                    score = 1.0 - score
            return {"score": score, "errored": False, "checker": {}}, events

        return one


def recipe(tmp_path: Path, **extra) -> ProtocolConfig:
    fields = dict(out=str(tmp_path / "out"), conditions=["bfcl:simple", "bfcl:multiple"],
                  arms={"base": "base"}, optimize=["base"],
                  pools={"repair": 4, "gate": 4, "scorecard": 4}, sizes={"repair": 3, "gate": 3, "scorecard": 3},
                  split_seeds=[0, 1], repeats=1,
                  search={"generations": 2, "mutations": 3, "population": 5, "budget": 40}, concurrency=1)
    fields.update(extra)
    return ProtocolConfig(**fields)


def _search_view(log: dict) -> dict:
    return {k: log[k] for k in ("selected", "why", "gate_lift", "frontier", "spent", "candidates", "events")}


def test_the_deterministic_rename_is_found_gated_and_selected(tmp_path):
    config = recipe(tmp_path)
    log = search_run(config, "base", "s0r0", FakeWorld(), DeterministicProposer(), log=lambda m: None)
    selected = next(c for c in log["candidates"] if c["id"] == log["selected"])
    assert "rename-get_weather-loc-location" in (Path(selected["folder"]) / "middleware.yaml").read_text()
    assert selected["gate_pass"] == 1.0 and log["seed_gate_pass"] < 1.0 and log["gate_lift"] > 0
    assert log["spent"]["rollouts"] <= config.search["budget"]
    # the log counts what the run proposed and gated, and why the rest was not gated
    tally = log["proposals"]
    assert tally["gated"] >= 1 and tally["outcome"][log["selected"]] == "gated"
    assert tally["planned"] == tally["gated"] + sum(tally["not_gated"].values()) + sum(tally["unfilled"].values())
    # the harness the run selected loads as heart run / heart eval e2e load it
    assert load_harness(selected["folder"]).middleware.endswith("middleware.yaml")


def test_the_selection_never_reads_the_scorecard(tmp_path):
    """A scorecard whose checker raises, or scores inverted, leaves every search decision as it was."""
    clean = search_run(recipe(tmp_path / "a"), "base", "s0r0", FakeWorld(), DeterministicProposer(), log=lambda m: None)
    for poison in ("raise", "invert"):
        world = FakeWorld(poison)
        config = recipe(tmp_path / poison)
        poisoned = search_run(config, "base", "s0r0", world, DeterministicProposer(), log=lambda m: None)
        assert world.scorecard_episodes == 0
        strip = lambda log: json.loads(json.dumps(_search_view(log)).replace(str(tmp_path / poison), "")
                                       .replace(str(tmp_path / "a"), ""))
        assert strip(poisoned) == strip(clean)
        if poison == "invert":  # the poison is live: the scorecard, run after selection, reads it
            card = scorecard_run(config, "s0r0", world, log=lambda m: None)
            assert world.scorecard_episodes > 0 and card["arms"]["base+harness"]["harness"] == clean["selected"]


def test_the_scorecard_waits_for_selection(tmp_path):
    with pytest.raises(ValueError, match="scorecard waits for selection"):
        scorecard_run(recipe(tmp_path), "s0r0", FakeWorld(), log=lambda m: None)


def test_a_run_is_reproducible_from_its_seed(tmp_path):
    a = search_run(recipe(tmp_path / "a"), "base", "s1r0", FakeWorld(), DeterministicProposer(), log=lambda m: None)
    b = search_run(recipe(tmp_path / "b"), "base", "s1r0", FakeWorld(), DeterministicProposer(), log=lambda m: None)
    strip = lambda log, p: json.loads(json.dumps(_search_view(log)).replace(str(p), ""))
    assert strip(a, tmp_path / "a") == strip(b, tmp_path / "b")


def test_replay_is_exact_and_free_until_an_intercept_changes_what_a_role_sees(tmp_path):
    world = FakeWorld()
    tasks = [TaskRef("bfcl:simple", f"dev_{i}") for i in range(4)]
    shipped = str(save_harness(Harness("shipped"), tmp_path / "shipped"))
    backend = ReplayBackend(world.model, "fake", AnswerRecord(tmp_path / "answers.jsonl"))
    first = evaluate(tasks, shipped, backend, world.run_episode("base"))
    again = evaluate(tasks, shipped, backend, world.run_episode("base"))
    assert first.rollouts == 4 and again.rollouts == 0 and again.scores() == first.scores()
    rename = yaml.safe_dump({"format": "heart-middleware/1", "name": "r", "version": 1, "intercepts": [
        {"id": "loc", "pattern": "silent_correction", "guard": {"tool": "get_weather", "parameter": "location",
                                                                "when": "missing"},
         "action": {"correct": "rename", "from": ["loc"]}, "reason": "loc means location"}]})
    (tmp_path / "fixed").mkdir()
    (tmp_path / "fixed" / "middleware.yaml").write_text(rename)
    (tmp_path / "fixed" / "harness.yaml").write_text("format: heart-harness/1\nmiddleware: middleware.yaml\n")
    fixed = evaluate(tasks, str(tmp_path / "fixed"), backend, world.run_episode("base"))
    # only the episodes where the rename fired (even tasks) diverge: their Verifier sees a new envelope
    assert fixed.rollouts == 2 and fixed.pass_rate == 1.0
    # a new process reads the shared record: nothing is decoded again, but its own budget counts
    calls = world.model.calls
    fresh = ReplayBackend(world.model, "fake", AnswerRecord(tmp_path / "answers.jsonl"))
    assert evaluate(tasks, shipped, fresh, world.run_episode("base")).rollouts == 4
    assert world.model.calls == calls


class _Proposer(BaseHTTPRequestHandler):
    answers: list[str] = []

    def do_POST(self):  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers["Content-Length"]))
        text = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        body = json.dumps({"id": "x", "object": "chat.completion", "model": "m", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def proposer_server():
    server = HTTPServer(("127.0.0.1", 0), _Proposer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


def test_a_garbage_proposal_is_logged_and_costs_its_rollout(tmp_path, proposer_server):
    _Proposer.answers = ["sure! here is a better harness: ~~~", '{"prompts": {"nobody": "x"}}',
                         '{"intercepts": [{"id": "x", "pattern": "rewrite_everything"}]}']
    config = recipe(tmp_path, search={"generations": 1, "mutations": 3, "population": 5, "budget": 40})
    log = search_run(config, "base", "s0r0", FakeWorld(), OpenAIProposer(proposer_server, "m"), log=lambda m: None)
    bad = [e for e in log["events"] if e["event"] == "bad_proposal"]
    assert len(bad) == 3 and log["spent"]["bad_proposals"] == 3
    assert "unknown role" in bad[1]["error"] and "rewrite_everything" in bad[2]["error"]
    seed_cost = 12  # 6 repair + 6 gate rollouts
    assert log["spent"]["rollouts"] == seed_cost + 3 and log["selected"] == "c000"


def test_an_openai_proposal_becomes_a_gated_candidate(tmp_path, proposer_server):
    rename = {"id": "loc", "pattern": "silent_correction",
              "guard": {"tool": "get_weather", "parameter": "location", "when": "missing"},
              "action": {"correct": "rename", "from": ["loc"]}, "reason": "loc means location"}
    _Proposer.answers = [json.dumps({"rationale": "rename", "intercepts": [rename], "prompts": {}})]
    config = recipe(tmp_path, search={"generations": 1, "mutations": 1, "population": 5, "budget": 40})
    log = search_run(config, "base", "s0r0", FakeWorld(), OpenAIProposer(proposer_server, "m"), log=lambda m: None)
    assert log["selected"] == "c001" and log["spent"]["proposer_tokens"] == 10


def test_harness_files_round_trip_and_bad_ones_are_refused_by_field(tmp_path):
    h = Harness("h", (("router", "append", "Bind each parameter once."),), "none")
    loaded = load_harness(save_harness(h, tmp_path / "h"))
    assert loaded.prompts == h.prompts and loaded.middleware == "none"
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "harness.yaml").write_text("format: heart-harness/1\nprompts: {judge: {append: x}}\n")
    with pytest.raises(HarnessError, match=r"prompts\.judge: unknown role"):
        load_harness(tmp_path / "bad")
    (tmp_path / "bad" / "harness.yaml").write_text("format: heart-harness/1\nmiddleware: absent.yaml\n")
    with pytest.raises(HarnessError, match="middleware: no such intercept file"):
        load_harness(tmp_path / "bad")


def test_the_loop_applies_prompt_edits_to_the_prompt_the_role_gets():
    loop = HeartLoop.__new__(HeartLoop)
    loop.config = LoopConfig(prompt_edits=(("router", "append", "Bind once."),), short_prompts=("router",))
    assert loop._system(router) == router.SHORT_SYSTEM_PROMPT + "\nBind once."
    loop.config = LoopConfig(prompt_edits=(("router", "replace", "Route."),))
    assert loop._system(router) == "Route."


def test_a_bad_recipe_is_refused_by_name(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("out: x\nconditions: [bfcl:simple]\nsearch_budget: 3\n")
    with pytest.raises(ValueError, match="search_budget"):
        load_recipe(path)
    path.write_text("out: x\nconditions: [tau:retail]\n")
    with pytest.raises(ValueError, match="tau:retail"):
        load_recipe(path)


@pytest.mark.parametrize("name", ["smollm2-135m", "qwen3-8b"])
def test_shipped_optimize_recipes_load(name):
    path = Path(__file__).resolve().parents[2] / "recipes" / name / "optimize.yaml"
    assert path.read_text().splitlines()[0] == f"# heart optimize --recipe recipes/{name}/optimize.yaml"
    config = load_recipe(path)
    assert len(config.run_ids()) >= 8 and set(config.optimize) == {"base", "distilled"}


@pytest.mark.parametrize("detail, pattern, action", [
    ("unknown parameter(s) 'loc'; the tool takes ['location', 'unit']", "silent_correction", {"correct": "rename", "from": ["loc"]}),
    ("unknown parameter(s) 'Unit'; the tool takes ['location', 'unit']", "silent_correction", {"correct": "rename", "from": ["Unit"]}),
    ("unit: 1 is not of type 'string'", "silent_correction", {"correct": "coerce_type"}),
    ("TypeError: get_weather() missing 1 required positional argument: 'unit'", "error_blocking", None),
])
def test_the_deterministic_rules_turn_schema_failures_into_intercepts(detail, pattern, action):
    from heart_distill.eval.optimize.clusters import Cluster
    from heart_distill.eval.optimize.proposers import schema_intercepts

    failure = ("RUNTIME_ERROR" if "TypeError" in detail else "CONSTRAINT_VIOLATION" if "is not of type" in detail
               else "SCHEMA_RESOLUTION")
    parameter = "unit" if detail.startswith("unit") else ""
    rows = schema_intercepts(Cluster("tool_failure", "get_weather", failure, parameter, ["t"], [detail], [[]]), [SPEC])
    assert [r["pattern"] for r in rows] == [pattern]
    if action is not None:
        assert rows[0]["action"] == action
    else:
        assert rows[0]["guard"] == {"tool": "get_weather", "parameter": "unit", "when": "missing"}
        assert "{parameter}" in rows[0]["action"]["message"]  # filled in when it blocks


def test_a_value_the_shipped_coercion_could_not_read_gets_no_coercion():
    """'cannot read' is the default set's own message: its coercion ran and failed."""
    from heart_distill.eval.optimize.clusters import Cluster
    from heart_distill.eval.optimize.proposers import schema_intercepts

    cluster = Cluster("tool_failure", "get_weather", "SCHEMA_RESOLUTION", "unit", ["t"],
                      ["unit: cannot read [1] as string"], [[]])
    assert schema_intercepts(cluster, [SPEC]) == []


def test_a_middleware_only_search_proposes_middleware_only(tmp_path):
    log = search_run(recipe(tmp_path, slots=["middleware"]), "base", "s0r0", FakeWorld(), DeterministicProposer(),
                     log=lambda m: None)
    proposed = [c for c in log["candidates"] if c["slot"] is not None]
    assert proposed and all(c["slot"] == "middleware" and "middleware:" in c["describe"] for c in proposed)
    assert log["gate_lift"] > 0
