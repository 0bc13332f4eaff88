"""AgentDojo: the environment is faithful to agentdojo's own tasks, tools and utility checks.

Gold calls replayed through a session's tools must pass every task's utility check, and a
damaged replay must not (except where agentdojo's own check cannot tell, listed below).
"""

from __future__ import annotations

import json

import pytest

from heart.environments import ToolCall, ToolExecutionError, load_environment
from heart.environments.agentdojo import CLARIFY_ANSWER, AgentDojoEnvironment

VACUOUS_UTILITY = {
    "banking/user_task_5",  # "any transaction of 50.00 to Spotify": the history has one already
    "banking/user_task_6",  # a recurring 50.00 Spotify scheduled transaction already exists
    "banking/user_task_8",  # utility() returns True ("no real utility check here")
    "banking/user_task_9",  # rent is already 1100 and pre == post is required
    "banking/user_task_10",  # pre == post is all it checks
}
"""Tasks whose utility() passes on the untouched environment with an empty answer, so an
empty episode cannot fail them (inside agentdojo, not ours)."""


@pytest.fixture(scope="module")
def env() -> AgentDojoEnvironment:
    return AgentDojoEnvironment()


def replay(env: AgentDojoEnvironment, task, calls: list[ToolCall], response: str | None = None):
    """Run ``calls`` through a fresh session's tools, answer, and score."""
    session = env.start(task)
    tools = {tool.name: tool for tool in session.tools}
    session.start_turn(0)
    results = []
    for call in calls:
        try:
            results.append(tools[call.name].fn(**call.arguments))
        except ToolExecutionError as e:
            results.append(str(e))
    if response is None:  # what a faithful agent would say: what it saw, then the answer
        response = "\n".join([json.dumps(r) for r in results] + (task.gold_response or []))
    session.finish_turn(0, response)
    return session, session.score()


def walk_keys(schema):
    if isinstance(schema, dict):
        for key, value in schema.items():
            yield key
            if key != "properties":
                yield from walk_keys(value)
            else:
                for sub in value.values():
                    yield from walk_keys(sub)
    elif isinstance(schema, list):
        for value in schema:
            yield from walk_keys(value)


# -- tasks and catalog -----------------------------------------------------------------
def test_load_environment_by_name():
    assert isinstance(load_environment("agentdojo", suites=["banking"]), AgentDojoEnvironment)


def test_task_ids_by_suite_in_numeric_order(env):
    ids = env.task_ids()
    assert len(ids) == 97
    counts = {s: sum(i.startswith(f"{s}/") for i in ids) for s in ("workspace", "travel", "banking", "slack")}
    assert counts == {"workspace": 40, "travel": 20, "banking": 16, "slack": 21}
    banking = [i for i in ids if i.startswith("banking/")]
    assert banking[:3] == ["banking/user_task_0", "banking/user_task_1", "banking/user_task_2"]
    assert banking[10] == "banking/user_task_10"


def test_task_has_prompt_gold_and_answer(env):
    task = env.load_task("banking/user_task_0")
    assert task.env == "agentdojo" and len(task.turns) == 1
    assert "bill-december-2023.txt" in task.turns[0]
    assert [c.name for c in task.gold[0]] == ["read_file", "send_money"]
    assert task.meta["suite"] == "banking"
    with_answer = env.load_task("workspace/user_task_0")
    assert with_answer.gold_response and with_answer.gold_response[0]


def test_unknown_task_raises_key_error_naming_it(env):
    with pytest.raises(KeyError, match="banking/user_task_999"):
        env.load_task("banking/user_task_999")
    with pytest.raises(KeyError, match="nosuite/user_task_0"):
        env.load_task("nosuite/user_task_0")


def test_suites_option_restricts_tasks():
    env = AgentDojoEnvironment(suites=["slack"])
    assert len(env.task_ids()) == 21
    with pytest.raises(ValueError, match="shopping"):
        AgentDojoEnvironment(suites=["shopping"]).task_ids()


def test_catalog_schemas_stand_alone(env):
    catalog = env.catalog()
    names = [spec.name for spec in catalog]
    assert len(names) == len(set(names)) == 69
    for spec in catalog:
        assert spec.parameters["type"] == "object"
        keys = set(walk_keys(spec.parameters))
        assert not keys & {"$ref", "$defs", "title"}, spec.name
    by_name = {spec.name: spec for spec in catalog}
    assert by_name["share_file"].parameters["properties"]["permission"]["enum"] == ["r", "rw"]
    # A parameter called "title" is a property, not pydantic's title noise: it stays.
    assert "title" in by_name["create_calendar_event"].parameters["properties"]


def test_functions_shared_by_suites_have_one_schema(env):
    specs = env._specs
    shared = set(specs["workspace"]) & set(specs["travel"])
    assert "send_email" in shared
    for name in shared:
        workspace, travel = specs["workspace"][name], specs["travel"][name]
        assert (workspace.description, workspace.parameters) == (travel.description, travel.parameters)
        # The category is the suite: the same function belongs to each suite that has it.
        assert (workspace.category, travel.category) == ("workspace", "travel")


# -- sessions --------------------------------------------------------------------------
def test_session_tools_are_its_suite_tools(env):
    session = env.start(env.load_task("banking/user_task_0"))
    names = {tool.name for tool in session.tools}
    assert {"send_money", "read_file"} <= names
    assert "send_email" not in names


def test_results_are_json_and_calls_logged(env):
    session = env.start(env.load_task("workspace/user_task_0"))
    tools = {tool.name: tool for tool in session.tools}
    session.start_turn(0)
    events = tools["search_calendar_events"].fn(query="Networking", date="2024-05-26")
    assert json.loads(json.dumps(events)) == events and isinstance(events, list)
    assert session.executed_calls() == [
        [ToolCall("search_calendar_events", {"query": "Networking", "date": "2024-05-26"})]
    ]


def test_tool_error_is_logged_and_raised(env):
    session = env.start(env.load_task("banking/user_task_0"))
    tools = {tool.name: tool for tool in session.tools}
    session.start_turn(0)
    with pytest.raises(ToolExecutionError, match="ValidationError"):
        tools["send_money"].fn(recipient="X")  # amount, subject, date missing
    with pytest.raises(ToolExecutionError, match="ValueError: Transaction with ID 999 not found"):
        tools["update_scheduled_transaction"].fn(id=999)  # an exception inside the tool
    assert [c.name for c in session.executed_calls()[0]] == ["send_money", "update_scheduled_transaction"]


def test_clarify_gives_no_new_facts(env):
    session = env.start(env.load_task("banking/user_task_0"))
    assert session.clarify("Which bill?") == CLARIFY_ANSWER


def test_pre_environment_is_untouched_by_the_episode(env):
    task = env.load_task("banking/user_task_0")
    session, score = replay(env, task, task.gold[0])
    assert score.success
    assert session.pre_environment != session.environment
    assert session.pre_environment == env.pre_environment(task.task_id)


# -- scoring ---------------------------------------------------------------------------
@pytest.mark.parametrize("answer", ["ground_truth_output", "tool_results_and_output"])
def test_gold_replay_passes_utility_on_every_task(env, answer):
    failed = {}
    for task_id in env.task_ids():
        task = env.load_task(task_id)
        # AgentDojo's own GroundTruthPipeline answers with GROUND_TRUTH_OUTPUT alone.
        response = (task.gold_response or [""])[0] if answer == "ground_truth_output" else None
        _, score = replay(env, task, task.gold[0], response)
        if not score.success:
            failed[task_id] = score.details
    assert failed == {}


def test_trace_checked_tasks_are_scored_from_the_trace(env):
    task = env.load_task("slack/user_task_11")
    _, score = replay(env, task, task.gold[0])
    assert score.success and score.details["checked_by"] == "utility_from_traces"
    _, score = replay(env, task, task.gold[0][:-1])
    assert not score.success


def test_an_empty_episode_fails_unless_utility_is_vacuous(env):
    passed = set()
    for task_id in env.task_ids():
        _, score = replay(env, env.load_task(task_id), [], "")
        if score.success:
            passed.add(task_id)
    assert passed == VACUOUS_UTILITY


def test_a_wrong_argument_fails(env):
    task = env.load_task("banking/user_task_0")
    calls = [
        ToolCall(c.name, {**c.arguments, "amount": c.arguments["amount"] + 1})
        if c.name == "send_money" else c
        for c in task.gold[0]
    ]
    _, score = replay(env, task, calls)
    assert not score.success


def test_dropping_the_last_state_changing_call_fails(env):
    task = env.load_task("workspace/user_task_12")  # create a calendar event
    assert task.gold[0][-1].name == "create_calendar_event"
    _, score = replay(env, task, task.gold[0][:-1])
    assert not score.success


def test_what_an_episode_creates_is_stamped_by_its_own_clock_not_the_wall_clock(env):
    """Two runs of the same calls write the same timestamps, even when another episode's
    calls interleave in another thread; each call that reads the clock moves it one second.
    With the wall clock, the same pipeline's Verifier rows changed between runs."""
    import datetime
    import threading

    from heart.environments.agentdojo import EPISODE_START

    task = env.load_task("workspace/user_task_0")
    calls = [ToolCall("create_file", {"filename": "a.txt", "content": "one"}),
             ToolCall("create_file", {"filename": "b.txt", "content": "two"}),
             ToolCall("send_email", {"recipients": ["x@y.z"], "subject": "s", "body": "b"})]
    stamps = {}

    def run(name):
        session, _ = replay(env, task, calls, response="done")
        drive = session.environment.cloud_drive.files
        created = sorted((f for f in drive.values() if f.filename in {"a.txt", "b.txt"}), key=lambda f: f.filename)
        sent = [e for e in session.environment.inbox.emails.values() if e.subject == "s"]
        stamps[name] = [f.last_modified for f in created] + [e.timestamp for e in sent]

    threads = [threading.Thread(target=run, args=(n,)) for n in ("first", "second")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    expected = [EPISODE_START + datetime.timedelta(seconds=s) for s in range(3)]
    assert stamps["first"] == stamps["second"] == expected
    # outside an episode's tool call the tools' clock is the wall clock again
    from agentdojo.default_suites.v1.tools import email_client

    assert abs(email_client.datetime.datetime.now() - datetime.datetime.now()) < datetime.timedelta(seconds=5)
