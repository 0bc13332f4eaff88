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
from heart.runtime.base import Backend, Generation, GenerationRequest, SamplingConfig
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
        event = self._event(role, messages, generation, result, attempt, step, prefill, schema is not None,
                            backend_error is not None)
        call = RoleCall(role, messages, generation, result, event)
        if record or backend_error is not None:
            self.record(call)
        if backend_error is not None:
            raise BackendError(f"{role} call failed in the backend: {result.error[len('backend error: '):]}") \
                from backend_error
        return call

    def call_batch(self, role: str, calls: list[tuple[list[dict[str, str]], Callable[[str], ParseResult]]],
                   attempt: int, prefill: str = "", schema: dict[str, Any] | None = None,
                   max_new_tokens: int | None = None, extra: dict[str, Any] | None = None,
                   first_token_logprobs: tuple[str, ...] = ()) -> list[RoleCall]:
        """Ask ``role`` several independent questions in one batch (the backend's
        ``generate_batch``), each ``(messages, parse)``; every call is parsed and recorded as
        its own trace event, with ``extra`` (e.g. the mode) in it. ``max_new_tokens`` caps
        the role's sampling for these calls; ``first_token_logprobs`` asks for those tokens'
        log-probabilities at the answer's first position (``SamplingConfig``). A backend
        error fails the whole batch, as in :meth:`call`."""
        if not calls:
            return []
        start = time.perf_counter()
        sampling = self.sampling.get(role) or SamplingConfig()
        if schema is not None:
            sampling = dataclasses.replace(sampling, guided_json=json.dumps(schema))
        if max_new_tokens is not None:
            sampling = dataclasses.replace(sampling, max_new_tokens=min(sampling.max_new_tokens, max_new_tokens))
        if first_token_logprobs:
            sampling = dataclasses.replace(sampling, first_token_logprobs=tuple(first_token_logprobs))
        requests = [GenerationRequest(role, messages + [{"role": "assistant", "content": prefill}] if prefill else messages,
                                      sampling) for messages, _ in calls]
        try:
            generations = self.backend.generate_batch(requests)
        except Exception as err:  # infrastructure failure: traced as errored, then ends the episode
            generation = Generation(text="", backend=getattr(self.backend, "name", "?"),
                                    latency_s=time.perf_counter() - start)
            result: ParseResult = ParseResult(None, f"backend error: {type(err).__name__}: {err}")
            self.record(RoleCall(role, calls[0][0], generation, result,
                                 self._event(role, calls[0][0], generation, result, attempt, None, prefill,
                                             schema is not None, True)), **(extra or {}))
            raise BackendError(f"{role} batch failed in the backend: {type(err).__name__}: {err}") from err
        answered = []
        for (messages, parse), generation in zip(calls, generations):
            if prefill and not generation.text.startswith(prefill):  # a continuation
                generation = dataclasses.replace(generation, text=prefill + generation.text)
            result = parse(generation.text)
            call = RoleCall(role, messages, generation, result,
                            self._event(role, messages, generation, result, attempt, None, prefill,
                                        schema is not None, False))
            self.record(call, **(extra or {}))
            answered.append(call)
        return answered

    def _event(self, role: str, messages: list[dict[str, str]], generation: Generation, result: ParseResult,
               attempt: int, step: int | None, prefill: str, constrained: bool, errored: bool) -> TraceEvent:
        return TraceEvent(
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
                   **({"constrained": True} if constrained else {})},
            errored=errored,
        )

    def record(self, call: RoleCall, **extra: Any) -> None:
        call.event.extra.update(extra)
        if self.trace is not None:
            self.trace.write(call.event)
