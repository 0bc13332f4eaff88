"""heart serve: OpenAI-compatible chat completions where the model name is the role.

With a scripted backend (logic only): answers and usage, the adapter named per call,
json_schema reaching the backend, 4xx with clear messages for bad requests, a bounded
concurrent load on 127.0.0.1 with no 5xx and no lost response, and the HEART loop driven
over HTTP by the OpenAI backend with the trace naming the adapter of every call.
"""

import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from heart.runtime.base import Generation, GenerationRequest, SamplingConfig  # noqa: E402
from heart.runtime.scheduler import BatchingBackend  # noqa: E402
from heart.serve import ServeConfig, build_app, token_counter  # noqa: E402

ADAPTERS = ["planner", "router", "primitive", "verifier"]


class EchoBackend:
    """Answers '<role>|<last message>' and remembers each call's sampling."""

    name = "echo"

    def __init__(self):
        self.calls: list[tuple[str, SamplingConfig]] = []

    def generate(self, role, messages, sampling=None):
        self.calls.append((role, sampling))
        text = f"{role}|{messages[-1]['content']}"
        return Generation(text=text, backend=self.name, adapter=role if role in ADAPTERS else None,
                          prompt_tokens=sum(len(m["content"].split()) for m in messages),
                          completion_tokens=len(text.split()))

    def generate_batch(self, requests):
        return [self.generate(r.role, r.messages, r.sampling) for r in requests]


@pytest.fixture
def served():
    backend = EchoBackend()
    app = build_app(backend, ADAPTERS, token_counter(backend), ServeConfig(max_prompt_tokens=50, max_new_tokens=100))
    return backend, TestClient(app)


def chat(client, **body):
    body.setdefault("messages", [{"role": "user", "content": "hello there"}])
    return client.post("/v1/chat/completions", json=body)


def test_model_name_selects_the_role_and_usage_is_reported(served):
    backend, client = served
    reply = chat(client, model="router", max_tokens=20).json()
    assert reply["choices"][0]["message"]["content"] == "router|hello there"
    assert reply["usage"] == {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4}
    assert reply["heart_adapter"] == "router" and reply["model"] == "router"
    assert chat(client, model="base").json()["heart_adapter"] is None
    assert [m["id"] for m in client.get("/v1/models").json()["data"]] == [*ADAPTERS, "base"]


def test_json_schema_response_format_reaches_the_backend(served):
    backend, client = served
    schema = {"type": "object", "properties": {"status": {"enum": ["PASS", "FAIL"]}}}
    chat(client, model="verifier", max_tokens=30, temperature=0.5, seed=3,
         response_format={"type": "json_schema", "json_schema": {"name": "v", "schema": schema}})
    role, sampling = backend.calls[-1]
    assert role == "verifier" and json.loads(sampling.guided_json) == schema
    assert (sampling.max_new_tokens, sampling.temperature, sampling.seed) == (30, 0.5, 3)


@pytest.mark.parametrize("body, status, words", [
    ({"model": "critic"}, 404, ["'critic' is not served", "planner"]),
    ({"model": "planner", "temperature": -1}, 400, ["temperature", "greater than or equal to 0"]),
    ({"model": "planner", "top_p": 0}, 400, ["top_p"]),
    ({"model": "planner", "max_tokens": 0}, 400, ["max_tokens"]),
    ({"model": "planner", "max_tokens": 1000}, 400, ["max_tokens=1000 exceeds", "100"]),
    ({"model": "planner", "n": 2}, 400, ["n"]),
    ({"model": "planner", "stream": True}, 400, ["stream"]),
    ({"model": "planner", "messages": [{"role": "user", "content": "word " * 60}]}, 400,
     ["prompt has 60 tokens", "limit is 50"]),
    ({"model": "planner", "messages": [{"role": "robot", "content": "x"}]}, 400, ["messages.0.role"]),
    ({"model": "planner", "messages": []}, 400, ["messages"]),
    ({"model": "planner", "response_format": {"type": "json_schema"}}, 400, ["json_schema"]),
])
def test_bad_requests_get_a_4xx_naming_what_is_wrong(served, body, status, words):
    _, client = served
    body.setdefault("messages", [{"role": "user", "content": "hi"}])
    reply = client.post("/v1/chat/completions", json=body)
    assert reply.status_code == status, reply.text
    message = reply.json()["error"]["message"]
    for word in words:
        assert word in message


def test_malformed_json_gets_400(served):
    _, client = served
    reply = client.post("/v1/chat/completions", content=b'{"model": "planner", "messages": [',
                        headers={"content-type": "application/json"})
    assert reply.status_code == 400 and "not valid JSON" in reply.json()["error"]["message"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def live_server():
    """A real uvicorn server on 127.0.0.1 over the batching scheduler; yields its /v1 URL."""
    import uvicorn

    inner = EchoBackend()
    backend = BatchingBackend(inner, max_batch_size=8, max_wait_s=0.01)
    app = build_app(backend, ADAPTERS, token_counter(inner))
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "server did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}/v1", backend
    server.should_exit = True
    thread.join(10)
    backend.close()


def test_bounded_concurrent_load_has_no_5xx_and_no_lost_response(live_server):
    import httpx

    url, backend = live_server
    n = 64

    def one(i):
        role = ADAPTERS[i % 4]
        reply = httpx.post(f"{url}/chat/completions", timeout=30, json={
            "model": role, "messages": [{"role": "user", "content": f"request {i}"}]})
        return reply.status_code, reply.json()["choices"][0]["message"]["content"]

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(one, range(n)))
    assert [status for status, _ in results] == [200] * n
    assert [text for _, text in results] == [f"{ADAPTERS[i % 4]}|request {i}" for i in range(n)]
    assert backend.stats().calls == n


def test_the_loop_runs_over_http_and_the_trace_names_each_adapter(live_server, tmp_path):
    """The gold teacher behind heart serve, the OpenAI backend in front: a real BFCL episode."""
    import uvicorn

    from heart_distill.data.gold_teacher import GoldTeacher
    from heart.environments import load_environment
    from heart.episode import run_episode
    from heart.runtime.openai_compat import OpenAIBackend
    from heart.traces import TraceWriter, read_trace

    env = load_environment("bfcl")
    task = env.load_task(env.task_ids("train")[0])

    class GoldWithAdapters(GoldTeacher):
        def generate(self, role, messages, sampling=None):
            generation = super().generate(role, messages, sampling)
            return Generation(**{**vars(generation), "adapter": role})

    backend = BatchingBackend(GoldWithAdapters(task, env.catalog()), max_wait_s=0.0)
    app = build_app(backend, ADAPTERS, token_counter(backend))
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    try:
        client = OpenAIBackend(f"http://127.0.0.1:{port}/v1", "role")
        with TraceWriter(tmp_path / "t.jsonl") as trace:
            result = run_episode(env, task, client, trace=trace)
        events = [r for r in read_trace(tmp_path / "t.jsonl") if r["kind"] == "event"]
    finally:
        server.should_exit = True
        thread.join(10)
        backend.close()
    assert result.record.success
    assert {e["role"] for e in events} == set(ADAPTERS)
    assert all(e["adapter"] == e["role"] for e in events)
    assert all(e["prompt_tokens"] > 0 for e in events)


# -- off loopback only with a key (heart.access) -----------------------------------------------

@pytest.mark.parametrize("command", [["serve"], ["mcp", "serve", "--transport", "http"]])
def test_a_non_loopback_host_without_a_key_is_refused_before_anything_loads(command, capsys, monkeypatch):
    from heart.access import API_KEY_ENV
    from heart_distill.cli import main

    monkeypatch.delenv(API_KEY_ENV, raising=False)
    assert main([*command, "--host", "0.0.0.0"]) != 0
    err = capsys.readouterr().err
    assert "--host 0.0.0.0" in err and "--api-key" in err and API_KEY_ENV in err


def test_with_a_key_a_request_without_it_gets_401_and_one_with_it_is_answered():
    from heart.access import RequireKey

    backend = EchoBackend()
    app = RequireKey(build_app(backend, ADAPTERS, token_counter(backend), ServeConfig()), "s3cret")
    client = TestClient(app)
    body = {"model": "router", "messages": [{"role": "user", "content": "hi"}]}
    missing = client.post("/v1/chat/completions", json=body)
    assert missing.status_code == 401 and missing.json()["error"]["code"] == "invalid_api_key"
    wrong = client.post("/v1/chat/completions", json=body, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    assert client.get("/v1/models").status_code == 401
    ok = client.post("/v1/chat/completions", json=body, headers={"Authorization": "Bearer s3cret"})
    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"] == "router|hi"
    assert not [c for c in backend.calls if c[0] != "router"]  # only the keyed request reached the model


def test_the_key_may_come_from_the_environment_and_loopback_needs_none(monkeypatch):
    from heart.access import API_KEY_ENV, api_key_for

    monkeypatch.delenv(API_KEY_ENV, raising=False)
    assert api_key_for("127.0.0.1", None, "heart serve") is None
    monkeypatch.setenv(API_KEY_ENV, "from-env")
    assert api_key_for("0.0.0.0", None, "heart serve") == "from-env"
    assert api_key_for("0.0.0.0", "given", "heart serve") == "given"
