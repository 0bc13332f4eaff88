"""Batched role calls across concurrent episodes: one scheduler in front of one model.

Episodes run in threads and call ``generate(role, messages, sampling)`` as usual; the
:class:`BatchingBackend` queues each call and a single worker thread serves what is pending
as one mixed-adapter batch (peft ``adapter_names`` per row, a JSON-schema grammar per row).

Two ways to serve, chosen by what the wrapped backend offers:

* **continuous** (``decode_stream``, the in-process ``TransformersBackend``): calls join the
  running batch between decoding steps and leave it as soon as their answer is complete,
  so an episode's next call does not wait for other episodes' longer answers — vLLM /
  S-LoRA's iteration-level scheduling (:mod:`heart.runtime.continuous`);
* **whole batches** (``generate_batch``, any backend): while a batch decodes, new calls
  queue up and form the next one.

When to close a batch: at ``max_batch_size`` pending calls, when every registered client is
waiting (episodes register with ``with backend.client():``, so the scheduler knows nobody
else is about to call), or ``max_wait_s`` after the first pending call, whichever comes
first. A single episode works unchanged: its calls are batches of one.

    from heart.runtime.hf import TransformersBackend
    from heart.runtime.scheduler import BatchingBackend

    backend = BatchingBackend(TransformersBackend("smollm2-135m", adapters=...), max_batch_size=8)
    # threads: with backend.client(): run_episode(..., backend, ...)
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator, Sequence

from heart.runtime.base import Backend, Generation, GenerationRequest, Message, SamplingConfig


@dataclass
class SchedulerStats:
    """What the scheduler has done so far (read with :meth:`BatchingBackend.stats`)."""

    calls: int = 0
    """Role calls answered (or failed)."""
    batches: int = 0
    """``generate_batch`` calls made on the wrapped backend."""
    batch_sizes: dict[int, int] = field(default_factory=dict)
    """How many batches had each size."""

    @property
    def mean_batch_size(self) -> float:
        return self.calls / self.batches if self.batches else 0.0


class BatchingBackend:
    """A :class:`~heart.runtime.base.Backend` that batches concurrent callers' role calls.

    ``name`` is the wrapped backend's (traces and episode ids do not change when batching
    is switched on). An exception from the wrapped backend fails every call of that batch
    with the same error (the loop records it as an infrastructure failure of each call).
    """

    def __init__(self, inner: Backend, max_batch_size: int = 8, max_wait_s: float = 0.05):
        if max_batch_size < 1 or max_wait_s < 0:
            raise ValueError(f"need max_batch_size >= 1 and max_wait_s >= 0, got {max_batch_size}, {max_wait_s}")
        self.inner = inner
        self.name = inner.name
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_s
        self._pending: list[tuple[GenerationRequest, Future]] = []
        self._first_pending_at = 0.0
        self._clients = 0
        self._closed = False
        self._stats = SchedulerStats()
        self._cond = threading.Condition()
        self._worker = threading.Thread(target=self._serve, name="role-scheduler", daemon=True)
        self._worker.start()

    # -- the Backend protocol ------------------------------------------------------------

    def generate(self, role: str, messages: list[Message], sampling: SamplingConfig | None = None) -> Generation:
        return self._submit(GenerationRequest(role, messages, sampling or SamplingConfig())).result()

    def generate_batch(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        futures = [self._submit(r) for r in requests]
        return [f.result() for f in futures]

    # -- clients -------------------------------------------------------------------------

    @contextmanager
    def client(self) -> Iterator[None]:
        """Mark the calling episode as active: a batch closes as soon as all active clients wait."""
        with self._cond:
            self._clients += 1
        try:
            yield
        finally:
            with self._cond:
                self._clients -= 1
                self._cond.notify_all()

    def stats(self) -> SchedulerStats:
        with self._cond:
            return SchedulerStats(self._stats.calls, self._stats.batches, dict(self._stats.batch_sizes))

    def close(self) -> None:
        """Stop the worker once pending calls are served."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._worker.join()

    def __getattr__(self, name: str):
        # Facts about the model (base_model_id, tokenizer, roles_with_adapters...) are the
        # wrapped backend's. Only reached for names this class does not define.
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    # -- the worker ----------------------------------------------------------------------

    def _submit(self, request: GenerationRequest) -> Future:
        future: Future = Future()
        with self._cond:
            if self._closed:
                raise RuntimeError(f"{self.name}: the batching scheduler is closed")
            if not self._pending:
                self._first_pending_at = time.monotonic()
            self._pending.append((request, future))
            self._cond.notify_all()
        return future

    def _ready(self) -> bool:
        """Whether the pending calls should go now (called with the lock held)."""
        if not self._pending:
            return False
        if self._closed or len(self._pending) >= self.max_batch_size:
            return True
        # Every registered client is waiting on a call: nobody else is about to submit.
        if self._clients and len(self._pending) >= self._clients:
            return True
        return time.monotonic() - self._first_pending_at >= self.max_wait_s

    def _serve(self) -> None:
        stream = getattr(self.inner, "decode_stream", None)
        while True:
            with self._cond:
                while not self._ready():
                    if self._closed and not self._pending:
                        return
                    timeout = None
                    if self._pending:
                        timeout = max(0.0, self._first_pending_at + self.max_wait_s - time.monotonic())
                    self._cond.wait(timeout)
                if stream is not None and all(r.sampling.temperature == 0 for r, _ in self._pending):
                    batch = None  # the stream takes them (and whatever arrives while it decodes)
                else:
                    batch = self._pending[: self.max_batch_size]
                    self._pending = self._pending[self.max_batch_size :]
                # Calls left over from a full batch have waited already: they go next.
                self._first_pending_at = 0.0
            if batch is None:
                self._stream(stream)
            else:
                self._run(batch)

    def _stream(self, stream) -> None:
        """Continuous batching: the wrapped backend admits calls while it decodes others.

        Its ``decode_stream(take, done)`` asks for newly pending calls before every decoding
        step and answers each as soon as it is complete, so an episode's next role call joins
        the running batch instead of waiting for the batch's slowest answer.
        """
        in_flight: set[Future] = set()

        def take() -> list[tuple[GenerationRequest, Future]]:
            with self._cond:
                greedy = [(r, f) for r, f in self._pending if r.sampling.temperature == 0]
                self._pending = [(r, f) for r, f in self._pending if r.sampling.temperature != 0]
                if greedy:
                    self._stats.batches += 1
                    self._stats.batch_sizes[len(greedy)] = self._stats.batch_sizes.get(len(greedy), 0) + 1
            in_flight.update(f for _, f in greedy)
            return greedy

        def done(future: Future, generation: Generation) -> None:
            in_flight.discard(future)
            future.set_result(generation)
            with self._cond:
                self._stats.calls += 1

        try:
            stream(take, done)
        except BaseException as err:  # every call it had taken fails with the error; the worker lives on
            for future in in_flight:
                future.set_exception(err)
            with self._cond:
                self._stats.calls += len(in_flight)

    def _run(self, batch: list[tuple[GenerationRequest, Future]]) -> None:
        requests = [request for request, _ in batch]
        try:
            generations = self.inner.generate_batch(requests)
            if len(generations) != len(requests):
                raise RuntimeError(f"{self.inner.name} answered {len(generations)} of {len(requests)} calls")
        except BaseException as err:  # every caller of the batch gets the error; the worker lives on
            for _, future in batch:
                future.set_exception(err)
        else:
            for (_, future), generation in zip(batch, generations):
                future.set_result(generation)
        with self._cond:
            self._stats.calls += len(batch)
            self._stats.batches += 1
            self._stats.batch_sizes[len(batch)] = self._stats.batch_sizes.get(len(batch), 0) + 1
