"""BatchingBackend: concurrent callers' role calls are served as batches, answers go back to
their own caller, errors reach every caller of the failed batch, one caller works unchanged."""

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from heart.runtime.base import Generation, GenerationRequest, SamplingConfig
from heart.runtime.scheduler import BatchingBackend


class RecordingBackend:
    """Answers each request with its role and last message; records every batch it served."""

    name = "recording"

    def __init__(self, fail_on: str | None = None, delay_s: float = 0.0):
        self.batches: list[list[GenerationRequest]] = []
        self.fail_on = fail_on
        self.delay_s = delay_s
        self.lock = threading.Lock()

    def generate(self, role, messages, sampling=None):
        return self.generate_batch([GenerationRequest(role, messages, sampling or SamplingConfig())])[0]

    def generate_batch(self, requests):
        import time

        with self.lock:
            self.batches.append(list(requests))
        time.sleep(self.delay_s)
        if any(r.messages[-1]["content"] == self.fail_on for r in requests):
            raise RuntimeError("out of memory")
        return [Generation(text=f"{r.role}:{r.messages[-1]['content']}", backend=self.name, adapter=r.role)
                for r in requests]


def ask(backend, role, text):
    return backend.generate(role, [{"role": "user", "content": text}]).text


def test_a_single_caller_gets_its_answer_in_batches_of_one():
    inner = RecordingBackend()
    backend = BatchingBackend(inner, max_wait_s=0.0)
    with backend.client():
        assert ask(backend, "planner", "a") == "planner:a"
        assert ask(backend, "router", "b") == "router:b"
    assert backend.name == "recording"
    assert [len(b) for b in inner.batches] == [1, 1]
    backend.close()


def test_concurrent_clients_are_served_as_mixed_role_batches():
    inner = RecordingBackend(delay_s=0.01)
    backend = BatchingBackend(inner, max_batch_size=8, max_wait_s=5.0)
    roles = ["planner", "router", "primitive", "verifier"]
    everyone_registered = threading.Barrier(8)

    def episode(i):
        with backend.client():
            everyone_registered.wait()
            return [ask(backend, roles[(i + k) % 4], f"{i}-{k}") for k in range(3)]

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(episode, range(8)))
    for i, got in enumerate(answers):  # every answer went back to the caller that asked
        assert got == [f"{roles[(i + k) % 4]}:{i}-{k}" for k in range(3)]
    stats = backend.stats()
    assert stats.calls == 24
    # All 8 clients wait on each round, so (with a 5 s window that never expires) every
    # batch closes because everyone is waiting: 3 full batches.
    assert stats.batches == 3 and stats.batch_sizes == {8: 3}
    assert {r.role for r in inner.batches[0]} == set(roles)
    backend.close()


def test_batches_never_exceed_max_batch_size():
    inner = RecordingBackend(delay_s=0.01)
    backend = BatchingBackend(inner, max_batch_size=3, max_wait_s=0.01)
    with ThreadPoolExecutor(7) as pool:
        answers = list(pool.map(lambda i: ask(backend, "planner", str(i)), range(7)))
    assert answers == [f"planner:{i}" for i in range(7)]
    assert max(len(b) for b in inner.batches) <= 3
    assert backend.stats().calls == 7
    backend.close()


def test_an_error_reaches_every_caller_of_the_batch_and_the_worker_lives_on():
    inner = RecordingBackend(fail_on="boom")
    backend = BatchingBackend(inner, max_batch_size=2, max_wait_s=5.0)
    barrier = threading.Barrier(2)

    def call(text):
        with backend.client():
            barrier.wait()
            try:
                return ask(backend, "planner", text)
            except RuntimeError as err:
                return f"error: {err}"

    with ThreadPoolExecutor(2) as pool:
        got = sorted(pool.map(call, ["boom", "fine"]))
    assert got == ["error: out of memory", "error: out of memory"]
    with backend.client():  # the only client: its call goes at once, not after max_wait_s (5 s)
        assert ask(backend, "router", "after") == "router:after"  # the worker survived
    backend.close()


def test_generate_batch_passes_through_and_closed_scheduler_refuses():
    inner = RecordingBackend()
    backend = BatchingBackend(inner, max_batch_size=4, max_wait_s=0.0)
    requests = [GenerationRequest("verifier", [{"role": "user", "content": str(i)}]) for i in range(4)]
    assert [g.text for g in backend.generate_batch(requests)] == [f"verifier:{i}" for i in range(4)]
    backend.close()
    with pytest.raises(RuntimeError, match="closed"):
        ask(backend, "planner", "late")


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="max_batch_size"):
        BatchingBackend(RecordingBackend(), max_batch_size=0)
