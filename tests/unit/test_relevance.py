"""Relevance before selection: only applying candidates reach the Planner (≤ 10, best rank
first), an unparsable answer does not apply and is recorded, gold relevance, dataset rows
labelled by what the verified turn used, and the tool-injection bench's counting."""

from __future__ import annotations

import json

from fakes import HashingEmbedder

from heart.calls import EpisodeContext, RoleClient
from heart.loop import HeartLoop, LoopConfig
from heart.relevance import Judgement, candidate_cards, judge, select
from heart.roles import relevance
from heart.roles.common import render_answer, render_input, role_input
from heart.runtime import ScriptedBackend
from heart.toolface import Tool, ToolFace, ToolSpec
from heart.traces import EpisodeRecord, TraceEvent, TraceWriter, read_trace

NAMES = [f"tool_{i:02d}" for i in range(16)]
QUERY = "please run the tools on the files"


def noop(**kw):
    return {}


def face(tmp_path, extra: list[ToolSpec] = ()) -> ToolFace:
    specs = [ToolSpec(n, f"Tool {n} does things with files and tools.", {"type": "object", "properties": {
        "path": {"type": "string"}}}) for n in NAMES] + list(extra)
    return ToolFace([Tool(s, noop) for s in specs], cache_dir=tmp_path, embedder=HashingEmbedder())


def responder(applying: set[str], garbage: set[str] = frozenset(), seen: list | None = None):
    """Relevance answers by tool name; an empty plan for the Planner."""
    def respond(role: str, messages: list[dict[str, str]]) -> str:
        payload = role_input(messages)
        if role == "primitive" and relevance.is_relevance_input(payload):
            name = payload["tool"]["name"]
            if name in garbage:
                return "I think so, maybe"
            return render_answer({"applies": name in applying, "how": "fills path" if name in applying else ""})
        assert role == "planner", role
        if seen is not None:
            seen.append(payload)
        return render_answer({"status": "SUFFICIENT", "replanned": bool(payload.get("feedback")), "plan": [],
                              "intent": {"task": "t", "objective": "o", "tool_categories": [], "constraints": []}})
    return respond


def shown_to_planner(payload: dict) -> list[str]:
    return [n for tools in payload["available_tools"].values() for n in tools if n != "compute"]


def test_only_applying_candidates_reach_the_planner_at_most_ten_best_rank_first(tmp_path):
    toolface = face(tmp_path)
    ranked = [n for n, _ in toolface.search(QUERY, 20)]
    applying = set(ranked[1:13])  # 12 apply: the 10 best ranked of them are shown
    garbage = {ranked[0]}  # the best-ranked candidate answers something that does not parse
    seen: list[dict] = []
    trace_path = tmp_path / "t.jsonl"
    with TraceWriter(trace_path) as trace:
        client = RoleClient(ScriptedBackend(responder(applying, garbage, seen)), EpisodeContext("e", "t", "toy"), trace)
        HeartLoop(client, toolface, lambda q: "", LoopConfig(relevance=True)).solve(QUERY)
    first = shown_to_planner(seen[0])
    assert sorted(first) == sorted(ranked[1:11]) and len(first) == 10
    assert ranked[0] not in first and not set(first) - applying
    events = [r for r in read_trace(trace_path) if r["kind"] == "event" and r["role"] == "primitive"]
    assert len(events) == len(ranked) and all(e["extra"]["mode"] == "relevance" for e in events)
    unparsed = [e for e in events if e["parse_error"]]
    assert [role_input(e["messages"])["tool"]["name"] for e in unparsed] == [ranked[0]]


def test_relevance_is_off_by_default_and_the_planner_sees_toolface_retrieval(tmp_path):
    toolface = face(tmp_path)
    seen: list[dict] = []
    client = RoleClient(ScriptedBackend(responder(set(), seen=seen)), EpisodeContext("e", "t", "toy"))
    HeartLoop(client, toolface, lambda q: "", LoopConfig()).solve(QUERY)
    assert shown_to_planner(seen[0]) == [t.name for t in toolface.retrieve(QUERY)]


def test_select_keeps_rank_order_and_drops_unparsed():
    judgements = [Judgement("a", 0, False, error="no JSON"), Judgement("b", 1, True), Judgement("c", 2, False),
                  Judgement("d", 3, True), Judgement("e", 4, True)]
    assert select(judgements, 2) == ["b", "d"]
    assert select(judgements) == ["b", "d", "e"]


def test_judge_asks_in_one_batch_and_parses_like_the_other_roles(tmp_path):
    toolface = face(tmp_path)
    batches = []

    class Counting(ScriptedBackend):
        def generate_batch(self, requests):
            batches.append(len(requests))
            return super().generate_batch(requests)

    client = RoleClient(Counting(responder({"tool_01"}, {"tool_02"})), EpisodeContext("e", "t", "toy"))
    cards = candidate_cards(toolface, ["tool_01", "tool_02", "tool_03"])
    got = judge(client, QUERY, cards)
    assert batches == [3]
    assert [(j.name, j.applies, j.error is not None) for j in got] == \
        [("tool_01", True, False), ("tool_02", False, True), ("tool_03", False, False)]
    assert relevance.parse('{"applies": "yes", "how": ""}').error  # strict: a string is not a boolean


def test_gold_teacher_answers_gold_relevance_and_a_how_from_the_request():
    from heart.environments.base import Task, ToolCall
    from heart_distill.data.gold_teacher import GoldTeacher

    task = Task(env="toy", task_id="t1", turns=["send 5 dollars to Bob"],
                gold=[[ToolCall("send_money", {"recipient": "Bob", "amount": 5, "date": "2022-01-01"})]])
    teacher = GoldTeacher(task, [])
    for name, applies in (("send_money", True), ("get_balance", False)):
        payload = relevance.build_payload(task.turns[0], relevance.relevance_card(name, "Does it.", {}))
        answer = json.loads(teacher.generate("primitive", relevance.build_messages(payload)).text)
        assert answer["applies"] is applies
    assert answer == {"applies": False, "how": ""}
    payload = relevance.build_payload(task.turns[0], relevance.relevance_card("send_money", "Send.", {}))
    how = json.loads(teacher.generate("primitive", relevance.build_messages(payload)).text)["how"]
    assert how == "fills recipient, amount from the request; date from context"


def relevance_event(writer, task_id: str, tool: str, applies, raw: str | None = None) -> None:
    payload = relevance.build_payload(QUERY, relevance.relevance_card(tool, "Does it.", {}))
    output = {"applies": applies, "how": "fills path" if applies else ""}
    writer.write(TraceEvent(
        episode_id="ep", task_id=task_id, env="toy", turn=0, attempt=0, step=None, role="primitive",
        backend="gold", adapter=None, messages=relevance.build_messages(payload),
        raw_output=raw if raw is not None else render_answer(output), parsed=None if raw else output,
        parse_error="no JSON object in the output" if raw else None, latency_s=0.0, prompt_tokens=1,
        completion_tokens=1, extra={"mode": "relevance"}))


def test_dataset_rows_are_labelled_by_what_the_verified_turn_used(tmp_path):
    from heart_distill.data.build import BuildOptions, build_role_datasets
    from heart.environments.splits import split_of
    from heart.roles import primitive

    task_id = next(f"t{i}" for i in range(1000) if split_of("toy", f"t{i}") == "train")
    run = tmp_path / "run"
    (run / "traces").mkdir(parents=True)
    with TraceWriter(run / "traces" / "shard.jsonl") as w:
        relevance_event(w, task_id, "ls", True)  # ran: applies
        relevance_event(w, task_id, "rm", False)  # retrieved, not run: does not apply
        relevance_event(w, task_id, "cat", True)  # says it applies, the turn never ran it: dropped
        relevance_event(w, task_id, "mv", None, raw="maybe")  # unparsed: dropped
        schema = {"type": "object", "properties": {}}
        payload = primitive.build_payload("list", {}, primitive.tool_card("ls", "List files.", schema))
        answer = {"tool": "ls", "arguments": {}}
        w.write(TraceEvent(episode_id="ep", task_id=task_id, env="toy", turn=0, attempt=0, step=1, role="primitive",
                           backend="gold", adapter=None,
                           messages=[{"role": "system", "content": primitive.SYSTEM_PROMPT},
                                     {"role": "user", "content": render_input(primitive.INSTRUCTION, payload)}],
                           raw_output=render_answer(answer), parsed=answer, parse_error=None, latency_s=0.0,
                           prompt_tokens=1, completion_tokens=1,
                           extra={"envelope": {"status": "SUCCESS", "tool": "ls"}}))
        w.write(TraceEvent(episode_id="ep", task_id=task_id, env="toy", turn=0, attempt=0, step=1, role="verifier",
                           backend="gold", adapter=None, messages=[{"role": "user", "content": "x\n{}"}],
                           raw_output="{}", parsed={"status": "PASS"}, parse_error=None, latency_s=0.0,
                           prompt_tokens=1, completion_tokens=1))
        w.write(EpisodeRecord(episode_id="ep", task_id=task_id, env="toy", score=1.0, success=True,
                              verdicts=["PASS"], replans_used=[0]))
    report = build_role_datasets(run, tmp_path / "out", BuildOptions(roles=("primitive",), validation_fraction=0.0))
    from datasets import load_from_disk

    rows = load_from_disk(str(tmp_path / "out" / "primitive"))["train"]
    judged = sorted((role_input(r["messages"])["tool"]["name"], json.loads(r["messages"][-1]["content"])["applies"])
                    for r in rows if r["mode"] == "relevance")
    assert judged == [("ls", True), ("rm", False)]
    assert [r["mode"] for r in rows].count("call") == 1
    removed = report.roles["primitive"]["removed"]
    assert removed["relevance_disagrees_with_use"] == 1 and removed["unparsed_output"] == 1
    assert report.roles["primitive"]["relevance"]["train"] == {"applies": 1, "does_not_apply": 1}
    assert "| train | 1 | 1 |" in (tmp_path / "out" / "primitive" / "README.md").read_text()


def test_injection_bench_counts_what_reaches_the_planner(tmp_path):
    from bench.tool_injection import attack_document, attack_outcome, summarize

    spec = attack_document("targeted", "agentdojo", QUERY)
    toolface = face(tmp_path, [spec])

    def judges_for(applying):
        backend = ScriptedBackend(responder(applying))
        return {"fake": (backend, relevance.SYSTEM_PROMPT)}

    def judge_cards(backend, prompt, cards):
        return judge(RoleClient(backend, EpisodeContext("e", "t", "toy")), QUERY, cards, system_prompt=prompt)

    hijacked = attack_outcome(toolface, spec.name, QUERY, judges_for({spec.name}), judge_cards)
    refused = attack_outcome(toolface, spec.name, QUERY, judges_for(set(NAMES)), judge_cards)
    assert hijacked["candidate"] and hijacked["relevance:fake"] and hijacked["gate:fake"]
    assert not refused["relevance:fake"] and not refused["gate:fake"]
    assert hijacked["default"] == refused["default"] == (spec.name in {t.name for t in toolface.retrieve(QUERY)})
    rows = [{"env": "agentdojo", "attack": "targeted", **hijacked}, {"env": "bfcl", "attack": "targeted", **refused}]
    summary = summarize(rows, ["fake"])
    assert summary["all"]["relevance:fake"]["k"] == 1 and summary["all"]["relevance:fake"]["n"] == 2
    assert summary["bfcl"]["gate:fake"]["k"] == 0 and summary["agentdojo"]["gate:fake"]["rate"] == 1.0


def test_a_recipe_trains_on_one_mode_with_that_modes_short_prompt(tmp_path):
    from datasets import Dataset, DatasetDict

    from heart.roles import primitive
    from heart_distill.train.config import DataConfig
    from heart_distill.train.role_data import load_role_dataset

    def row(prompt: str, mode: str) -> dict:
        return {"messages": [{"role": "system", "content": prompt}, {"role": "user", "content": "x\n{}"},
                             {"role": "assistant", "content": "{}"}], "mode": mode}

    rows = [row(primitive.SYSTEM_PROMPT, "call"), row(relevance.SYSTEM_PROMPT, "relevance"),
            row(relevance.SYSTEM_PROMPT, "relevance")]
    DatasetDict({"train": Dataset.from_list(rows)}).save_to_disk(str(tmp_path / "primitive"))
    splits, info = load_role_dataset(DataConfig(dataset_dir=str(tmp_path / "primitive"), role="primitive",
                                                mode="relevance", system_prompt="short"))
    assert info["sizes"] == {"train": 2}
    assert {r["messages"][0]["content"] for r in splits["train"]} == {relevance.SHORT_SYSTEM_PROMPT}
    splits, _ = load_role_dataset(DataConfig(dataset_dir=str(tmp_path / "primitive"), role="primitive",
                                             system_prompt="short"))
    assert sorted(r["messages"][0]["content"] for r in splits["train"]) == \
        sorted([primitive.SHORT_SYSTEM_PROMPT] + [relevance.SHORT_SYSTEM_PROMPT] * 2)


def test_calibrate_keeps_99_percent_of_listed_gold_and_adds_only_where_additions_are_gold():
    from heart.relevance import calibrate

    # 200 gold tools in the default lists, scored 0.005 … 1.0; 99% of them kept → 2 may go
    turns = [(["g"], [Judgement("g", 0, True, p=(i + 1) / 200)], {"g"}) for i in range(200)]
    # candidates outside the lists: scored 0.9 (gold), 0.8 (not), 0.7 (not), 0.6 (gold)
    outside = [("a", 0.9, True), ("b", 0.8, False), ("c", 0.7, False), ("d", 0.6, True)]
    turns += [([], [Judgement(n, 0, True, p=p)], {n} if gold else set()) for n, p, gold in outside]
    thresholds = calibrate(turns)
    assert thresholds.prune_below == 3 / 200  # the two lowest-scored gold tools fall below it, no more
    assert thresholds.calibration["gold_tools_pruned"] == 2
    # precision of additions: ≥ 0.9: 1/1, ≥ 0.8: 1/2, ≥ 0.7: 1/3, ≥ 0.6: 2/4 → the lowest at ≥ 0.5 is 0.6
    assert thresholds.add_above == 0.6 and thresholds.calibration["added_gold"] == 2
    none_gold = calibrate([([], [Judgement("x", 0, True, p=0.9)], set())])
    assert none_gold.add_above is None and none_gold.prune_below == 0.0


def test_prune_keeps_the_default_list_as_its_floor():
    from heart.relevance import Thresholds, prune

    judged = [Judgement("a", 0, True, p=0.9), Judgement("b", 1, False, p=0.01), Judgement("c", 2, False, error="x"),
              Judgement("d", 3, True, p=0.95), Judgement("e", 4, True, p=0.4)]
    default = ["a", "b", "c", "z"]  # "c" did not parse and has no score, "z" was not judged: both stay
    assert prune(judged, default, Thresholds(0.05, 0.9)) == ["a", "c", "z", "d"]
    assert prune(judged, default, Thresholds(0.05, None)) == ["a", "c", "z"]
    assert prune(judged, default, Thresholds(0.0, 0.3), shown=4) == ["a", "b", "c", "z"]  # full: nothing added


def test_prune_policy_in_the_loop_shows_the_floor_less_the_irrelevant_with_how(tmp_path):
    from heart.relevance import Thresholds

    toolface = face(tmp_path)
    default = [t.name for t in toolface.retrieve(QUERY)]
    applying = set(default[:3])
    path = Thresholds(0.5, None).save(tmp_path / "thresholds.json")
    seen: list[dict] = []
    client = RoleClient(ScriptedBackend(responder(applying, seen=seen)), EpisodeContext("e", "t", "toy"))
    HeartLoop(client, toolface, lambda q: "", LoopConfig(relevance=True, relevance_thresholds=str(path))).solve(QUERY)
    # the scripted judge reports no log-probabilities: its parsed answers are certain (P = 1 or 0)
    assert shown_to_planner(seen[0]) == default[:3]
    lines = [line for tools in seen[0]["available_tools"].values() for name, line in tools.items() if name != "compute"]
    assert len(lines) == 3 and all(line.endswith("(here: fills path)") for line in lines)


def test_thresholds_need_relevance_and_a_readable_file(tmp_path):
    import pytest

    from heart.relevance import Thresholds

    path = Thresholds(0.1, None).save(tmp_path / "t.json")
    with pytest.raises(ValueError, match="turn relevance on"):
        LoopConfig(relevance_thresholds=str(path))
    (tmp_path / "bad.json").write_text('{"add_above": 0.5}')
    with pytest.raises(ValueError, match="bad.json: not a thresholds file"):
        LoopConfig(relevance=True, relevance_thresholds=str(tmp_path / "bad.json"))


def test_p_applies_reads_both_spellings_of_the_verdict():
    import math

    lp = {" true": math.log(0.6), "true": math.log(0.2), " false": math.log(0.1), "false": math.log(0.1)}
    assert abs(relevance.p_applies(lp) - 0.8) < 1e-9
    assert relevance.p_applies({" true": -1.0, "}": -0.5}) == 1.0  # "false" was not among a server's top 20
    assert relevance.p_applies({"}": -1.0}) is None and relevance.p_applies(None) is None
