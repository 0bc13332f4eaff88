"""OpenAIBackend against a real HTTP server on 127.0.0.1 speaking the chat completions API."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from heart.runtime.base import GenerationRequest, SamplingConfig
from heart.runtime.openai_compat import (
    OpenAIBackend,
    OpenAIBackendError,
    TeacherSpec,
    parse_teacher_spec,
)


class FakeChatServer:
    """A chat completions server whose behaviour per model name is scripted by the test.

    ``script[model]`` is a list of actions consumed one per request for that model:
    ``("status", code)`` answers with an error body, ``("sleep", seconds)`` stalls before
    answering normally; when the list is empty the request is answered normally: the reply
    content is ``"<model>|<last user message>"``.
    """

    def __init__(self) -> None:
        self.script: dict[str, list[tuple[str, float]]] = {}
        self.seen: list[dict] = []
        self.lock = threading.Lock()
        self.in_flight = 0
        self.max_in_flight = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # keep pytest output clean
                pass

            def do_POST(self) -> None:
                if self.path != "/v1/chat/completions":
                    self._send(404, {"error": {"message": f"no route {self.path}"}})
                    return
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server.lock:
                    server.seen.append(body)
                    queue = server.script.get(body["model"], [])
                    action = queue.pop(0) if queue else ("ok", 0)
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                self.counted = True
                try:
                    kind, value = action
                    if kind == "status":
                        code = int(value)
                        headers = {"Retry-After": "0"} if code == 429 else {}
                        self._send(code, {"error": {"message": f"scripted {code}",
                                                    "type": "Scripted", "code": code}}, headers)
                        return
                    if kind == "sleep":
                        time.sleep(value)
                    user = [m["content"] for m in body["messages"] if m["role"] == "user"][-1]
                    if user.startswith("delay:"):
                        time.sleep(float(user.split(":")[1]))
                    content = f"{body['model']}|{user}"
                    prompt_tokens = sum(len(m["content"].split()) for m in body["messages"])
                    alternatives = [{"token": t, "logprob": lp, "bytes": None}
                                    for t, lp in ((" true", -0.2), ("true", -2.5), ("}", -3.0))]
                    logprobs = {"content": [{"token": " true", "logprob": -0.2, "bytes": None,
                                             "top_logprobs": alternatives[:body.get("top_logprobs", 0)]}]} \
                        if body.get("logprobs") else None
                    self._send(200, {
                        "id": f"chatcmpl-{len(server.seen)}",
                        "object": "chat.completion",
                        "created": int(time.time()),
                        "model": body["model"],
                        "choices": [{
                            "index": 0,
                            "message": {"role": "assistant", "content": content},
                            "finish_reason": "stop",
                            "logprobs": logprobs,
                        }],
                        "usage": {
                            "prompt_tokens": prompt_tokens,
                            "completion_tokens": 3,
                            "total_tokens": prompt_tokens + 3,
                        },
                    })
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout test)
                finally:
                    self._leave()

            def _leave(self) -> None:
                """The request stops counting as in flight, once: before its answer is written,
                so a client that sends its next request on reading it is never counted twice."""
                if getattr(self, "counted", False):
                    self.counted = False
                    with server.lock:
                        server.in_flight -= 1

            def _send(self, code: int, payload: dict, headers: dict | None = None) -> None:
                self._leave()
                data = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True)
        self.thread.start()

    def requests_for(self, model: str) -> int:
        return sum(1 for body in self.seen if body["model"] == model)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server(monkeypatch):
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    srv = FakeChatServer()
    yield srv
    srv.close()


def messages(user: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": "You are a role."}, {"role": "user", "content": user}]


def backend(server: FakeChatServer, model, **kw) -> OpenAIBackend:
    kw.setdefault("backoff_s", 0.01)
    kw.setdefault("timeout_s", 5.0)
    return OpenAIBackend(server.url, model, **kw)


def test_per_role_model_names_reach_the_server(server):
    b = backend(server, {"planner": "planner", "router": "router", "default": "base"})
    assert b.generate("planner", messages("hi")).text == "planner|hi"
    assert b.generate("router", messages("hi")).text == "router|hi"
    out = b.generate("verifier", messages("hi"))
    assert out.text == "base|hi"
    assert out.adapter == "base"
    assert [body["model"] for body in server.seen] == ["planner", "router", "base"]
    assert b.name == f"openai:{server.url}#default=base,planner=planner,router=router"


def test_role_sentinel_means_model_name_is_role(server):
    b = backend(server, "role")
    assert b.generate("verifier", messages("x")).text == "verifier|x"
    single = backend(server, "Qwen/Qwen3-8B")
    out = single.generate("verifier", messages("x"))
    assert out.text == "Qwen/Qwen3-8B|x" and out.adapter is None


def test_sampling_reaches_the_server(server):
    b = backend(server, "m")
    b.generate("planner", messages("a"), SamplingConfig(max_new_tokens=17, temperature=0.7,
                                                         top_p=0.9, seed=3))
    body = server.seen[-1]
    assert (body["max_tokens"], body["temperature"], body["top_p"], body["seed"]) == (17, 0.7, 0.9, 3)


def test_prefill_asks_the_server_to_continue_the_final_assistant_message(server):
    b = backend(server, "m")
    b.generate("planner", messages("a") + [{"role": "assistant", "content": '{"status": "'}])
    body = server.seen[-1]
    assert body["messages"][-1] == {"role": "assistant", "content": '{"status": "'}
    assert body["continue_final_message"] is True and body["add_generation_prompt"] is False
    b.generate("planner", messages("a"))
    assert "continue_final_message" not in server.seen[-1]


def test_first_token_logprobs_come_from_the_servers_top_alternatives(server):
    b = backend(server, "m")
    tokens = (" true", "true", " false", "false")
    out = b.generate("primitive", messages("a"), SamplingConfig(first_token_logprobs=tokens))
    assert (server.seen[-1]["logprobs"], server.seen[-1]["top_logprobs"]) == (True, 20)
    assert out.meta["first_token_logprobs"] == {" true": -0.2, "true": -2.5}  # " false" was not in the top
    plain = b.generate("primitive", messages("a"))
    assert "logprobs" not in server.seen[-1] and plain.meta == {}


def test_guided_json_becomes_a_json_schema_response_format(server):
    b = backend(server, "m")
    schema = {"type": "object", "properties": {"verdict": {"enum": ["PASS", "FAIL"]}}}
    b.generate("verifier", messages("a"), SamplingConfig(guided_json=json.dumps(schema)))
    assert server.seen[-1]["response_format"] == {"type": "json_schema",
                                                  "json_schema": {"name": "verifier", "schema": schema}}


def test_usage_accounting_per_role(server):
    b = backend(server, "role")
    g1 = b.generate("planner", messages("one two three"))  # 3 system + 3 user words
    b.generate("planner", messages("four"))
    b.generate("router", messages("five"))
    assert (g1.prompt_tokens, g1.completion_tokens) == (7, 3)
    assert g1.latency_s > 0
    usage = b.usage_by_role()
    assert usage["planner"]["requests"] == 2
    assert usage["planner"]["prompt_tokens"] == 7 + 5
    assert usage["planner"]["completion_tokens"] == 6
    assert usage["router"]["requests"] == 1 and usage["router"]["retries"] == 0


def test_503_twice_then_success(server):
    server.script["m"] = [("status", 503), ("status", 503)]
    b = backend(server, "m")
    assert b.generate("planner", messages("hi")).text == "m|hi"
    assert server.requests_for("m") == 3
    assert b.usage_by_role()["planner"]["retries"] == 2


def test_429_is_retried_with_backoff(server):
    server.script["m"] = [("status", 429)]
    b = backend(server, "m", backoff_s=0.05)
    start = time.perf_counter()
    assert b.generate("planner", messages("hi")).text == "m|hi"
    # jitter keeps the first wait within [0.5, 1.5) x backoff_s
    assert time.perf_counter() - start >= 0.025
    assert server.requests_for("m") == 2


def test_400_fails_at_once_with_the_server_message(server):
    server.script["m"] = [("status", 400)]
    b = backend(server, "m", max_retries=4)
    with pytest.raises(OpenAIBackendError, match=r"HTTP 400: scripted 400") as info:
        b.generate("planner", messages("hi"))
    assert info.value.status == 400 and info.value.attempts == 1
    assert server.requests_for("m") == 1
    assert b.usage_by_role()["planner"]["failures"] == 1


def test_5xx_until_retries_run_out(server):
    server.script["m"] = [("status", 500)] * 3
    b = backend(server, "m", max_retries=2)
    with pytest.raises(OpenAIBackendError, match=r"failed after 3 attempt\(s\): HTTP 500"):
        b.generate("planner", messages("hi"))
    assert server.requests_for("m") == 3


def test_timeout_is_retried_then_named(server):
    server.script["m"] = [("sleep", 1.0), ("sleep", 1.0)]
    b = backend(server, "m", timeout_s=0.2, max_retries=1)
    with pytest.raises(OpenAIBackendError, match=r"timed out after 0.2 s") as info:
        b.generate("planner", messages("hi"))
    assert info.value.attempts == 2 and info.value.status is None
    assert server.requests_for("m") == 2


def test_connection_refused_is_an_error_after_retries():
    import socket

    with socket.socket() as s:  # a port that nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    b = OpenAIBackend(f"http://127.0.0.1:{port}", "m", max_retries=1, backoff_s=0.01, timeout_s=2)
    assert b.base_url.endswith("/v1")
    with pytest.raises(OpenAIBackendError, match="connection error"):
        b.generate("planner", messages("hi"))


def test_batch_is_concurrent_and_keeps_order(server):
    b = backend(server, "role", max_concurrency=4)
    # later requests answer sooner: order must come from the request list, not completion
    delays = [0.3, 0.2, 0.1, 0.0, 0.3, 0.2, 0.1, 0.0]
    reqs = [GenerationRequest(role="router", messages=messages(f"delay:{d}:{i}"))
            for i, d in enumerate(delays)]
    out = b.generate_batch(reqs)
    assert [g.text for g in out] == [f"router|delay:{d}:{i}" for i, d in enumerate(delays)]
    assert 1 < server.max_in_flight <= 4
    assert b.usage_by_role()["router"]["requests"] == 8


def test_parse_teacher_spec():
    assert parse_teacher_spec("gold") == TeacherSpec("gold")
    assert parse_teacher_spec("hf:smollm2-135m") == TeacherSpec("hf", model="smollm2-135m")
    assert parse_teacher_spec("openai:http://h:8000/v1#Qwen/Qwen3-8B") == TeacherSpec(
        "openai", url="http://h:8000/v1", model="Qwen/Qwen3-8B")
    assert parse_teacher_spec("openai:http://h:8000#role") == TeacherSpec(
        "openai", url="http://h:8000/v1", model="role")
    assert parse_teacher_spec("openai:https://h/v1#planner=p,default=b").model == {
        "planner": "p", "default": "b"}
    for bad in ("", "openai:http://h/v1", "openai:#m", "hf:", "vllm:x", "openai:h/v1#m",
                "openai:http://h/v1#planner="):
        with pytest.raises(ValueError):
            parse_teacher_spec(bad)
    counts = Counter(parse_teacher_spec(s).kind for s in ("gold", "hf:x", "openai:http://a#b"))
    assert counts == {"gold": 1, "hf": 1, "openai": 1}
