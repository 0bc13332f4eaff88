"""Honest failure accounting and hostile tools.

Infrastructure failures (the backend raising, the checker raising, a tool call abandoned on
timeout) end an episode as *errored* — counted apart, never a clean ``score 0.00`` — and a
hostile tool (raises, hangs, returns megabytes or values JSON cannot encode) is contained
by its Primitive: a typed FAILURE or a bounded result, and the loop goes on.
"""

from __future__ import annotations

import json
import threading

import pytest
from fakes import PASS, HashingEmbedder, Script, dispatch, echo_bindings, fail, plan

from heart.environments.base import CatalogEnvironment, EpisodeScore, Task
from heart.environments.calls import LoggedSession
from heart.episode import run_episode
from heart.primitives import (MAX_RESULT_CHARS, RUNTIME_ERROR, contained_tool_calls, execute)
from heart.runtime import ScriptedBackend
from heart.toolface import Tool, ToolFace, ToolSpec
from heart.traces import TraceWriter, read_trace


# -- a toy environment with hostile tools ----------------------------------------------------

class Hostile:
    """Tools that misbehave in every way a real tool can, over one shared piece of state."""

    def __init__(self):
        self.state = {"writes": 0}
        self.release = threading.Event()

    def tools(self) -> list[Tool]:
        def echo(text: str):
            return {"text": text}

        def explode(text: str):
            raise ValueError(f"cannot handle {text!r}")

        def exit_process(text: str):
            raise SystemExit(3)

        def hang(text: str):
            self.release.wait(5)  # past any timeout the tests give it
            self.state["writes"] += 1  # what an abandoned call does later: change the state
            return {"late": True}

        def flood(text: str):
            return {"blob": "x" * 5_000_000}

        def odd_values(text: str):
            return {"set": {1, 2}, "object": object(), "bytes": b"\x00\xff", 3: "int key"}

        string = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
        return [Tool(ToolSpec(fn.__name__, f"The {fn.__name__} tool.", string), fn)
                for fn in (echo, explode, exit_process, hang, flood, odd_values)]


@pytest.fixture
def hostile():
    h = Hostile()
    yield h
    h.release.set()


def by_name(hostile: Hostile) -> dict[str, Tool]:
    return {t.name: t for t in hostile.tools()}


# -- hostile tools, one Primitive execution each ----------------------------------------------

def test_a_raising_tool_is_a_runtime_error(hostile):
    envelope = execute(by_name(hostile)["explode"], {"text": "x"})
    assert envelope.status == "FAILURE" and envelope.failure_type == RUNTIME_ERROR
    assert "ValueError: cannot handle 'x'" in envelope.details


def test_a_tool_calling_sys_exit_is_a_runtime_error(hostile):
    envelope = execute(by_name(hostile)["exit_process"], {"text": "x"})
    assert envelope.failure_type == RUNTIME_ERROR and "SystemExit" in envelope.details


def test_a_megabyte_result_is_bounded(hostile):
    envelope = execute(by_name(hostile)["flood"], {"text": "x"})
    assert envelope.ok
    assert len(json.dumps(envelope.to_dict())) < MAX_RESULT_CHARS + 2_000
    assert "result cut: 5,000,012 characters" in envelope.result


def test_values_json_cannot_encode_are_recorded(hostile, tmp_path):
    envelope = execute(by_name(hostile)["odd_values"], {"text": "x"})
    assert envelope.ok
    json.dumps(envelope.to_dict())  # plain JSON now
    assert envelope.result["set"] == "{1, 2}" and envelope.result["3"] == "int key"
    with TraceWriter(tmp_path / "t.jsonl", fsync=False) as writer:
        writer.write({"kind": "event", "version": 1, "envelope": envelope.to_dict()})


def test_a_cyclic_or_absurdly_nested_result_is_a_runtime_error():
    def cyclic(text: str):
        value: list = []
        value.append(value)
        return value

    def nested(text: str):
        value: object = "leaf"
        for _ in range(5_000):
            value = [value]
        return value

    schema = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
    for fn in (cyclic, nested):
        envelope = execute(Tool(ToolSpec(fn.__name__, "", schema), fn), {"text": "x"})
        assert envelope.failure_type == RUNTIME_ERROR and "cannot be represented as JSON" in envelope.details


def test_a_hanging_tool_times_out_and_taints_the_episode(hostile):
    tools = by_name(hostile)
    with contained_tool_calls() as containment:
        envelope = execute(tools["hang"], {"text": "x"}, timeout_s=0.2)
        # the envelope came back while "hang" still waits for its release (no wall-clock bound)
        assert hostile.state["writes"] == 0 and not hostile.release.is_set()
        assert envelope.failure_type == RUNTIME_ERROR and "timed out after 0.2s" in envelope.details
        assert containment.abandoned and "hang" in containment.abandoned
        # the abandoned call may still change the state: no later call runs on it
        later = execute(tools["echo"], {"text": "y"})
        assert later.failure_type == RUNTIME_ERROR and later.details.startswith("not run: hang timed out")
    assert execute(tools["echo"], {"text": "y"}).ok  # another episode is unaffected


# -- through the loop ---------------------------------------------------------------------------

class ToyEnvironment(CatalogEnvironment):
    """Just enough of :class:`heart.environments.base.Environment` for run_episode."""

    name = "toy"

    def __init__(self, hostile: Hostile, checker=None):
        self.hostile = hostile
        self.checker = checker or (lambda: EpisodeScore(1.0, True, {}))

    def task_ids(self, split: str | None = None) -> list[str]:
        return []  # no split to learn companion tools from

    def load_task(self, task_id: str) -> Task:
        return Task(task_id, "toy", ["Use the tools."])

    def catalog(self):
        return [tool.spec for tool in self.hostile.tools()]

    def start(self, task: Task):
        environment = self

        class Session(LoggedSession):
            def __init__(self):
                self.task = task
                self.tools = environment.hostile.tools()

            def start_turn(self, turn):
                pass

            def clarify(self, question):
                return "no more to say"

            def finish_turn(self, turn, response):
                pass

            def score(self):
                return environment.checker()

        return Session()


def episode(environment, script, tmp_path, monkeypatch, **kw):
    import heart.episode as episode_module

    # the hashing embedder: no model load for a toy ToolFace
    monkeypatch.setattr(episode_module, "session_toolface",
                        lambda environment, session, cache_dir=None: ToolFace(
                            session.tools, cache_dir=tmp_path / "cache", embedder=HashingEmbedder()))
    trace_path = tmp_path / "trace.jsonl"
    with TraceWriter(trace_path, fsync=False) as trace:
        result = run_episode(environment, environment.load_task("t0"), ScriptedBackend(script),
                             trace=trace, **kw)
    return result.record, list(read_trace(trace_path))


def test_the_loop_goes_on_after_each_hostile_tool(hostile, tmp_path, monkeypatch):
    steps = [("explode", "a"), ("exit_process", "b"), ("odd_values", "c"), ("flood", "d")]
    script = Script(
        planner=[plan((t, o)) for t, o in steps],
        router=[dispatch((t, {"text": o})) for t, o in steps],
        primitive=[echo_bindings],
        verifier=[fail("try another tool")] * 3 + [PASS],
    )
    from heart.loop import LoopConfig

    record, rows = episode(ToyEnvironment(hostile), script, tmp_path, monkeypatch,
                           config=LoopConfig(replan_budget=3))
    envelopes = [r["extra"]["envelope"] for r in rows if r.get("role") == "primitive"]
    assert [e["status"] for e in envelopes] == ["FAILURE", "FAILURE", "SUCCESS", "SUCCESS"]
    assert [e.get("failure_type") for e in envelopes[:2]] == [RUNTIME_ERROR, RUNTIME_ERROR]
    assert not record.errored and record.success
    assert max(len(json.dumps(r)) for r in rows) < MAX_RESULT_CHARS * 3  # the trace stays bounded


def test_a_backend_exception_errors_the_episode(hostile, tmp_path, monkeypatch):
    def broken(role, messages):
        raise MemoryError("CUDA out of memory")

    record, rows = episode(ToyEnvironment(hostile), broken, tmp_path, monkeypatch)
    assert record.errored and "out of memory" in record.error and record.score == 0.0
    assert rows[0]["errored"] is True and rows[0]["role"] == "planner"
    assert rows[-1]["kind"] == "episode" and rows[-1]["errored"] is True


def test_a_checker_exception_errors_the_episode(hostile, tmp_path, monkeypatch):
    def crash():
        raise KeyError("checker state")

    script = Script(planner=[plan(("echo", "say"))], router=[dispatch(("echo", {"text": "hi"}))],
                    primitive=[echo_bindings], verifier=[PASS])
    record, _ = episode(ToyEnvironment(hostile, crash), script, tmp_path, monkeypatch)
    assert record.errored and record.error.startswith("checker: KeyError")
    assert record.verdicts == ["PASS"]  # the loop's own result is still on record


def test_a_timed_out_tool_errors_the_episode(hostile, tmp_path, monkeypatch):
    hang = dispatch(("hang", {"text": "x"}))
    hang["dispatch"][0]["h_params"]["timeout_s"] = 1
    script = Script(planner=[plan(("hang", "wait"))], router=[hang], primitive=[echo_bindings], verifier=[PASS])
    record, _ = episode(ToyEnvironment(hostile), script, tmp_path, monkeypatch)
    assert record.errored and record.error.startswith("tool: hang timed out")


def test_heart_run_exits_non_zero_when_every_episode_errored(monkeypatch, capsys):
    import heart_distill.cli as cli

    class Broken:
        name = "broken"

        def generate(self, role, messages, sampling=None):
            raise ConnectionError("server went away")

    monkeypatch.setattr(cli, "_backend", lambda args, task=None, environment=None: Broken())
    code = cli.main(["run", "--env", "bfcl", "--task", "multi_turn_base_0", "--model", "tiny-qwen3"])
    out = capsys.readouterr()
    assert code == 1
    assert "errored: 1 episode(s)" in out.out and "server went away" in out.out
    assert "every episode errored" in out.err


def test_collect_counts_errored_episodes_apart_and_resume_reruns_them(tmp_path, monkeypatch, capsys):
    import argparse

    import heart_distill.data.collect as collect_module

    out = tmp_path / "run"
    parser = argparse.ArgumentParser()
    collect_module.add_arguments(parser)
    argv = ["--env", "bfcl", "--limit", "2", "--concurrency", "1", "--out", str(out)]
    real = collect_module.run_episode
    calls = {"n": 0}

    def checker_crashes_once(environment, task, backend, **kw):
        calls["n"] += 1
        if calls["n"] == 1:
            original_start = environment.start

            def start(t):
                session = original_start(t)
                session.score = lambda: (_ for _ in ()).throw(RuntimeError("checker crashed"))
                return session

            monkeypatch.setattr(environment, "start", start)
            try:
                return real(environment, task, backend, **kw)
            finally:
                monkeypatch.setattr(environment, "start", original_start)
        return real(environment, task, backend, **kw)

    monkeypatch.setattr(collect_module, "run_episode", checker_crashes_once)
    assert collect_module.collect(parser.parse_args(argv)) == 1
    err = capsys.readouterr().err
    assert "1/1 episodes valid" in err and "1 episodes errored" in err
    assert collect_module.collect(parser.parse_args([*argv, "--resume"])) == 0
    assert "1 already done, 1 to run" in capsys.readouterr().err
