"""LlamaCppBackend: the role runtime on llama.cpp, the CPU engine the embedded GGUF was made for.

Why a second in-process engine: on a 2-core CPU, torch decodes SmolLM2-135M at 6.5 tokens/s
(batch 1, fp32), far below what the hardware allows; each step pays hundreds of small
operator calls besides reading the weights. llama.cpp's ggml kernels on the **same fp32
weights** decoded 27.6 tokens/s at batch 1 and 92 tokens/s at batch 8, and prefilled 341
tokens/s against torch's ~285, on a real 311-token Planner prompt (``bench/runtime.py``
compares the two side by side).

How it is laid out:

* **One base, one context per adapter.** The model is loaded once; llama.cpp attaches LoRA
  adapters to a *context* (``llama_set_adapters_lora``), not to a sequence, so each role
  with an adapter gets its own context (and the base one with none). A step that holds rows
  of several roles runs one ``llama_decode`` per role: peft's per-row ``adapter_names`` has
  no llama.cpp counterpart.
* **Continuous batching**, as in :mod:`heart.runtime.continuous`: each context has
  ``max_batch_size`` sequence slots; a row leaves the step it emits a stop token or reaches
  its budget, and waiting calls are prefilled together and join at the next step.
* **Rows in consecutive slots.** Without a unified cache llama.cpp decodes only sequences
  with consecutive ids in one micro-batch, so a step feeds its rows in slot order and a new
  row takes the free slot that keeps the busy ones consecutive, copying its prefix from
  whichever slot holds it (:meth:`RoleContext.claim`).
* **Prefix reuse for free.** A slot keeps the keys and values of its last call. A new call
  starts from the longest prefix of its prompt that any slot caches (at least the role's
  system prompt, often more; copied into its own slot when another holds it), and only the
  rest is prefilled; calls admitted together copy the longest prefix they share with one
  prefilled just before them.
* **Drafts from the context** (speculative decoding, :mod:`heart.runtime.lookup`). A greedy
  row whose last 3 tokens occurred before (in its prompt or its answer) feeds the tokens that
  followed them, up to ``DRAFT_TOKENS``, with its last token in the same call, and keeps the
  longest prefix its own masked argmax reproduces: the same answer in fewer calls. A call's
  cost grows with the tokens it feeds, and a draft beside other rows splits the call
  (``DRAFT_ROWS``), so a row drafts only when it decodes alone in its context: where calls
  come one at a time (the loop, ``heart serve``, the tail of an evaluation). Sampled rows do
  not draft.
* **Quiet.** llama.cpp's load and adapter logs go to a log file, its errors also to stderr
  (:mod:`heart.runtime.llamacpp_log`; ``HEART_VERBOSE=1``: all of it to the console).
* **Same inputs as every other engine.** Prompts are rendered and tokenised by the base's
  transformers tokenizer (:class:`~heart.runtime.chat.ChatFormat`) and fed as token ids; JSON
  schemas are enforced with xgrammar on the logits, exactly as in-process.

Weights (``weights``): ``f32`` (default) are exactly the weights transformers loads, so
greedy answers differ from peft's only through arithmetic order; ``f16``, ``q8_0`` and the
``shipped`` Q4_1 file decode faster and round more (:mod:`heart.runtime.gguf_files`).
``heart check parity --engines llamacpp`` and ``bench/runtime.py`` report the agreement. f16
is what the pipeline evaluates on (``--engine llamacpp:f16``): on its 128 held-out role calls
(16 per role, base and distilled) it answered 126 exactly as peft did, in 375 s against 491 s;
the two that differ are base Planner answers that ran to their 320-token budget, and every
primary metric was the same.

    backend = LlamaCppBackend("smollm2-135m", adapters={"planner": "runs/a/adapters/planner", ...})
    backend.generate("planner", messages)
"""

from __future__ import annotations

import ctypes
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from heart.models import DEFAULT_MODEL, resolve_model
from heart.runtime.adapters import MAX_SERVING_RANK, validate_role_adapters
from heart.runtime.base import Generation, GenerationRequest, SamplingConfig
from heart.runtime.chat import BASE_ADAPTER, AdapterEngine, ChatFormat, first_token_logprobs
from heart.runtime import llamacpp_log
from heart.runtime.llamacpp_threads import default_threads
from heart.runtime.continuous import DecodeStats
from heart.runtime.lookup import PromptLookup

BATCH_TOKENS = 512
"""Tokens per ``llama_decode`` call while prefilling (llama.cpp's n_batch = n_ubatch)."""
DRAFT_TOKENS = 4
"""Most tokens a greedy row drafts from its own context per decoding call (:mod:`heart.runtime.lookup`)."""
DRAFT_NGRAM = 3
"""A row drafts only after its last 3 tokens occurred before. On 16 held-out role calls one at
a time (f16), 63% of such 4-token drafts' tokens were kept, against 18% for 6-token drafts
after any repeated 1-3 tokens; a kept token must pay for the rejected ones (below)."""
DRAFT_ROWS = 1
"""Most rows a decoding call may hold for its rows to draft. A draft pays where the call's
weight pass dominates: one SmolLM2 row of 500 tokens (f16) decodes in 11.8 ms, 26.9 ms with a
4-token draft, and ~2.5 of the 4 are kept. With several rows it costs more than it saves:
llama.cpp takes the same number of tokens from every sequence into a micro-batch, so one
row's draft splits the call, and 4 rows took 56.9 ms with one row drafting against 26.3 ms
without (``bench/results/decode_context.json``)."""



@dataclass
class LlamaRow:
    """One request while it is being decoded."""

    prompt_ids: list[int]
    adapter: str
    sampling: SamplingConfig
    matcher: object | None = None
    owner: object = None
    meta: dict = field(default_factory=dict)
    tokens: list[int] = field(default_factory=list)
    slot: int = -1
    context: "RoleContext | None" = None
    rng: np.random.Generator | None = None
    error: str | None = None
    """Set when the row cannot run (a prompt longer than a slot): it answers empty at once."""
    lookup: PromptLookup | None = None
    """Prompt and answer so far, for drafts (greedy rows when speculation is on)."""
    scored: dict[int, str] = field(default_factory=dict)
    """Token ids whose log-probabilities at the first answer position go into ``meta``
    (``SamplingConfig.first_token_logprobs``)."""


class RoleContext:
    """A llama.cpp context with one adapter (or none) and ``slots`` sequence slots."""

    def __init__(self, model, lora, slots: int, slot_tokens: int, threads: int, contiguous: bool = True):
        import llama_cpp
        from llama_cpp import _internals

        params = llama_cpp.llama_context_default_params()
        params.n_seq_max = slots
        params.n_ctx = slots * slot_tokens
        params.n_batch = params.n_ubatch = BATCH_TOKENS
        params.n_threads = params.n_threads_batch = threads
        # One stream of slot_tokens cells per slot. In a unified cache every token attends
        # over the cells of *all* sequences (masked): measured, 32 rows of ~1,000 tokens
        # made each decoding step several times slower than separate streams.
        params.kv_unified = False
        params.no_perf = True
        self.ctx = _internals.LlamaContext(model=model, params=params, verbose=False)
        if lora is not None:
            adapters = (llama_cpp.llama_adapter_lora_p_ctypes * 1)(lora)
            if llama_cpp.llama_set_adapters_lora(self.ctx.ctx, adapters, 1, (ctypes.c_float * 1)(1.0)) != 0:
                raise RuntimeError("llama.cpp refused to attach the LoRA adapter to its context")
        self.batch = _internals.LlamaBatch(n_tokens=max(BATCH_TOKENS, slots), embd=0, n_seq_max=1, verbose=False)
        self.slot_tokens = slot_tokens
        self.cached: list[list[int]] = [[] for _ in range(slots)]
        """The tokens whose keys and values each slot holds."""
        self.busy = [False] * slots
        self.contiguous = contiguous
        """Whether :meth:`claim` keeps busy slots in runs of consecutive ids (see there)."""
        self.n_vocab = model.n_vocab()

    def claim(self, prompt: list[int]) -> tuple[int, int] | None:
        """(a free slot, how many leading prompt tokens it now holds), or None when all are busy.

        The slot is the free one that leaves the busy slots in the fewest runs of consecutive
        ids (with ``contiguous``; otherwise any), then the one whose cached tokens share the
        longest prefix with the prompt; when another slot (busy or not) shares a longer one,
        that prefix is copied over (:meth:`reuse`) instead of computed again.

        Why runs: without a unified cache, llama.cpp puts into one micro-batch only sequences
        whose ids follow each other (``split_equal(…, sequential=true)``), and each micro-batch
        reads all the weights. Eight rows in slots 0, 2, …, 14 decoded in 91.4 ms a step
        against 47.8 ms in slots 0-7 (f16, 500-token contexts; 11.8 ms for one row;
        ``bench/results/decode_context.json``). Choosing slots by cached prefix alone scatters
        rows as calls come and go, so each row of a step costs about what it costs alone.
        """
        free = [slot for slot, busy in enumerate(self.busy) if not busy]
        if not free:
            return None

        def preference(s: int) -> tuple[int, int, int]:
            runs = _runs([b or i == s for i, b in enumerate(self.busy)]) if self.contiguous else 0
            return -runs, _common_prefix(self.cached[s], prompt), -s

        slot = max(free, key=preference)
        self.reuse(slot, prompt, range(len(self.cached)))
        self.busy[slot] = True
        return slot, len(self.cached[slot])

    def reuse(self, slot: int, prompt: list[int], sources) -> None:
        """Make ``slot`` hold the longest prefix of ``prompt`` that it or any of ``sources`` holds
        (copied over when another slot's is longer), short of the prompt's last token: that one
        is always fed, its logits start the answer."""
        last = len(prompt) - 1
        common = {s: min(_common_prefix(self.cached[s], prompt), last) for s in dict.fromkeys([slot, *sources])}
        source = max(common, key=common.get)  # the first of the longest: the slot itself on a tie
        if common[source] > common[slot]:
            self.share(source, slot, common[source])
        else:
            self.truncate(slot, common[slot])

    def release(self, slot: int) -> None:
        """The slot's call is over; its cache stays for the next call to reuse."""
        self.busy[slot] = False

    def share(self, source: int, slot: int, length: int) -> None:
        """Make ``slot`` hold exactly ``source``'s first ``length`` tokens.

        Streams copy whole (llama.cpp copies a stream's buffers at the next decode, ~50 MB
        of memory traffic for SmolLM2's 2,048 cells, far cheaper than recomputing a
        300-token system prompt); the copy is then cut to ``length``.
        """
        import llama_cpp

        llama_cpp.llama_memory_seq_cp(self.ctx.memory, source, slot, -1, -1)
        llama_cpp.llama_memory_seq_rm(self.ctx.memory, slot, length, -1)
        self.cached[slot] = self.cached[source][:length]

    def truncate(self, slot: int, length: int) -> None:
        """Keep only the first ``length`` cached tokens of ``slot`` (a rejected draft's cells, a stale call's tail)."""
        import llama_cpp

        if length < len(self.cached[slot]):
            llama_cpp.llama_memory_seq_rm(self.ctx.memory, slot, length, -1)
            del self.cached[slot][length:]

    def decode(self, entries: list[tuple[int, int, bool]]) -> None:
        """One ``llama_decode`` of (token, slot, wants logits) entries, each at its slot's next position."""
        b = self.batch.batch
        b.n_tokens = len(entries)
        for i, (token, slot, logits) in enumerate(entries):
            b.token[i] = token
            b.pos[i] = len(self.cached[slot])
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = slot
            b.logits[i] = logits
            self.cached[slot].append(token)
        self.ctx.decode(self.batch)

    def logits(self, index: int) -> np.ndarray:
        """The logits of the ``index``-th entry of the last decode (a copy)."""
        return np.ctypeslib.as_array(self.ctx.get_logits_ith(index), shape=(self.n_vocab,)).copy()


class LlamaCppBackend(AdapterEngine):
    """Answers role calls with llama.cpp: one GGUF base, one GGUF LoRA per role.

    ``model`` is the embedded ``smollm2-135m`` (whose transformers folder provides the
    tokenizer and the adapters' base check) — other bases need their own GGUF and folder.
    ``adapters`` maps role → peft adapter folder (validated against the base before anything
    loads, then converted to GGUF once and cached). ``slot_tokens`` bounds one call's prompt
    plus answer; ``threads`` defaults to the CPUs this process may use. ``draft_tokens``: how
    many tokens a greedy row may draft from its own context each step (:mod:`heart.runtime.lookup`;
    0 decodes one token per step).
    """

    contiguous_slots = True
    """Whether rows take slots that keep each context's busy slots consecutive (:meth:`RoleContext.claim`);
    ``bench/e2e_throughput.py`` turns it off for the runner it compares against."""

    def __init__(self, model: str = DEFAULT_MODEL, adapters: dict[str, str] | None = None, weights: str = "f32",
                 max_batch_size: int = 8, slot_tokens: int = 2048, threads: int | None = None,
                 enable_thinking: bool = False, max_adapter_rank: int = MAX_SERVING_RANK,
                 draft_tokens: int = DRAFT_TOKENS):
        from heart.runtime.gguf_files import base_gguf, lora_ggufs

        self.adapters = {role: str(path) for role, path in (adapters or {}).items()}
        self._model_id = model
        self.model_path = resolve_model(model)
        validate_role_adapters(model, self.model_path, self.adapters, max_adapter_rank, reserved=BASE_ADAPTER)
        self.weights = weights
        self.name = f"llamacpp:{model}+{weights}"
        self.max_batch_size = max_batch_size
        self.slot_tokens = slot_tokens
        if draft_tokens < 0:
            raise ValueError(f"draft_tokens must be >= 0, got {draft_tokens}")
        self.draft_tokens = draft_tokens
        self.threads = threads or default_threads()
        self.chat = ChatFormat.from_pretrained(str(self.model_path), enable_thinking)
        self.tokenizer = self.chat.tokenizer
        self.stop_token_ids = self.chat.stop_token_ids
        gguf = base_gguf(model, weights)
        lora_files = lora_ggufs(self.adapters, self.model_path) if self.adapters else {}

        import llama_cpp
        from llama_cpp import _internals

        # llama.cpp's load and graph logs to the log file, errors also to stderr (HEART_VERBOSE=1:
        # all of it to the console, and llama-cpp-python leaves fds 1 and 2 alone while loading)
        llamacpp_log.route_llama_cpp()
        llama_cpp.llama_backend_init()
        self._model = _internals.LlamaModel(path_model=str(gguf), params=llama_cpp.llama_model_default_params(),
                                            verbose=llamacpp_log.verbose())
        if self._model.n_vocab() != self.chat.vocab_size:
            raise ValueError(f"{gguf} has {self._model.n_vocab()} tokens, the tokenizer of {self.model_path} "
                             f"{self.chat.vocab_size}: they are not the same model")
        self._loras = {}
        for role, path in lora_files.items():
            lora = llama_cpp.llama_adapter_lora_init(self._model.model, str(path).encode())
            if lora is None:
                raise RuntimeError(f"llama.cpp could not load the {role} adapter from {path}")
            self._loras[role] = lora
        self._contexts: dict[str, RoleContext] = {}
        self._bitmask = None  # xgrammar's int32 bitmask of one row, reused
        self.stats = DecodeStats()  # since the backend was made; a step is one context's decode call

    def generate_batch(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        """Every request decoded continuously; ``latency_s`` is until the request's row left
        (the scheduler's continuous path is the shared
        :meth:`~heart.runtime.chat.AdapterEngine.decode_stream`)."""
        return self._decode_all(requests)

    # -- rows ----------------------------------------------------------------------------

    def _row(self, request: GenerationRequest, owner: object = None) -> LlamaRow:
        ids, matcher, meta, adapter = self._prompt(request)
        row = LlamaRow(ids, adapter, request.sampling, matcher, owner, meta,
                       scored=self.chat.single_token_ids(request.sampling.first_token_logprobs))
        if request.sampling.temperature > 0:
            row.rng = np.random.default_rng(request.sampling.seed)
        elif self.draft_tokens:  # a sampled row would need rejection sampling to draft exactly
            row.lookup = PromptLookup(ids, max_ngram=DRAFT_NGRAM, min_ngram=DRAFT_NGRAM)
        if len(ids) + 1 > self.slot_tokens:
            row.error = f"prompt of {len(ids)} tokens does not fit a slot of {self.slot_tokens} tokens"
            row.meta["error"] = row.error
        return row

    def _budget(self, row: LlamaRow) -> int:
        """Answer tokens the row may produce: its own limit, within its slot."""
        return min(row.sampling.max_new_tokens, self.slot_tokens - len(row.prompt_ids))

    def _done(self, row: LlamaRow) -> bool:
        if row.error is not None:
            return True
        if not row.tokens:
            return False
        return row.tokens[-1] in self.stop_token_ids or len(row.tokens) >= self._budget(row)

    def _context(self, adapter: str) -> RoleContext:
        if adapter not in self._contexts:
            self._contexts[adapter] = RoleContext(self._model, self._loras.get(adapter), self.max_batch_size,
                                                  self.slot_tokens, self.threads, self.contiguous_slots)
        return self._contexts[adapter]

    # -- the loop ------------------------------------------------------------------------

    def _decode_rows(self, rows: list[LlamaRow], poll: Callable[[], list[LlamaRow]] | None = None,
                     on_finish: Callable[[LlamaRow], None] | None = None) -> None:
        """Decode every row to a stop token or its budget, admitting new ones before each step."""
        waiting = list(rows)
        running: list[LlamaRow] = []
        try:
            while True:
                if poll is not None:
                    waiting += poll()
                for row in [r for r in running if self._done(r)]:
                    running.remove(row)
                    row.context.release(row.slot)
                    if on_finish is not None:
                        on_finish(row)
                joining: dict[str, list[LlamaRow]] = defaultdict(list)
                for row in list(waiting):
                    if row.error is None:
                        context = self._context(row.adapter)
                        claimed = context.claim(row.prompt_ids)
                        if claimed is None:
                            continue  # this role's slots are all busy: wait for one to free
                        row.context, row.slot = context, claimed[0]
                        joining[row.adapter].append(row)
                    else:
                        if on_finish is not None:
                            on_finish(row)
                    waiting.remove(row)
                for adapter, group in joining.items():
                    self._prefill(self._contexts[adapter], group)
                    running += group
                if not waiting and not running:
                    return
                active = [r for r in running if not self._done(r)]
                by_adapter: dict[str, list[LlamaRow]] = defaultdict(list)
                for row in active:
                    by_adapter[row.adapter].append(row)
                for adapter, group in by_adapter.items():
                    self._step(self._contexts[adapter], group)
                self.stats.row_steps += len(active)
                self.stats.max_running = max(self.stats.max_running, len(active))
        finally:
            for row in running:  # an error mid-run frees the slots for the next call
                row.context.release(row.slot)

    def _step(self, context: RoleContext, rows: list[LlamaRow]) -> None:
        """One decoding call for ``rows``: each feeds its last token and its draft, and keeps
        the draft's longest prefix that its own greedy choices reproduce, plus the token
        chosen after it. Without drafts, one token per row, as plain decoding."""
        rows = sorted(rows, key=lambda row: row.slot)  # increasing sequence ids: one micro-batch per run (claim)
        room = self.draft_tokens if len(rows) <= DRAFT_ROWS else 0  # see DRAFT_ROWS
        drafts = [self._draft(row, context, room) for row in rows]
        entries, firsts, lengths = [], [], []
        for row, draft in zip(rows, drafts):
            firsts.append(len(entries))
            lengths.append(len(context.cached[row.slot]))
            entries += [(token, row.slot, True) for token in [row.tokens[-1], *draft]]
        started = time.perf_counter()
        context.decode(entries)
        self.stats.step_s += time.perf_counter() - started
        for row, draft, first, length in zip(rows, drafts, firsts, lengths):
            taken = 0
            for i in range(len(draft) + 1):
                self._choose([row], [context.logits(first + i)])
                taken += 1
                if i == len(draft) or row.tokens[-1] != draft[i] or self._done(row):
                    break
            # cells kept: the fed last token and the draft tokens now part of the answer; the
            # newest token is fed next step (a rejected draft's cells are dropped)
            context.truncate(row.slot, length + taken)
            self.stats.drafted += len(draft)
            self.stats.accepted += taken - 1
        self.stats.steps += 1

    def _draft(self, row: LlamaRow, context: RoleContext, room: int) -> list[int]:
        """Tokens ``row`` drafts this step: within its answer budget, its slot and ``room``."""
        if row.lookup is None:
            return []
        limit = min(self.draft_tokens, room, self._budget(row) - len(row.tokens) - 1,
                    self.slot_tokens - len(context.cached[row.slot]) - 1)
        return row.lookup.draft(limit)

    def _prefill(self, context: RoleContext, rows: list[LlamaRow]) -> None:
        """Each row's uncached prompt tokens, packed into decode calls; each row gets its first token.

        A row copies the longest prefix it shares with a row prefilled before it in this group
        instead of computing it again: the role's system prompt at least, and for calls of one
        episode the conversation they have in common (on 64 BFCL role calls prefilled 16 per
        role, 15,863 tokens computed against 18,207 when only system prompts were shared).
        """
        computed, done, logits = 0, [], []
        started = time.perf_counter()
        for row in rows:  # one sequence per decode call: llama.cpp splits a batch by stream anyway
            context.reuse(row.slot, row.prompt_ids, [other.slot for other in done])
            rest = row.prompt_ids[len(context.cached[row.slot]):]
            computed += len(rest)
            for start in range(0, len(rest), BATCH_TOKENS):
                chunk = rest[start:start + BATCH_TOKENS]
                context.decode([(token, row.slot, start + i == len(rest) - 1) for i, token in enumerate(chunk)])
            done.append(row)
            logits.append(context.logits(len(chunk) - 1))
        self.stats.prefill_s += time.perf_counter() - started
        self.stats.prompt_tokens += sum(len(row.prompt_ids) for row in rows)
        self.stats.prefix_tokens_reused += sum(len(row.prompt_ids) for row in rows) - computed
        self._choose(done, logits)
        self.stats.prefills += 1

    def _choose(self, rows: list[LlamaRow], logits: list[np.ndarray]) -> None:
        """Each row's next token (inside its grammar): greedy, or sampled with its own seed.

        A greedy row whose unmasked argmax its grammar allows takes it without masking the
        vocabulary: the masked argmax is that same token (the first index of the maximum),
        and looking up one bit took 0.005 ms against 0.09 ms for unpacking and applying all
        49,152 (a row, a step; small, but paid while llama.cpp's threads wait). NumPy only: a
        torch operator here would wake torch's OpenMP threads, which then spin on the two
        cores llama.cpp's own threads are computing on.
        """
        started = time.perf_counter()
        for row, scores in zip(rows, logits):
            if row.scored and not row.tokens:  # the model's own distribution, before the grammar's mask
                row.meta["first_token_logprobs"] = first_token_logprobs(scores, row.scored)
            constrained = row.matcher is not None and not row.matcher.is_terminated()
            if constrained:
                self._fill_bitmask(row.matcher)
            if row.rng is None:
                token = int(scores.argmax())
                if constrained and not self._allows(token):
                    token = int(np.where(self._allowed(), scores, -np.inf).argmax())
            else:
                token = _sample(np.where(self._allowed(), scores, -np.inf) if constrained else scores,
                                row.sampling, row.rng)
            row.tokens.append(token)
            if row.lookup is not None:
                row.lookup.extend([token])
            if constrained:
                row.matcher.accept_token(token)
        self.stats.choose_s += time.perf_counter() - started

    def _fill_bitmask(self, matcher) -> None:
        """Write the tokens ``matcher`` allows next into the reused one-row bitmask."""
        import xgrammar as xgr

        if self._bitmask is None:
            self._bitmask = xgr.allocate_token_bitmask(1, self.chat.vocab_size)
            self._bitmask_words = self._bitmask.numpy()[0]  # the same memory, as NumPy int32
        matcher.fill_next_token_bitmask(self._bitmask, 0)

    def _allows(self, token: int) -> bool:
        """Whether the last filled bitmask allows ``token``."""
        return bool((int(self._bitmask_words[token >> 5]) >> (token & 31)) & 1)

    def _allowed(self) -> np.ndarray:
        """The last filled bitmask as a boolean vector over the vocabulary."""
        bits = np.unpackbits(self._bitmask_words.view(np.uint8), bitorder="little")
        return bits[:self.chat.vocab_size].astype(bool)


def _runs(busy: list[bool]) -> int:
    """How many runs of consecutive busy slots there are (what llama.cpp decodes as separate micro-batches)."""
    return sum(1 for i, b in enumerate(busy) if b and (i == 0 or not busy[i - 1]))


def _common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _sample(logits: np.ndarray, sampling: SamplingConfig, rng: np.random.Generator) -> int:
    """Temperature and nucleus (top-p) sampling of one token."""
    z = logits.astype(np.float64) / sampling.temperature
    probs = np.exp(z - z.max())
    probs /= probs.sum()
    order = np.argsort(-probs)
    keep = np.searchsorted(np.cumsum(probs[order]), sampling.top_p) + 1
    # The draw walks the nucleus in vocabulary order, not by probability: near-equal
    # probabilities that swap places under rounding noise (a prefix reused from the cache
    # vs prefilled) then map the same draw to the same token.
    top = np.sort(order[:keep])
    return int(rng.choice(top, p=probs[top] / probs[top].sum()))
