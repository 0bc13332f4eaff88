"""A scripted backend: each role call answered by a Python function (unit tests, hand-written
scenarios). The gold teacher, which answers from a task's gold calls, is data generation:
:mod:`heart_distill.data.gold_teacher`."""

from __future__ import annotations

import time
from typing import Callable, Sequence

from heart.runtime.base import Generation, GenerationRequest, Message, SamplingConfig

Responder = Callable[[str, list[Message]], str]


class ScriptedBackend:
    """Answers each role call with ``responder(role, messages)``.

    Token counts are whitespace word counts: good enough for logic tests, and honest about
    being an approximation (no tokenizer is involved).
    """

    def __init__(self, responder: Responder, name: str = "scripted"):
        self.responder = responder
        self.name = name

    def generate(
        self, role: str, messages: list[Message], sampling: SamplingConfig | None = None
    ) -> Generation:
        start = time.perf_counter()
        text = self.responder(role, messages)
        return Generation(
            text=text,
            backend=self.name,
            prompt_tokens=sum(len(m["content"].split()) for m in messages),
            completion_tokens=len(text.split()),
            latency_s=time.perf_counter() - start,
        )

    def generate_batch(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        return [self.generate(r.role, r.messages, r.sampling) for r in requests]
