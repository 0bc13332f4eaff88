"""Role calls: send messages to the backend, parse the answer, record a trace event.

This is the single place where a role meets a model, so every role call is traced the
same way and a malformed output becomes a recorded parse failure, never a crash.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from heart.roles.common import ParseResult
from heart.runtime.base import Backend, Generation, SamplingConfig
from heart.traces import TraceEvent, TraceWriter


class BackendError(RuntimeError):
    """The backend raised instead of answering (server down, out of memory, a bug): an
    infrastructure failure that ends the episode as *errored*, never the model's failure."""


@dataclass
class EpisodeContext:
    """Identifies the episode a role call belongs to (copied into each trace event)."""

    episode_id: str
    task_id: str
    env: str
    turn: int = 0


@dataclass
class RoleCall:
    role: str
    messages: list[dict[str, str]]
    generation: Generation
    result: ParseResult
    event: TraceEvent
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.result.ok


class RoleClient:
    """Calls roles through one backend and writes one trace event per call."""

    def __init__(self, backend: Backend, context: EpisodeContext, trace: TraceWriter | None = None,
                 sampling: dict[str, SamplingConfig] | None = None):
        self.backend = backend
        self.context = context
        self.trace = trace
        self.sampling = sampling or {}

    def call(self, role: str, messages: list[dict[str, str]], parse: Callable[[str], ParseResult],
             attempt: int, step: int | None = None, record: bool = True, prefill: str = "",
             schema: dict[str, Any] | None = None) -> RoleCall:
        """Ask ``role``.

        With ``prefill`` the answer is started for the model (the backend continues a final
        assistant message); the trace keeps the messages without the prefill and the whole
        answer, so datasets see an ordinary conversation. With ``schema`` the backend
        constrains decoding to answers that match it, where it can.
        """
        start = time.perf_counter()
        sent = messages + [{"role": "assistant", "content": prefill}] if prefill else messages
        sampling = self.sampling.get(role) or SamplingConfig()
        if schema is not None:
            sampling = dataclasses.replace(sampling, guided_json=json.dumps(schema))
        backend_error: Exception | None = None
        try:
            generation = self.backend.generate(role, sent, sampling)
        except Exception as err:  # infrastructure failure: traced as errored, then ends the episode
            backend_error = err
            generation = Generation(text="", backend=getattr(self.backend, "name", "?"),
                                    latency_s=time.perf_counter() - start)
            result: ParseResult = ParseResult(None, f"backend error: {type(err).__name__}: {err}")
        else:
            if prefill and not generation.text.startswith(prefill):  # a continuation
                generation = dataclasses.replace(generation, text=prefill + generation.text)
            result = parse(generation.text)
        event = TraceEvent(
            episode_id=self.context.episode_id,
            task_id=self.context.task_id,
            env=self.context.env,
            turn=self.context.turn,
            attempt=attempt,
            step=step,
            role=role,
            backend=generation.backend,
            adapter=generation.adapter,
            messages=messages,
            raw_output=generation.text,
            parsed=result.value.model_dump(mode="json") if result.ok else None,
            parse_error=result.error,
            latency_s=round(generation.latency_s, 4),
            prompt_tokens=generation.prompt_tokens,
            completion_tokens=generation.completion_tokens,
            extra={**generation.meta, **({"prefill": prefill} if prefill else {}),
                   **({"constrained": True} if schema is not None else {})},
            errored=backend_error is not None,
        )
        call = RoleCall(role, messages, generation, result, event)
        if record or backend_error is not None:
            self.record(call)
        if backend_error is not None:
            raise BackendError(f"{role} call failed in the backend: {result.error[len('backend error: '):]}") \
                from backend_error
        return call

    def record(self, call: RoleCall, **extra: Any) -> None:
        call.event.extra.update(extra)
        if self.trace is not None:
            self.trace.write(call.event)
