"""What every local engine needs from the base's tokenizer: prompts, stop tokens, grammars.

The in-process engines (transformers + peft, llama.cpp) and the vLLM worker all decode from
the *same token ids*: the base's own chat template renders the messages, its tokenizer turns
them into ids, and greedy answers can then be compared token for token across engines
(``heart check parity``). Constrained decoding compiles each JSON schema once with xgrammar
against this tokenizer.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

from heart.roles.common import ANSWER_SEPARATORS
from heart.runtime.base import Generation, GenerationRequest, Message, SamplingConfig
from heart.runtime.json_grammar import compile_answer_grammar

BASE_ADAPTER = "__base__"
"""The adapter of a role that has none: the bare base answers it (peft's name for "no
adapter" in ``adapter_names``; llama.cpp's context without a LoRA). No role may use it."""


def first_token_logprobs(scores, ids: dict[int, str]) -> dict[str, float]:
    """{text: log p} of the token ids ``ids`` under one position's raw ``scores`` (NumPy or
    torch, over the vocabulary): a log-softmax evaluated at those ids only."""
    import numpy as np

    values = np.asarray(scores, dtype=np.float64)
    top = values.max()
    log_total = top + np.log(np.exp(values - top).sum())
    return {text: round(float(values[i] - log_total), 6) for i, text in ids.items()}


class ChatFormat:
    """The base's chat template, stop tokens and JSON-schema grammars (cached per schema)."""

    def __init__(self, tokenizer, vocab_size: int, generation_eos: int | list[int] | None = None,
                 enable_thinking: bool = False):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.enable_thinking = enable_thinking
        self.stop_token_ids = self._stop_token_ids(generation_eos)
        self._compiler = None
        self._grammars: dict[str, object] = {}
        self._system_ids: dict[str, list[int]] = {}
        self._single_token_ids: dict[tuple[str, ...], dict[int, str]] = {}

    @classmethod
    def from_pretrained(cls, path: str, enable_thinking: bool = False) -> "ChatFormat":
        """The tokenizer, vocabulary size and generation EOS of a transformers model folder."""
        from transformers import AutoConfig, AutoTokenizer, GenerationConfig

        tokenizer = AutoTokenizer.from_pretrained(path)
        try:
            eos = GenerationConfig.from_pretrained(path).eos_token_id
        except OSError:  # no generation_config.json
            eos = None
        return cls(tokenizer, AutoConfig.from_pretrained(path).vocab_size, eos, enable_thinking)

    def _stop_token_ids(self, generation_eos) -> list[int]:
        """EOS of the tokenizer and the generation config plus the template's end of turn."""
        ids: list[int] = []
        candidates = [self.tokenizer.eos_token_id, generation_eos, self.tokenizer.convert_tokens_to_ids("<|im_end|>")]
        for value in candidates:
            for token_id in value if isinstance(value, list) else [value]:
                if token_id is not None and token_id != self.tokenizer.unk_token_id and token_id not in ids:
                    ids.append(token_id)
        return ids

    def render(self, messages: list[Message]) -> str:
        """The exact prompt text a role call sends to the model."""
        # A final assistant message is a prefill: the model continues it (the Generation's
        # text is then the continuation only).
        prefilled = messages[-1]["role"] == "assistant"
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=not prefilled,
            continue_final_message=prefilled, enable_thinking=self.enable_thinking)

    def encode(self, messages: list[Message]) -> list[int]:
        """The prompt's token ids (the template already holds the special tokens)."""
        return self.tokenizer(self.render(messages), add_special_tokens=False)["input_ids"]

    def system_prefix_len(self, messages: list[Message], ids: list[int]) -> int:
        """How many leading prompt tokens are the rendered system message (0 when there is
        none, or when tokenising the whole prompt splits it differently)."""
        if not messages or messages[0]["role"] != "system":
            return 0
        system = messages[0]["content"]
        if system not in self._system_ids:
            text = self.tokenizer.apply_chat_template([messages[0]], tokenize=False,
                                                      enable_thinking=self.enable_thinking)
            self._system_ids[system] = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        prefix = self._system_ids[system]
        return len(prefix) if ids[:len(prefix)] == prefix else 0

    def single_token_ids(self, texts: Sequence[str]) -> dict[int, str]:
        """{token id: text} for texts that are each exactly one token (what
        :attr:`SamplingConfig.first_token_logprobs` scores); anything else is refused.
        Looked up once per tuple of texts: every row of a scored batch asks for the same."""
        key = tuple(texts)
        if key not in self._single_token_ids:
            self._single_token_ids[key] = self._encode_single_tokens(key)
        return self._single_token_ids[key]

    def _encode_single_tokens(self, texts: tuple[str, ...]) -> dict[int, str]:
        ids: dict[int, str] = {}
        for text in texts:
            encoded = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            if len(encoded) != 1:
                raise ValueError(f"first_token_logprobs: {text!r} is {len(encoded)} tokens of this model "
                                 f"({encoded}), not one")
            ids[encoded[0]] = text
        return ids

    def decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True)

    def grammar(self, schema: str):
        """The compiled xgrammar grammar for ``schema`` (cached), or an error string.

        A schema xgrammar cannot compile is reported in the Generation's meta and that row
        runs unconstrained.
        """
        import xgrammar as xgr

        if schema not in self._grammars:
            if self._compiler is None:
                info = xgr.TokenizerInfo.from_huggingface(self.tokenizer, vocab_size=self.vocab_size,
                                                          stop_token_ids=self.stop_token_ids)
                self._compiler = xgr.GrammarCompiler(info)
            try:
                # json.dumps' spacing (ANSWER_SEPARATORS) and no other whitespace, numbers
                # of bounded digits (json_grammar says why)
                self._grammars[schema] = compile_answer_grammar(self._compiler, schema, ANSWER_SEPARATORS)
            except Exception as err:  # an exotic tool schema: answer unconstrained, say so
                self._grammars[schema] = f"{type(err).__name__}: {err}"
        return self._grammars[schema]

    def matcher(self, schema: str | None) -> tuple[object | None, dict]:
        """(a fresh xgrammar matcher for ``schema`` or None, meta naming a schema that failed)."""
        if schema is None:
            return None, {}
        grammar = self.grammar(schema)
        if isinstance(grammar, str):
            return None, {"guided_json_error": grammar[:300]}
        import xgrammar as xgr

        return xgr.GrammarMatcher(grammar), {}


class AdapterEngine:
    """What every in-process engine (one base, one adapter per role) answers the same way.

    The engine sets ``name``, ``_model_id`` (the base as the caller named it),
    ``model_path`` (its local folder), ``adapters`` (role → folder) and ``chat``
    (:class:`ChatFormat`), and implements ``generate_batch``. Engines that decode
    continuously (rows join and leave the batch every step) also implement ``_row`` (a
    request as the engine's row: ``prompt_ids``, ``adapter``, ``tokens``, ``meta``,
    ``owner``) and ``_decode_rows``; :meth:`decode_stream` and :meth:`_decode_all` are then
    shared.
    """

    name: str
    _model_id: str
    model_path: str
    adapters: dict[str, str]
    chat: ChatFormat

    @property
    def base_model_id(self) -> str:
        """The base model as named by the caller: embedded name, folder or hub id."""
        return self._model_id

    @property
    def base_model_hash(self) -> str | None:
        """Content hash of the base weights (None for a hub id): adapters record it."""
        from heart.models import model_content_hash

        return model_content_hash(self.model_path)

    def roles_with_adapters(self) -> list[str]:
        return list(self.adapters)

    def render(self, messages: list[Message]) -> str:
        """The exact prompt text a role call sends to the model."""
        return self.chat.render(messages)

    def generate(self, role: str, messages: list[Message], sampling=None):
        return self.generate_batch([GenerationRequest(role, messages, sampling or SamplingConfig())])[0]

    def generate_batch(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        raise NotImplementedError

    # -- continuous decoding -------------------------------------------------------------

    def _adapter(self, role: str) -> str:
        """The adapter that answers ``role``: its own, else :data:`BASE_ADAPTER`."""
        return role if role in self.adapters else BASE_ADAPTER

    def _prompt(self, request: GenerationRequest) -> tuple[list[int], object | None, dict, str]:
        """(prompt ids, grammar matcher or None, meta, adapter) of a request: what every
        engine's row starts from."""
        ids = self.chat.encode(request.messages)
        matcher, meta = self.chat.matcher(request.sampling.guided_json)
        return ids, matcher, meta, self._adapter(request.role)

    def _row(self, request: GenerationRequest, owner: object = None) -> Any:
        """A request as the engine's row (``owner``: the caller's handle)."""
        raise NotImplementedError

    def _decode_rows(self, rows: list, poll: Callable[[], list] | None = None,
                     on_finish: Callable[[Any], None] | None = None) -> None:
        """Decode ``rows`` (and those ``poll`` returns before each step) to a stop token or
        their budget, telling ``on_finish`` about each row as soon as it leaves."""
        raise NotImplementedError

    def _stream_batch_size(self) -> int:
        """The ``batch_size`` a streamed answer's meta reports (1: not reported)."""
        return 1

    def _decode_all(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        """Every request decoded continuously; ``latency_s`` is until the request's row left."""
        start = time.perf_counter()
        rows = [self._row(request) for request in requests]
        left_at: dict[int, float] = {}  # a row's latency is until *it* left the batch
        self._decode_rows(rows, on_finish=lambda row: left_at.setdefault(id(row), time.perf_counter()))
        return [self._generation(row, left_at[id(row)] - start, len(rows)) for row in rows]

    def decode_stream(self, take, done) -> None:
        """Serve requests as they arrive, until none is waiting or decoding.

        ``take()`` returns newly arrived ``(request, handle)`` pairs (it must not block);
        ``done(handle, generation)`` is called as soon as a request's answer is complete, so
        its caller can send its next request while the others still decode
        (:class:`~heart.runtime.scheduler.BatchingBackend` drives this).
        """
        arrived: dict[int, float] = {}

        def poll() -> list:
            rows = []
            for request, handle in take():
                arrived[id(handle)] = time.perf_counter()
                rows.append(self._row(request, owner=handle))
            return rows

        def finish(row) -> None:
            latency = time.perf_counter() - arrived.pop(id(row.owner))
            done(row.owner, self._generation(row, latency, self._stream_batch_size()))

        self._decode_rows([], poll=poll, on_finish=finish)

    def _generation(self, row, latency: float, batch_size: int) -> Generation:
        """A decoded row as the Generation the caller gets."""
        return Generation(
            text=self.chat.decode(row.tokens),
            backend=self.name,
            adapter=None if row.adapter == BASE_ADAPTER else row.adapter,
            prompt_tokens=len(row.prompt_ids),
            completion_tokens=len(row.tokens),
            latency_s=latency,
            meta={**row.meta, "batch_size": batch_size} if batch_size > 1 else row.meta,
        )
