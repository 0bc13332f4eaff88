"""The central catalog (every BFCL + AgentDojo document) and the companion map."""

import collections

import pytest
from fakes import HashingEmbedder

from heart.catalog import (
    GoldTurn,
    ToolStatistics,
    catalog_tools,
    central_catalog,
    companions_from_turns,
    gold_turns,
    retrieval_config,
    session_toolface,
    tool_companions,
    tool_statistics,
)
from heart.environments import load_environment
from heart.environments.bfcl import MULTI_TURN_CLASSES
from heart.primitives import execute
from heart.toolface import ToolFace


@pytest.fixture(scope="module")
def catalog():
    return central_catalog()


def test_central_catalog_holds_every_benchmark_document_once(catalog):
    names = [s.name for s in catalog]
    assert len(names) == len(set(names)) > 3000
    categories = collections.Counter(s.category for s in catalog)
    # the 8 executable BFCL classes, AgentDojo's 4 suites, and the single-turn categories
    for category in (*MULTI_TURN_CLASSES, "workspace", "travel", "banking", "slack",
                     "simple_python", "simple_java", "live_multiple", "MemoryAPI_kv", "WebSearchAPI"):
        assert categories[category] > 0, category
    contents = {(s.name.split("~")[0], s.description, str(s.parameters)) for s in catalog}
    assert len(contents) == len(catalog)  # deduplicated by content
    # executable tools keep their plain names; later documents with a taken name get ~hash
    assert {"cd", "startEngine", "send_money", "get_unread_emails"} <= set(names)
    assert all(s.parameters.get("type") == "object" for s in catalog)
    java = next(s for s in catalog if s.category == "simple_java")
    assert all(p.get("type") in (None, "string", "boolean", "integer", "number", "array", "object")
               for p in java.parameters["properties"].values())


def test_an_episode_on_the_central_catalog_executes_its_own_tools_and_fails_others_cleanly(catalog, tmp_path):
    env = load_environment("bfcl")
    task = env.load_task("multi_turn_base_0")
    session = env.start(task)
    tools = {t.name: t for t in catalog_tools(session, catalog)}
    assert len(tools) == len(catalog)
    session.start_turn(0)
    ok = execute(tools["pwd"], {})
    assert ok.status == "SUCCESS"
    assert session.executed_calls()[0][0].name == "pwd"  # the session logged its own call
    missing = execute(tools["send_money"], {"recipient": "x", "amount": 1, "subject": "s", "date": "2024-01-01"})
    assert missing.status == "FAILURE" and missing.failure_type == "RUNTIME_ERROR"
    assert "send_money" in missing.details and "cannot execute" in missing.details
    # a ToolFace over the whole catalog finds a session tool by what the user asks
    face = ToolFace(list(tools.values()), cache_dir=tmp_path, embedder=HashingEmbedder())
    assert "pwd" in [t.name for t in face.retrieve("print the current working directory path", 20)]


def test_companions_are_counted_per_turn_with_share_and_count_thresholds():
    turns = [{"startEngine", "pressBrakePedal", "lockDoors"}, {"startEngine", "pressBrakePedal"},
             {"startEngine"}, {"startEngine", "setHeadlights"}, {"lockDoors"}]
    companions = companions_from_turns(turns, min_share=0.25, min_count=2)
    # pressBrakePedal: 2 of 4 startEngine turns; lockDoors and setHeadlights only once
    assert companions["startEngine"] == ["pressBrakePedal"]
    assert companions["pressBrakePedal"] == ["startEngine"]
    assert "lockDoors" not in companions  # with startEngine in 1 of its 2 turns: count 1 < 2
    assert companions_from_turns(turns, min_share=0.6, min_count=1)["pressBrakePedal"] == ["startEngine"]
    assert "startEngine" not in companions_from_turns(turns, min_share=0.6, min_count=1)


def test_companion_map_is_learnt_from_the_train_split_only():
    env = load_environment("bfcl")
    companions = tool_companions(env, "train")
    assert "pressBrakePedal" in companions["startEngine"]
    train_tools = set().union(*gold_turns(env, "train"))
    assert set(companions) <= train_tools
    assert all(set(c) <= train_tools for c in companions.values())


def test_statistics_leave_a_task_out_and_count_usage_over_the_turns_offering_a_tool():
    offered = frozenset({"cd", "ls", "cat"})
    stats = ToolStatistics((
        GoldTurn("a", "go to docs and list", frozenset({"cd", "ls"}), offered),
        GoldTurn("a", "list again", frozenset({"ls"}), offered),
        GoldTurn("b", "show the file", frozenset({"cd", "cat"}), offered),
    ))
    assert stats.usage() == {"cd": 2 / 4, "ls": 2 / 4, "cat": 1 / 4}  # +1 on the offering turns
    without_a = stats.without("a")
    assert [t.task_id for t in without_a.turns] == ["b"]
    assert without_a.query_log() == [("show the file", frozenset({"cd", "cat"}))]
    assert stats.without("nobody") == stats


def test_an_episode_is_never_shown_what_its_own_gold_taught(tmp_path, monkeypatch):
    """session_toolface learns from train-split gold without the task's own turns."""
    import heart.catalog

    warmed = []
    monkeypatch.setattr(heart.catalog, "_embed_once", lambda statistics, cache_dir: warmed.append(statistics))
    env = load_environment("bfcl")
    statistics = tool_statistics(env, "train")
    assert {t.task_id for t in statistics.turns} == set(env.task_ids("train"))
    task = env.load_task(env.task_ids("train")[0])
    session = env.start(task)
    face = session_toolface(env, session, cache_dir=tmp_path, config=retrieval_config(env))
    own = {t.query for t in statistics.turns if t.task_id == task.task_id}
    assert own and not own & {text for text, _ in face.query_log}
    assert len(face.query_log) == len(statistics.turns) - len(own)
    assert face.usage == statistics.without(task.task_id).usage()
    assert face.config.query_log_weight > 0 and retrieval_config("agentdojo").query_log_weight == 0
    assert retrieval_config(env, k=3).k == 3
    assert warmed == [statistics]  # the whole log is embedded once, in one batch
