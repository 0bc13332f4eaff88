"""The library: composite primitives (checked, run as tools, used by the gold teacher),
mining from traces, the admission rule, atomic admission under SIGKILL, and role adapters
(another base refused, a worse retrained adapter not served)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from heart.environments.base import CatalogEnvironment, ToolCall
from heart.environments.splits import split_of
from heart.library import (Composite, LibraryError, LibraryEnvironment, compose_calls, composite_tool,
                           load_library, parse_composite, updating)
from heart.primitives import execute
from heart.toolface import Tool, ToolSpec
from heart.traces import TraceWriter
from heart_distill.eval import library as admission

LOOKUP = ToolSpec("get_zip", "Get the zip code of a city.", {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}, category="geo")
ACT = ToolSpec("send_parcel", "Send a parcel to a zip code.", {
    "type": "object", "properties": {"zip": {"type": "string"}, "note": {"type": "string"}},
    "required": ["zip", "note"]}, category="geo")
CATALOG = {LOOKUP.name: LOOKUP, ACT.name: ACT}


def entry(**changes):
    base = {"name": "chain_get_zip_send_parcel", "description": "Get a city's zip, then send a parcel there.",
            "interface": {"type": "object", "properties": {"city": {"type": "string"}, "note": {"type": "string"}},
                          "required": ["city", "note"]},
            "chain": [{"tool": "get_zip", "arguments": {"city": "$step_0.city"}},
                      {"tool": "send_parcel", "arguments": {"zip": "$step_1.result.zip", "note": "$step_0.note"}}],
            "env": "geo", "category": "geo"}
    return {**base, **changes}


def session_tools(sent: list):
    def get_zip(city):
        if city == "Atlantis":
            raise ValueError("no such city")
        return {"zip": {"Paris": "75001"}.get(city, "00000")}

    def send_parcel(zip, note):
        sent.append((zip, note))
        return {"sent_to": zip}

    return [Tool(LOOKUP, get_zip), Tool(ACT, send_parcel)]


@pytest.mark.parametrize("change, message", [
    ({"name": "zip_then_send"}, "start with 'chain_'"),
    ({"description": " "}, "'description' must be a non-empty string"),
    ({"interface": {"type": "object", "properties": {"city": {"type": 7}}}}, "not a valid JSON schema"),
    ({"interface": {"type": "object", "properties": {"city": {}}, "required": ["town"]}}, "requires ['town']"),
    ({"chain": [{"tool": "get_zip", "arguments": {"city": "$step_0.city"}}]}, "at least 2 tool calls"),
    ({"chain": [{"tool": "get_zip", "arguments": {"city": "$step_2.result"}},
                {"tool": "send_parcel", "arguments": {"zip": "1", "note": "$step_0.note"}}]}, "not an earlier call"),
    ({"chain": [{"tool": "get_zip", "arguments": {"city": "$step_0.town"}},
                {"tool": "send_parcel", "arguments": {"zip": "1", "note": "$step_0.note"}}]}, "input 'town'"),
    ({"chain": [{"tool": "get_zip", "arguments": {"city": "$step_0.city"}},
                {"tool": "fly", "arguments": {"note": "$step_0.note"}}]}, "names tool 'fly'"),
    ({"chain": [{"tool": "get_zip", "arguments": {"city": "$step_0.city"}},
                {"tool": "send_parcel", "arguments": {"note": "$step_0.note"}}]}, "required parameter(s) ['zip']"),
])
def test_a_candidate_whose_interface_does_not_validate_is_a_clear_error(change, message):
    with pytest.raises(LibraryError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        parse_composite(entry(**change), CATALOG)


def test_a_composite_runs_its_chain_as_one_tool_and_a_failed_call_is_a_runtime_error():
    sent = []
    composite = parse_composite(entry(), CATALOG)
    tool = composite_tool(composite, session_tools(sent))
    envelope = execute(tool, {"city": "Paris", "note": "fragile"})
    assert envelope.ok and envelope.result["result"] == {"sent_to": "75001"}
    assert sent == [("75001", "fragile")]  # the zip came from the lookup's result ($step_1.result.zip)
    broken = execute(tool, {"city": "Atlantis", "note": "x"})
    assert broken.failure_type == "RUNTIME_ERROR" and "chain call 1 (get_zip)" in broken.details
    assert sent == [("75001", "fragile")]  # the chain stopped at the failed call
    unbound = execute(tool, {"city": "Paris"})  # the interface is the schema the Primitive binds against
    assert unbound.failure_type == "SCHEMA_RESOLUTION"


def test_compose_calls_replaces_the_chain_it_makes_and_leaves_the_rest():
    composite = parse_composite(entry(), CATALOG)
    calls = [ToolCall("get_zip", {"city": "Paris"}), ToolCall("send_parcel", {"zip": "75001", "note": "hi"}),
             ToolCall("get_zip", {"city": "Rome"})]
    assert compose_calls(calls, [composite]) == [ToolCall(composite.name, {"city": "Paris", "note": "hi"}),
                                                 ToolCall("get_zip", {"city": "Rome"})]


class _Session:
    def __init__(self, task, sent):
        self.task, self.tools = task, session_tools(sent)


class _Env(CatalogEnvironment):
    name = "geo"

    def catalog(self):
        return [LOOKUP, ACT]

    def start(self, task):
        return _Session(task, [])


def test_library_environment_adds_composites_to_catalog_and_sessions_and_refuses_clashes():
    composite = parse_composite(entry(), CATALOG)
    env = LibraryEnvironment(_Env(), [composite])
    assert [s.name for s in env.catalog()][-1] == composite.name
    assert [t.name for t in env.start(None).tools] == ["get_zip", "send_parcel", composite.name]
    clash = Composite("chain_x", "x", {"type": "object", "properties": {}}, (), "geo")
    object.__setattr__(clash, "name", "get_zip")
    with pytest.raises(LibraryError, match="clash"):
        LibraryEnvironment(_Env(), [clash])


def _train_task_ids(env: str, n: int) -> list[str]:
    return [t for t in (f"task_{i}" for i in range(200)) if split_of(env, t) == "train"][:n]


def _episode(writer, env, task_id, success=True):
    episode = f"ep-{task_id}"
    common = {"episode_id": episode, "task_id": task_id, "env": env, "turn": 0, "attempt": 0, "backend": "gold",
              "adapter": None, "messages": [], "raw_output": "", "parse_error": None, "latency_s": 0.0,
              "prompt_tokens": 1, "completion_tokens": 1, "kind": "event", "version": 1, "errored": False}
    city = task_id.replace("_", "")
    calls = [("get_zip", {"city": city}, {"zip": f"z{city}"}), ("send_parcel", {"zip": f"z{city}", "note": "n"},
                                                                  {"sent_to": f"z{city}"})]
    for step, (tool, args, result) in enumerate(calls, 1):
        writer.write({**common, "step": step, "role": "primitive", "parsed": {},
                      "extra": {"envelope": {"status": "SUCCESS", "tool": tool, "bound_arguments": args,
                                             "result": result, "meta": {}}}})
        writer.write({**common, "step": step, "role": "verifier", "parsed": {"status": "PASS", "step": step}})
    writer.write({"episode_id": episode, "task_id": task_id, "env": env, "score": float(success), "success": success,
                  "verdicts": ["PASS"], "replans_used": [0], "kind": "episode", "version": 1})


def test_propose_mines_recurring_chains_with_their_bindings_from_verified_traces(tmp_path):
    tasks = _train_task_ids("geo", 3)
    with TraceWriter(tmp_path / "traces" / "shard.jsonl") as writer:
        for task in tasks:
            _episode(writer, "geo", task, success=task != tasks[2])  # a failed episode teaches nothing
    calls = admission.verified_calls(admission.trace_files([tmp_path]))
    assert sorted(t for _, t in calls) == sorted(tasks[:2])
    [candidate] = admission.mine(calls, {"geo": CATALOG}, min_support=2)
    assert candidate["chain"][1]["arguments"] == {"zip": "$step_1.result.zip", "note": "$step_0.note"}
    assert candidate["interface"]["required"] == ["city", "note"] and candidate["support"]["tasks"] == 2
    parse_composite(candidate, CATALOG)
    assert admission.mine(calls, {"geo": CATALOG}, min_support=3) == []


def test_useless_candidates_for_the_false_admission_check_are_valid_composites():
    import random

    for seed in range(5):
        parse_composite(admission.random_chain("geo", CATALOG, random.Random(seed), seed), CATALOG)
    bad = admission.miswired({**entry(), "chain": [{"tool": "get_zip", "arguments": {"city": "$step_0.city"}},
                                                   {"tool": "send_parcel", "arguments": {
                                                       "zip": "$step_0.zip", "note": "$step_0.note"}}]}, CATALOG, 0)
    composite = parse_composite(bad, CATALOG)
    assert composite.chain[1].arguments["zip"] == "$step_1.result" and "zip" not in composite.interface["properties"]


def evidence(low, conditions, signal="role_calls_saved"):
    return {"signal": signal, "lift": {"value": max(low, 0) + 1, "low": low, "high": low + 2, "n": 10},
            "conditions": conditions}


def test_the_admission_rule_needs_a_positive_lower_bound_and_a_tolerable_worst_condition():
    assert admission.decide(evidence(0.5, {"seed 0": 0.0, "seed 1": 0.0}), 0.0)[0] == "admitted"
    assert admission.decide(evidence(0.0, {"seed 0": 0.0}), 0.0)[0] == "rejected"  # no evidence of benefit
    decision, reason = admission.decide(evidence(2.0, {"seed 0": 10.0, "seed 1": -5.0}, "success"), 2.0)
    assert decision == "rejected" and "seed 1" in reason
    assert admission.decide(evidence(2.0, {"seed 0": 10.0, "seed 1": -1.0}, "success"), 2.0)[0] == "admitted"


def _library_with(tmp_path, ev):
    lib = tmp_path / "library"
    admission.add_candidates(lib, [entry()])
    with updating(lib) as stage:
        path = stage / "candidates" / "chain_get_zip_send_parcel.json"
        data = json.loads(path.read_text())
        if ev is not None:
            data.update(status="validated", evidence=ev)
        path.write_text(json.dumps(data))
    return lib


def test_nothing_is_admitted_without_evidence_and_rejected_candidates_keep_theirs(tmp_path):
    lib = _library_with(tmp_path, None)
    with pytest.raises(LibraryError, match="no validation evidence"):
        admission.admit(lib, ["chain_get_zip_send_parcel"])
    lib2 = _library_with(tmp_path / "b", evidence(0.0, {"seed 0": 0.0}))
    [decision] = admission.admit(lib2)
    assert decision["decision"] == "rejected"
    library = load_library(lib2)
    assert library.primitives == {} and library.candidates()["chain_get_zip_send_parcel"]["status"] == "rejected"
    assert "REJECTED" in admission.history_lines(lib2)[0]


def test_a_sigkill_during_admission_leaves_the_previous_library_whole(tmp_path):
    lib = _library_with(tmp_path, evidence(1.0, {"seed 0": 0.0}))
    before = (lib / "library.json").read_text()
    script = ("import os, signal, sys\n"
              "from heart_distill.eval.library import admit\n"
              "admit(sys.argv[1], after_decisions=lambda stage: os.kill(os.getpid(), signal.SIGKILL))\n")
    killed = subprocess.run([sys.executable, "-c", script, str(lib)], capture_output=True, text=True, timeout=120)
    assert killed.returncode == -9, killed.stderr
    assert (lib / "library.json").read_text() == before  # the previous library, whole
    library = load_library(lib)
    assert library.primitives == {} and library.candidates()["chain_get_zip_send_parcel"]["status"] == "validated"
    assert any(p.name.startswith(".library.staging-") for p in tmp_path.iterdir())  # the killed build's leftovers
    [decision] = admission.admit(lib)  # the next admission cleans them up and completes
    assert decision["decision"] == "admitted"
    assert not any(p.name.startswith(".library.staging-") for p in tmp_path.iterdir())
    library = load_library(lib)
    assert list(library.primitives) == ["chain_get_zip_send_parcel"] and library.version == 1
    assert library.composites("geo")[0].chain[1].arguments["zip"] == "$step_1.result.zip"


def test_a_malformed_library_entry_is_a_clear_error_and_the_cli_exits_2(tmp_path):
    lib = tmp_path / "library"
    lib.mkdir()
    data = {"format_version": 1, "version": 1, "config": {"delta": 0.0}, "adapters": {}, "history": [],
            "primitives": {"chain_get_zip_send_parcel": entry()}}  # no evidence
    (lib / "library.json").write_text(json.dumps(data))
    with pytest.raises(LibraryError, match="has no 'evidence'"):
        load_library(lib)
    data["primitives"] = {"chain_get_zip_send_parcel": {**entry(name="chain_other"), "evidence": {}}}
    (lib / "library.json").write_text(json.dumps(data))
    with pytest.raises(LibraryError, match="holds an entry named 'chain_other'"):
        load_library(lib)
    (lib / "library.json").write_text("{not json")
    done = subprocess.run([sys.executable, "-m", "heart_distill.cli", "library", "list", "--library", str(lib)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "not valid JSON" in done.stderr and "Traceback" not in done.stderr


def _adapter(folder: Path, role: str, base_hash: str) -> Path:
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8}))
    (folder / "manifest.json").write_text(json.dumps({
        "role": role, "system_prompt": "short",
        "base_model": {"name": "smollm2-135m", "content_hash": base_hash}}))
    return folder


def test_an_adapter_for_another_base_is_refused(tmp_path):
    lib = tmp_path / "library"
    good = {"kind": "adapter", "metric": "verdict_accuracy", "signal": "role_metric",
            "lift": {"value": 20.0, "low": 5.0, "high": 30.0, "n": 12}, "conditions": {"bfcl": 20.0}}
    admission.admit_adapter(lib, "verifier", _adapter(tmp_path / "a", "verifier", "sha256:aaa"), good)
    assert load_library(lib).base["content_hash"] == "sha256:aaa"
    with pytest.raises(LibraryError, match="trained on base .* but this library serves base"):
        admission.admit_adapter(lib, "verifier", _adapter(tmp_path / "b", "verifier", "sha256:bbb"), good)
    with pytest.raises(LibraryError, match="is for role 'verifier', not 'planner'"):
        admission.check_adapter_base("planner", tmp_path / "a", {})
    assert load_library(lib).version == 1  # nothing admitted by accident


@pytest.fixture(scope="module")
def gate_rows(tmp_path_factory):
    """Real held-out Verifier rows of one BFCL dev task (a gold collection with faults)."""
    from heart_distill.data.collect import main as collect
    from heart_distill.eval.heldout import build_heldout

    run_dir = tmp_path_factory.mktemp("run")
    collect(["--env", "bfcl", "--split", "dev", "--limit", "1", "--fault-rate", "0.5", "--concurrency", "1",
             "--out", str(run_dir)])
    out = tmp_path_factory.mktemp("gate")
    build_heldout(run_dir, out, "dev")
    return out


def test_a_retrained_adapter_worse_on_the_gate_split_is_not_served(gate_rows, tmp_path):
    from heart.runtime.scripted import ScriptedBackend
    from heart_distill.cli import _served_adapters, build_parser
    from heart_distill.eval.models import RoleModels
    from heart_distill.eval.roles import RoleEvalConfig, evaluate_role, load_rows

    rows = load_rows(gate_rows, "verifier", "dev", None, 0)
    assert rows
    targets = {row["messages"][1]["content"]: row["messages"][2]["content"] for row in rows}
    config = RoleEvalConfig(data=str(gate_rows), out=str(tmp_path), split="dev", roles=("verifier",))
    models = RoleModels("x", "distilled", "smollm2-135m")
    # the incumbent answers as the teacher; the retrained adapter answers PASS to everything
    incumbent, _ = evaluate_role("verifier", rows, ScriptedBackend(lambda r, m: targets[m[-1]["content"]]),
                                 models, config)
    always_pass = json.dumps({"status": "PASS", "step": 1, "criteria": {}, "feedback": ""})
    retrained, _ = evaluate_role("verifier", rows, ScriptedBackend(lambda r, m: always_pass), models, config)

    lib = tmp_path / "library"
    first = admission.adapter_evidence("verifier", [{**r, "verdict_correct": 0} for r in incumbent], incumbent)
    v1 = _adapter(tmp_path / "v1", "verifier", "sha256:aaa")
    decided = admission.admit_adapter(lib, "verifier", v1, first)
    assert decided["decision"] == "admitted", (decided, first)
    worse = admission.adapter_evidence("verifier", incumbent, retrained)
    assert worse["lift"]["value"] < 0
    record = admission.admit_adapter(lib, "verifier", _adapter(tmp_path / "v2", "verifier", "sha256:aaa"), worse)
    assert record["decision"] == "rejected"
    library = load_library(lib)
    assert library.adapters["verifier"]["version"] == 1
    served = library.adapter_paths()["verifier"]
    manifest = json.loads((Path(served) / "manifest.json").read_text())
    assert manifest["library"]["version"] == 1 and manifest["library"]["evidence"]["lift"] == first["lift"]
    args = build_parser().parse_args(["serve", "--library", str(lib)])
    assert _served_adapters(args) == {"verifier": served}  # heart serve (and the vLLM path) serve v1
    args = build_parser().parse_args(["run", "--task", "x", "--library", str(lib)])
    assert _served_adapters(args) == {"verifier": served}
    assert [h["decision"] for h in library.history] == ["admitted", "rejected"]


def test_the_same_adapter_again_is_already_admitted_and_not_revalidated(tmp_path, capsys):
    from heart_distill.cli import main as cli_main

    lib = tmp_path / "library"
    good = {"kind": "adapter", "metric": "verdict_accuracy", "signal": "role_metric",
            "lift": {"value": 20.0, "low": 5.0, "high": 30.0, "n": 12}, "conditions": {"bfcl": 20.0}}
    trained = _adapter(tmp_path / "trained", "verifier", "sha256:aaa")
    (trained / "adapter_model.safetensors").write_bytes(b"weights-1")
    admission.admit_adapter(lib, "verifier", trained, good)
    assert admission.incumbent_with_same_weights(lib, "verifier", trained)["version"] == 1
    assert admission.incumbent_with_same_weights(lib, "planner", trained) is None
    # a pipeline rerun puts the same folder before the library: a no-op, not a self-comparison
    before = (lib / "library.json").read_text()
    assert cli_main(["library", "adapter", "--library", str(lib), "--role", "verifier", "--adapter", str(trained),
                     "--data", str(tmp_path / "no-data")]) == 0
    assert "already admitted as v1 (same weights)" in capsys.readouterr().out
    assert (lib / "library.json").read_text() == before
    (trained / "adapter_model.safetensors").write_bytes(b"weights-2")  # retrained: validated again
    assert admission.incumbent_with_same_weights(lib, "verifier", trained) is None
