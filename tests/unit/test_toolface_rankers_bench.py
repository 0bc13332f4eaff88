"""bench/toolface_rankers.py: a variant's ranking is shown through ToolFace's own policy (top k,
companions, filled to min_shown), and requests split into clauses."""

import numpy as np

from bench.toolface_rankers import Turn, clauses
from heart.catalog import session_toolface
from heart.environments import load_environment


def test_a_ranking_is_shown_as_toolface_itself_would_show_it(tmp_path):
    env = load_environment("agentdojo")
    task = env.load_task("travel/user_task_3")
    face = session_toolface(env, env.start(task), cache_dir=tmp_path)
    query = task.turns[0]
    order = sorted(face.names())
    scores = dict(face.search(query, len(face)))
    shipped = np.array([scores[name] for name in order])
    turn = Turn(task.task_id, "train", query, set(), face, order, vectors=np.zeros((len(order), 1)),
                query_vector=np.zeros(1), lexical=np.zeros(len(order)), usage=np.zeros(len(order)))

    assert turn.shown(shipped) == [t.name for t in face.retrieve(query)]
    worst_first = turn.shown(-shipped)
    assert worst_first[0] == order[int(np.argmin(shipped))]
    assert len(worst_first) >= face.config.min_shown
    # the view does not change the ToolFace it was taken from
    assert [t.name for t in face.retrieve(query)] == turn.shown(shipped)


def test_requests_split_into_clauses_of_three_words_or_more():
    text = "Perform the tasks in order: 1. How many appointments do I have? 2. Send the summary to Bob. Then reply."
    assert clauses(text) == ["Perform the tasks in order:", "How many appointments do I have?",
                             "Send the summary to Bob."]
    assert clauses("Book a table for two at Luigi's.") == []
