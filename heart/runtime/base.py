"""The backend protocol: text in chat messages out, per role."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence, runtime_checkable

Message = dict[str, str]


@dataclass(frozen=True)
class SamplingConfig:
    """How a backend decodes one answer."""

    max_new_tokens: int = 384
    """Upper bound on generated tokens for one role call."""
    temperature: float = 0.0
    """0 means greedy decoding (the default: role outputs are structured JSON)."""
    top_p: float = 1.0
    """Nucleus sampling mass, used only when temperature > 0."""
    seed: int | None = None
    """Sampling seed, used only when temperature > 0."""
    guided_json: str | None = None
    """A JSON Schema (serialised) the answer must match: constrained decoding where the
    backend supports it (xgrammar in-process, ``response_format`` on OpenAI-compatible
    servers such as vLLM); other backends ignore it."""
    first_token_logprobs: tuple[str, ...] = ()
    """Token texts (each one token of the model's vocabulary, e.g. ``(" true", " false")``)
    whose log-probabilities at the answer's first position the Generation's meta records as
    ``meta["first_token_logprobs"]`` ({text: log p}, from the model's own distribution,
    before any grammar mask): a yes/no judge's confidence without a second pass. The local
    engines (peft, llama.cpp) record every one; an OpenAI-compatible server (vLLM's
    included) those among its top 20 alternatives; the in-process vLLM engine leaves the
    key out."""


@dataclass(frozen=True)
class GenerationRequest:
    """One role call in a batch."""

    role: str
    messages: list[Message]
    sampling: SamplingConfig = field(default_factory=SamplingConfig)


@dataclass(frozen=True)
class Generation:
    """What a backend returns for one role call."""

    text: str
    """The raw completion, exactly as generated (parsing is the role's job)."""
    backend: str
    """Which backend answered, e.g. ``hf:/path/to/model`` or ``gold``."""
    adapter: str | None = None
    """The adapter that served the role, or None when the base model answered."""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0
    meta: dict = field(default_factory=dict)
    """Facts about the answer that are not text (e.g. a teacher's injected fault), copied
    into the trace event's ``extra``."""


@runtime_checkable
class Backend(Protocol):
    """Anything that can answer a role call.

    ``generate`` must never raise for a bad model output: the text is returned as is and
    the role's parser records the failure. It may raise for infrastructure errors (a server
    that is down after its retries), which the loop records as a failed role call.
    """

    name: str

    def generate(
        self, role: str, messages: list[Message], sampling: SamplingConfig | None = None
    ) -> Generation: ...

    def generate_batch(self, requests: Sequence[GenerationRequest]) -> list[Generation]: ...
