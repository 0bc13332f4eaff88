"""Natural-language fields are whole sentences: the cutting helpers keep or drop whole parts,
and the datasets' build refuses a target with a cut-off clause."""

from __future__ import annotations


import pytest

from heart.roles.common import first_clause, is_clipped, lead_phrase, whole_parts
from heart_distill.data.build import ClippedTargetError, build_role_datasets
from heart_distill.data.filters import clipped_fields
from heart.traces import TraceWriter

from tests.unit.test_dataset_build import TRAIN, Episode


def test_lead_phrase_cuts_at_a_phrase_break_and_never_mid_phrase():
    assert lead_phrase("Get the list of users in the given channel", 40) == "Get the list of users"
    assert lead_phrase("Send a message to a user with the given id", 30) == "Send a message to a user"
    # no break fits: the whole text when it is at most 1.5 x the limit, not "Get the list of the most recent"
    assert lead_phrase("Get the list of the most recent transactions", 40) == "Get the list of the most recent transactions"
    assert lead_phrase("Short enough", 40) == "Short enough"
    for text in ("Get the list of users in the given channel", "Read the messages from the given channel or inbox"):
        assert not is_clipped(lead_phrase(text, 40))


def test_first_clause_keeps_whole_clauses_or_nothing():
    sentence = "Find the cheapest hotel in Paris, then book it for two nights and send me the receipt"
    assert first_clause(sentence, 200) == sentence
    assert first_clause(sentence, 64) == "Find the cheapest hotel in Paris, then book it for two nights."
    assert first_clause(sentence, 40) == "Find the cheapest hotel in Paris."
    assert first_clause(sentence, 20) == ""


def test_whole_parts_drops_parts_instead_of_cutting_them():
    render = lambda kept: "; ".join(kept)  # noqa: E731
    assert whole_parts(["aaa", "bbb", "ccc"], render, 8) == "aaa; bbb"
    assert whole_parts(["aaa", "bbb"], render, 2) == ""


@pytest.mark.parametrize("text,clipped", [
    ("Get the list of the…", True), ("Send them the difference...", True),
    ("Get the list of users in the.", True), ("Read the file of", True), ("Send it to Bob and", True),
    ("Get the list of users.", False), ("Call ls with path='/tmp'.", False), ("", False), (None, False),
    ("There's something else I need help with.", False), ("mode: on", False), ("Annul the order I put in.", False)])
def test_is_clipped_names_ellipses_and_dangling_words(text, clipped):
    assert is_clipped(text) is clipped


def test_clipped_fields_names_the_fields_that_hold_a_cut_clause():
    answer = {"status": "SUFFICIENT", "intent": {"task": "Get the list of the…", "objective": "Find it.",
                                                 "tool_categories": [], "constraints": ["n: 3"]},
              "plan": [{"step": 1, "objective": "List the files."}, {"step": 2, "objective": "Read the…"}]}
    assert clipped_fields("planner", answer) == ["intent.task", "plan.1.objective"]
    assert clipped_fields("verifier", {"status": "FAIL", "feedback": "Step 1 used the wrong…"}) == ["feedback"]
    assert clipped_fields("verifier", {"status": "PASS", "feedback": ""}) == []


def test_the_build_refuses_a_clipped_target_and_writes_nothing(tmp_path):
    run = tmp_path / "run"
    with TraceWriter(run / "traces" / "shard-0.jsonl", fsync=False) as writer:
        episode = Episode(writer, "A", TRAIN[0])
        clipped = {"status": "SUFFICIENT", "replanned": False,
                   "intent": {"task": "Get the list of the most…", "objective": "o", "tool_categories": ["fs"],
                              "constraints": []},
                   "plan": [{"step": 1, "tool_category": "fs", "tool_hint": "ls", "objective": "list",
                             "dependencies": []}]}
        episode.call("planner", 0, output=clipped)
        episode.call("router", 0, 0)
        episode.primitive(0, 0)
        episode.verifier(0, "PASS")
        episode.close(True)
    out = tmp_path / "datasets"
    with pytest.raises(ClippedTargetError, match=r"planner: 1 target\(s\).*field intent\.task"):
        build_role_datasets(run, out)
    assert not (out / "planner").exists()
