"""A backend over any server that speaks the OpenAI chat completions API.

That covers a vLLM server (``vllm serve BASE --enable-lora --lora-modules planner=... ...``,
where the model name of a request picks the role's adapter), other OpenAI-compatible
servers, and hosted models used as teachers.

The ``openai`` client's own retries are switched off: this module retries connection
errors, timeouts, 429 and 5xx itself (exponential backoff with jitter) so that what is
retried, how often, and what the final error says are decided in one place. Any other 4xx
is a mistake in the request (wrong model name, prompt too long) and fails at once.

``parse_teacher_spec`` turns the CLI's teacher strings into a :class:`TeacherSpec`::

    gold                                  the gold-guided teacher
    openai:http://host:8000/v1#Qwen/Qwen3-8B   one model for every role
    openai:http://host:8000/v1#role       model name = role name (vLLM multi-LoRA)
    openai:http://host:8000/v1#planner=a,router=b,default=c   a per-role map
    hf:<model name or folder>             an in-process transformers model
"""

from __future__ import annotations

import os

import random
import threading
import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Sequence
from urllib.parse import urlsplit

from heart.runtime.base import Generation, GenerationRequest, Message, SamplingConfig

PER_ROLE = "role"
"""Model name meaning "the role's own name" (vLLM multi-LoRA: model ``planner`` = adapter)."""

MAX_BACKOFF_S = 30.0
"""Ceiling on one wait between retries, including a server's Retry-After."""


TOP_LOGPROBS = 20
"""Alternatives per position a request for log-probabilities asks for (the OpenAI API's
most): the tokens of ``SamplingConfig.first_token_logprobs`` the server ranks below them
are absent from the answer's meta, i.e. less likely than its 20th choice."""


def _first_token_logprobs(choice: Any, tokens: tuple[str, ...]) -> dict:
    """``{"first_token_logprobs": {token: log p}}`` for the requested tokens among the
    server's top alternatives at the first position ({} when none were requested or the
    server sent none)."""
    content = getattr(getattr(choice, "logprobs", None), "content", None)
    if not tokens or not content:
        return {}
    found = {alt.token: round(float(alt.logprob), 6) for alt in (content[0].top_logprobs or [])
             if alt.token in tokens}
    return {"first_token_logprobs": found}


class OpenAIBackendError(RuntimeError):
    """The server could not answer a role call (after retries, or a non-retryable 4xx)."""

    def __init__(self, message: str, status: int | None = None, attempts: int = 1):
        super().__init__(message)
        self.status = status
        """HTTP status of the last failed request, or None for connection errors/timeouts."""
        self.attempts = attempts
        """Requests sent for this call, retries included."""


@dataclass
class RoleUsage:
    """What one role has cost on this backend so far."""

    requests: int = 0
    """Role calls answered (a retried call counts once)."""
    retries: int = 0
    """Requests that failed and were sent again."""
    failures: int = 0
    """Role calls that raised after their retries."""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0
    """Wall time of answered calls, retries and backoff included."""


def _normalise_base_url(base_url: str) -> str:
    """``http://host:8000`` → ``http://host:8000/v1``: every compatible server serves /v1."""
    url = base_url.rstrip("/")
    if urlsplit(url).path in ("", "/"):
        url += "/v1"
    return url


class OpenAIBackend:
    """A :class:`~heart.runtime.base.Backend` over an OpenAI-compatible chat completions API.

    ``model`` is one model name for every role, :data:`PER_ROLE` (``"role"``: the model
    name is the role name, as with vLLM ``--lora-modules planner=...``), or a map from role
    to model name, where a ``"default"`` key serves roles the map does not name.

    Token counts come from the response's ``usage``; ``usage_by_role()`` sums them per
    role. Latency is the wall time of the call including retries, because that is what the
    loop waited.
    """

    def __init__(
        self,
        base_url: str,
        model: str | dict[str, str],
        api_key: str | None = None,
        timeout_s: float = 60.0,
        max_retries: int = 4,
        backoff_s: float = 0.5,
        max_concurrency: int = 8,
    ):
        import openai  # a heavy import; only users of this backend pay for it

        if isinstance(model, dict) and not model:
            raise ValueError("model map is empty: give at least one role or a 'default'")
        if max_retries < 0 or max_concurrency < 1 or timeout_s <= 0:
            raise ValueError(
                f"need max_retries >= 0, max_concurrency >= 1, timeout_s > 0; got "
                f"{max_retries}, {max_concurrency}, {timeout_s}"
            )
        self.base_url = _normalise_base_url(base_url)
        self.model = dict(model) if isinstance(model, dict) else model
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.max_concurrency = max_concurrency
        self.name = f"openai:{self.base_url}#{_model_label(self.model)}"
        self._openai = openai
        # a keyed server (vLLM --api-key, heart serve off loopback) reads OPENAI_API_KEY, as the SDK does
        self._client = openai.OpenAI(
            base_url=self.base_url, api_key=api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY",
            timeout=timeout_s, max_retries=0
        )
        self._usage: dict[str, RoleUsage] = {}
        self._lock = threading.Lock()
        self._rng = random.Random()

    # -- the Backend protocol ------------------------------------------------------------

    def generate(
        self, role: str, messages: list[Message], sampling: SamplingConfig | None = None
    ) -> Generation:
        sampling = sampling or SamplingConfig()
        model = self.model_for(role)
        kwargs: dict[str, Any] = {
            "model": model,
            "messages": messages,
            "max_tokens": sampling.max_new_tokens,
            "temperature": sampling.temperature,
        }
        if messages and messages[-1]["role"] == "assistant":
            # A prefilled answer: vLLM's chat API continues the final assistant message
            # when asked to (continue_final_message); the reply is the continuation.
            kwargs["extra_body"] = {"continue_final_message": True, "add_generation_prompt": False}
        if sampling.guided_json:
            # Structured outputs: the OpenAI API's json_schema response format, which vLLM
            # serves with its own guided decoding.
            kwargs["response_format"] = {"type": "json_schema", "json_schema": {
                "name": role, "schema": json.loads(sampling.guided_json)}}
        if sampling.first_token_logprobs:  # the server's top alternatives at each position
            kwargs["logprobs"], kwargs["top_logprobs"] = True, TOP_LOGPROBS
        if sampling.temperature > 0:
            kwargs["top_p"] = sampling.top_p
            if sampling.seed is not None:
                kwargs["seed"] = sampling.seed
        start = time.perf_counter()
        try:
            response, retries = self._create_with_retries(role, model, kwargs)
        except OpenAIBackendError as err:
            with self._lock:
                usage = self._usage.setdefault(role, RoleUsage())
                usage.failures += 1
                usage.retries += err.attempts - 1
            raise
        latency = time.perf_counter() - start
        if not response.choices:
            raise OpenAIBackendError(f"{self.name}: role {role!r} (model {model!r}): the "
                                     "response has no choices")
        # None when the server returned only tool calls or reasoning: an empty answer,
        # which the role's parser records as a failure.
        text = response.choices[0].message.content or ""
        prompt_tokens = response.usage.prompt_tokens if response.usage else 0
        completion_tokens = response.usage.completion_tokens if response.usage else 0
        with self._lock:
            usage = self._usage.setdefault(role, RoleUsage())
            usage.requests += 1
            usage.retries += retries
            usage.prompt_tokens += prompt_tokens
            usage.completion_tokens += completion_tokens
            usage.latency_s += latency
        return Generation(
            text=text,
            backend=self.name,
            adapter=_served_adapter(response, model, self.model),
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            latency_s=latency,
            meta=_first_token_logprobs(response.choices[0], sampling.first_token_logprobs),
        )

    def generate_batch(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        """Answer ``requests`` concurrently (at most ``max_concurrency`` in flight), in order.

        Raises the first (in request order) call's error if any call fails after retries.
        """
        if not requests:
            return []
        workers = min(self.max_concurrency, len(requests))
        if workers == 1:
            return [self.generate(r.role, r.messages, r.sampling) for r in requests]
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="openai-backend") as pool:
            return list(pool.map(lambda r: self.generate(r.role, r.messages, r.sampling), requests))

    # -- accounting ----------------------------------------------------------------------

    def usage_by_role(self) -> dict[str, dict[str, float]]:
        """Per role: requests, retries, failures, prompt/completion tokens, latency_s."""
        with self._lock:
            return {role: dict(vars(usage)) for role, usage in self._usage.items()}

    def model_for(self, role: str) -> str:
        """The model name a request for ``role`` is sent with."""
        if isinstance(self.model, dict):
            if role in self.model:
                return self.model[role]
            if "default" in self.model:
                return self.model["default"]
            raise KeyError(
                f"{self.name}: no model for role {role!r} (map has {sorted(self.model)}; "
                "add the role or a 'default')"
            )
        return role if self.model == PER_ROLE else self.model

    def close(self) -> None:
        self._client.close()

    # -- retries -------------------------------------------------------------------------

    def _create_with_retries(self, role: str, model: str, kwargs: dict[str, Any]) -> tuple[Any, int]:
        openai = self._openai
        attempts = self.max_retries + 1
        for attempt in range(attempts):
            retry_after: float | None = None
            try:
                return self._client.chat.completions.create(**kwargs), attempt
            except openai.APITimeoutError as err:  # before APIConnectionError: a subclass
                problem = f"timed out after {self.timeout_s:g} s"
                status, cause = None, err
            except openai.APIConnectionError as err:
                problem = f"connection error ({err.__cause__ or err})"
                status, cause = None, err
            except openai.APIStatusError as err:
                status, cause = err.status_code, err
                problem = f"HTTP {status}: {_server_message(err)}"
                if not (status == 429 or status >= 500):
                    raise OpenAIBackendError(
                        f"{self.name}: role {role!r} (model {model!r}) was refused with "
                        f"{problem}",
                        status=status,
                        attempts=attempt + 1,
                    ) from err
                retry_after = _retry_after_s(err)
            if attempt + 1 == attempts:
                raise OpenAIBackendError(
                    f"{self.name}: role {role!r} (model {model!r}) failed after {attempts} "
                    f"attempt(s): {problem}",
                    status=status,
                    attempts=attempts,
                ) from cause
            time.sleep(self._backoff(attempt, retry_after))
        raise AssertionError("unreachable")

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        # "Full jitter" around the exponential step: concurrent callers that failed
        # together do not come back together.
        with self._lock:
            jitter = 0.5 + self._rng.random()
        wait = self.backoff_s * (2**attempt) * jitter
        if retry_after is not None:
            wait = max(wait, retry_after)
        return min(wait, MAX_BACKOFF_S)


def _served_adapter(response: Any, model: str, configured: str | dict[str, str]) -> str | None:
    """The adapter that answered: as ``heart serve`` reports it, else inferred from the model name."""
    extra = response.model_extra or {}
    if "heart_adapter" in extra:  # heart serve says which adapter (None: the base) answered
        return extra["heart_adapter"]
    # With a per-role model the model name is the adapter (vLLM multi-LoRA); with one
    # model for every role nothing says an adapter served it.
    return model if configured == PER_ROLE or isinstance(configured, dict) else None


def _model_label(model: str | dict[str, str]) -> str:
    if isinstance(model, dict):
        return ",".join(f"{role}={name}" for role, name in sorted(model.items()))
    return model


def _server_message(err: Any) -> str:
    """The server's own words from an error response (OpenAI and vLLM shapes)."""
    body = err.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])
        if isinstance(inner, str):
            return inner
        return str(body)
    if body:
        return str(body)
    try:
        return err.response.text.strip() or err.message
    except Exception:  # a streamed or already-closed response has no text to give
        return err.message


def _retry_after_s(err: Any) -> float | None:
    try:
        value = err.response.headers.get("retry-after")
        return float(value) if value is not None else None
    except (ValueError, AttributeError):
        return None


# -- teacher specs ---------------------------------------------------------------------


@dataclass(frozen=True)
class TeacherSpec:
    """A teacher named on the command line; the CLI builds the backend from it."""

    kind: str
    """"gold", "openai" or "hf"."""
    url: str | None = None
    """The API root for "openai" (…/v1), else None."""
    model: str | dict[str, str] | None = None
    """"openai": a model name, "role" (= per-role names) or a role→name map; "hf": a model
    name or folder; "gold": None."""


def parse_teacher_spec(spec: str) -> TeacherSpec:
    """Parse ``gold``, ``openai:<url>#<model>`` or ``hf:<model>`` (see the module docstring)."""
    spec = spec.strip()
    forms = "expected 'gold', 'openai:<url>#<model>' (model may be 'role') or 'hf:<model>'"
    if spec == "gold":
        return TeacherSpec(kind="gold")
    if spec.startswith("hf:"):
        model = spec[len("hf:"):]
        if not model:
            raise ValueError(f"teacher {spec!r} names no model: {forms}")
        return TeacherSpec(kind="hf", model=model)
    if spec.startswith("openai:"):
        url, hash_, model = spec[len("openai:"):].partition("#")
        if not hash_ or not url or not model:
            raise ValueError(f"teacher {spec!r} needs a URL and a model: {forms}")
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"teacher {spec!r}: URL {url!r} must start with http:// or https://")
        if "=" in model:
            pairs = [item.partition("=") for item in model.split(",")]
            if any(not role or not sep or not name for role, sep, name in pairs):
                raise ValueError(
                    f"teacher {spec!r}: a model map is 'role=name,role=name[,default=name]'"
                )
            return TeacherSpec(kind="openai", url=_normalise_base_url(url),
                               model={role.strip(): name.strip() for role, _, name in pairs})
        return TeacherSpec(kind="openai", url=_normalise_base_url(url), model=model)
    raise ValueError(f"unknown teacher {spec!r}: {forms}")
