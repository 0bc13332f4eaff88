"""Continuous batching for the in-process backend: rows join and leave the batch every step.

``transformers``' ``generate`` decodes a batch until its longest row stops, and a new request
waits for the whole batch. On a CPU that wastes most of the work: a role's answers vary from
a few dozen tokens to the role's whole budget, so a batch of 8 spends most of its steps
carrying rows that have finished. :class:`ContinuousDecoder` runs its own greedy loop over
the model's ``forward`` instead, in the spirit of vLLM's iteration-level scheduling:

* every step decodes one token for each *running* row;
* a row that emits a stop token (or reaches its own ``max_new_tokens``) leaves at once;
* waiting requests are prefilled together and join as soon as there is room, so the batch
  stays full and a decoding step's fixed cost (reading every weight) is shared by as many
  rows as possible;
* each row keeps its own adapter (peft ``adapter_names``) and its own JSON-schema grammar.

The keys and values of all running rows live in one left-padded cache (rows are aligned on
their last token; the attention mask hides each row's padding and position ids count each
row's own tokens), held in buffers with room to grow so a step appends in place instead of
copying the whole cache (``DynamicCache`` concatenates every step). Joining and leaving
rebuild the buffers once per event, not once per step.

Greedy only: sampled requests go through ``generate`` (see ``TransformersBackend``).
"""

from __future__ import annotations

import time

from dataclasses import dataclass, field
from typing import Callable

import torch
from transformers.cache_utils import Cache, DynamicLayer

from heart.runtime.chat import first_token_logprobs

MIN_PREFIX = 32
"""Shorter shared prefixes are recomputed: reusing them saves less than building the batch costs."""
MAX_PREFIXES = 32
"""Prefixes kept (adapter x system prompt; ~14 MB each for SmolLM2's ~300-token prompts)."""
GROW_COLUMNS = 64
"""Spare cache columns allocated at each rebuild: a rebuild copies the cache, so it should
happen once per join/leave event, not every step."""


class BufferLayer(DynamicLayer):
    """One layer's keys and values in a buffer with spare columns: ``update`` writes in place.

    ``keys`` / ``values`` are views of the filled columns, which is all the model reads.
    """

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, spare: int = GROW_COLUMNS):
        super().__init__()
        batch, heads, length, dim = keys.shape
        self._k = keys.new_zeros(batch, heads, length + spare, dim)
        self._v = values.new_zeros(batch, heads, length + spare, dim)
        self._k[:, :, :length] = keys
        self._v[:, :, :length] = values
        self.length = length
        self.device = keys.device
        self.is_initialized = True
        self._views()

    def _views(self) -> None:
        self.keys = self._k[:, :, : self.length]
        self.values = self._v[:, :, : self.length]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        new = key_states.shape[-2]
        if self.length + new > self._k.shape[-2]:  # out of room: grow (a copy, rarely)
            grown = BufferLayer(self.keys, self.values, spare=max(GROW_COLUMNS, new))
            self._k, self._v = grown._k, grown._v
        self._k[:, :, self.length : self.length + new] = key_states
        self._v[:, :, self.length : self.length + new] = value_states
        self.length += new
        self._views()
        return self.keys, self.values


@dataclass
class Row:
    """One request while it is being decoded."""

    prompt_ids: list[int]
    adapter: str
    max_new_tokens: int
    matcher: object | None = None
    """xgrammar GrammarMatcher of the row's schema, or None (unconstrained)."""
    owner: object = None
    """The caller's handle (e.g. the Future that waits for this row)."""
    tokens: list[int] = field(default_factory=list)
    """Generated so far (the stop token included once emitted)."""
    length: int = 0
    """Tokens of this row in the cache (prompt + generated ones already fed back)."""
    prefix_len: int = 0
    """Leading prompt tokens shared with other calls (the rendered system message): their
    keys and values are computed once per adapter and reused (0: none)."""
    meta: dict = field(default_factory=dict)
    """Facts for the answer's Generation.meta (e.g. a schema xgrammar could not compile)."""
    scored: dict[int, str] = field(default_factory=dict)
    """Token ids whose log-probabilities at the first answer position go into ``meta``
    (``SamplingConfig.first_token_logprobs``)."""


@dataclass
class DecodeStats:
    """What one :meth:`ContinuousDecoder.run` did."""

    steps: int = 0
    """Decoding steps (one token for every running row)."""
    prefills: int = 0
    """Prefill passes (each admits one or more waiting requests)."""
    row_steps: int = 0
    """Sum over steps of running rows: the rows' useful work."""
    max_running: int = 0
    prompt_tokens: int = 0
    """Prompt tokens of the rows prefilled."""
    prefix_tokens_reused: int = 0
    """Of those, tokens whose keys and values came from the prefix cache (not computed)."""
    drafted: int = 0
    """Draft tokens fed for verification (speculative decoding; :mod:`heart.runtime.lookup`)."""
    accepted: int = 0
    """Of those, tokens the row's own greedy choice reproduced (kept in its answer)."""
    prefill_s: float = 0.0
    """Seconds in the model computing prompt tokens (prefill passes)."""
    step_s: float = 0.0
    """Seconds in the model on decoding steps."""
    choose_s: float = 0.0
    """Seconds choosing tokens from logits (grammar masks, sampling): the engine's own Python,
    while the model waits."""

    @property
    def mean_running(self) -> float:
        return self.row_steps / self.steps if self.steps else 0.0

    @property
    def prompt_tokens_computed(self) -> int:
        return self.prompt_tokens - self.prefix_tokens_reused


class ContinuousDecoder:
    """Greedy continuous batching over one causal LM (optionally a peft model with adapters).

    ``forward(input_ids, attention_mask, position_ids, cache, adapter_names)`` runs
    the model and returns logits of the last position; ``grammar_mask(rows, logits)`` returns
    them masked to each row's grammar. ``TransformersBackend`` supplies both.
    """

    def __init__(self, forward: Callable, grammar_mask: Callable, stop_token_ids: list[int], pad_token_id: int,
                 max_batch_size: int = 16, max_prefill_tokens: int = 4096, prefix_cache: dict | None = None):
        self.forward = forward
        self.prefix_cache = prefix_cache
        """(adapter, prefix token ids) -> each layer's (keys, values); None: no reuse. The
        owner keeps it across runs (the backend's system prompts repeat across every call)."""
        self.grammar_mask = grammar_mask
        self.stops = set(stop_token_ids)
        self.pad = pad_token_id
        self.max_batch_size = max_batch_size
        self.max_prefill_tokens = max_prefill_tokens
        self.stats = DecodeStats()

    # -- the loop ------------------------------------------------------------------------

    def run(self, rows: list[Row], poll: Callable[[], list[Row]] | None = None,
            on_finish: Callable[[Row], None] | None = None) -> list[Row]:
        """Decode every row to its stop token or its budget; returns the rows, tokens filled.

        ``poll`` (optional) is asked for newly arrived rows before every step, so callers in
        other threads can join a running batch; ``on_finish`` is told about each row as soon
        as it leaves. The call returns when nothing is waiting or running.
        """
        waiting = list(rows)
        running: list[Row] = []
        cache: Cache | None = None
        mask = None  # [running, columns]: 1 where a row has a token in the cache
        next_tokens: list[int] = []
        while True:
            if poll is not None:
                waiting += poll()
            if not (waiting or running):
                return rows
            finished = [i for i, row in enumerate(running) if self._done(row)]
            for i in finished:
                if on_finish is not None:
                    on_finish(running[i])
            joining = self._admit(waiting, len(running) - len(finished))
            if finished or joining:
                keep = [i for i in range(len(running)) if i not in set(finished)]
                running, next_tokens, cache, mask = self._rebuild(running, next_tokens, cache, mask, keep, joining)
            if not running or any(self._done(row) for row in running):
                continue  # a row that joined may be done already (its first token): it leaves first
            # One decoding step: feed each running row its last token.
            mask = torch.cat([mask, mask.new_ones(len(running), 1)], dim=1)
            position_ids = torch.tensor([[row.length] for row in running])
            input_ids = torch.tensor([[t] for t in next_tokens])
            started = time.perf_counter()
            logits = self.forward(input_ids, mask, position_ids, cache, [r.adapter for r in running])
            self.stats.step_s += time.perf_counter() - started
            for row in running:
                row.length += 1
            next_tokens = self._choose(running, logits)
            self.stats.steps += 1
            self.stats.row_steps += len(running)
            self.stats.max_running = max(self.stats.max_running, len(running))

    def _done(self, row: Row) -> bool:
        return bool(row.tokens) and (row.tokens[-1] in self.stops or len(row.tokens) >= row.max_new_tokens)

    def _admit(self, waiting: list[Row], staying: int) -> list[Row]:
        """Waiting rows that join now: as many as fit, prefilled together (bounded tokens)."""
        joining: list[Row] = []
        longest = 0
        while waiting and staying + len(joining) < self.max_batch_size:
            longest_with = max(longest, len(waiting[0].prompt_ids))
            if joining and longest_with * (len(joining) + 1) > self.max_prefill_tokens:
                break
            longest = longest_with
            joining.append(waiting.pop(0))
        return joining

    def _choose(self, rows: list[Row], logits: torch.Tensor) -> list[int]:
        """Greedy next token of every row (inside its grammar); appended to each row."""
        started = time.perf_counter()
        for row, scores in zip(rows, logits):
            if row.scored and not row.tokens:  # the model's own distribution, before the grammar's mask
                row.meta["first_token_logprobs"] = first_token_logprobs(scores.float().cpu().numpy(), row.scored)
        chosen = self.grammar_mask(rows, logits).argmax(dim=-1).tolist()
        for row, token in zip(rows, chosen):
            row.tokens.append(token)
            if row.matcher is not None and not row.matcher.is_terminated():
                row.matcher.accept_token(token)
        self.stats.choose_s += time.perf_counter() - started
        return chosen

    # -- joining and leaving -------------------------------------------------------------

    def _prefill(self, rows: list[Row]) -> tuple[Cache, torch.Tensor]:
        """Prefill of ``rows``: their cache and mask; each gets its first token.

        A row whose shared prefix (its system prompt, ``Row.prefix_len``) was seen before
        with the same adapter reuses that prefix's keys and values and only computes the rest
        of its prompt. Each row's columns are ``[padding][prefix][padding][rest]``: the mask
        hides both paddings and position ids continue from the prefix, so attention sees
        exactly the row's own tokens at their own positions.
        """
        prefixes = [self._prefix(row) for row in rows]
        kept = [0 if prefix is None else row.prefix_len for row, prefix in zip(rows, prefixes)]
        rests = [row.prompt_ids[n:] for row, n in zip(rows, kept)]
        head, width = max(kept), max(len(rest) for rest in rests)
        input_ids = torch.full((len(rows), width), self.pad, dtype=torch.long)
        mask = torch.zeros(len(rows), head + width, dtype=torch.long)
        position_ids = torch.zeros(len(rows), width, dtype=torch.long)
        for i, (row, n, rest) in enumerate(zip(rows, kept, rests)):
            input_ids[i, width - len(rest):] = torch.tensor(rest)
            mask[i, head - n:head] = 1
            mask[i, head + width - len(rest):] = 1
            position_ids[i, width - len(rest):] = torch.arange(n, n + len(rest))
            row.length = len(row.prompt_ids)
        cache = _empty_cache()
        if head:  # the prefixes, each right-aligned on column ``head``
            like = next(prefix for prefix in prefixes if prefix is not None)
            empty = [(k[:, :, :0], v[:, :, :0]) for k, v in like]
            prefixes = [empty if prefix is None else prefix for prefix in prefixes]
            left = lambda t, n: torch.nn.functional.pad(t, (0, 0, head - n, 0))  # noqa: E731
            cache = Cache(layers=[
                BufferLayer(torch.cat([left(prefix[layer][0], n) for prefix, n in zip(prefixes, kept)]),
                            torch.cat([left(prefix[layer][1], n) for prefix, n in zip(prefixes, kept)]),
                            spare=width)
                for layer in range(len(like))])
        started = time.perf_counter()
        logits = self.forward(input_ids, mask, position_ids, cache, [r.adapter for r in rows])
        self.stats.prefill_s += time.perf_counter() - started
        self._choose(rows, logits)
        self.stats.prefills += 1
        self.stats.prefix_tokens_reused += sum(kept)
        self.stats.prompt_tokens += sum(len(row.prompt_ids) for row in rows)
        return cache, mask

    def _prefix(self, row: Row) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
        """The keys and values of the row's shared prefix (computed once per adapter and prefix)."""
        if self.prefix_cache is None or row.prefix_len < MIN_PREFIX or row.prefix_len >= len(row.prompt_ids):
            return None
        key = (row.adapter, tuple(row.prompt_ids[:row.prefix_len]))
        if key not in self.prefix_cache:
            ids = torch.tensor([row.prompt_ids[:row.prefix_len]])
            cache = _empty_cache()
            self.forward(ids, torch.ones_like(ids), torch.arange(row.prefix_len)[None], cache, [row.adapter])
            while len(self.prefix_cache) >= MAX_PREFIXES:
                self.prefix_cache.pop(next(iter(self.prefix_cache)))  # the oldest
            self.prefix_cache[key] = [(layer.keys, layer.values) for layer in cache.layers]
        return self.prefix_cache[key]

    def _rebuild(self, running, next_tokens, cache, mask, keep, joining):
        """The batch after some rows left (``keep`` are the staying indices) and ``joining`` came."""
        kept_rows = [running[i] for i in keep]
        kept_next = [next_tokens[i] for i in keep]
        parts = []  # (cache layers' keys/values, mask) of each group, aligned on the right
        if kept_rows:
            index = torch.tensor(keep)
            parts.append(([(layer.keys[index], layer.values[index]) for layer in cache.layers], mask[index]))
        if joining:
            new_cache, new_mask = self._prefill(joining)
            parts.append(([(layer.keys, layer.values) for layer in new_cache.layers], new_mask))
            kept_next += [row.tokens[-1] for row in joining]
        rows = kept_rows + joining
        if not parts:  # everyone left and nobody joined
            return [], [], None, None
        width = max(part_mask.shape[1] for _, part_mask in parts)
        # Columns every staying row has as padding are dropped: the batch's width follows
        # its longest *running* row, not the longest row it ever held.
        layers, masks = [], []
        for part_layers, part_mask in parts:
            pad = width - part_mask.shape[1]
            masks.append(torch.nn.functional.pad(part_mask, (pad, 0)))
            layers.append([(torch.nn.functional.pad(k, (0, 0, pad, 0)), torch.nn.functional.pad(v, (0, 0, pad, 0)))
                           for k, v in part_layers])
        mask = torch.cat(masks)
        used = int(mask.any(dim=0).nonzero()[0]) if mask.any() else 0
        mask = mask[:, used:]
        merged = Cache(layers=[BufferLayer(torch.cat([group[i][0] for group in layers])[:, :, used:],
                                           torch.cat([group[i][1] for group in layers])[:, :, used:])
                               for i in range(len(layers[0]))])
        return rows, kept_next, merged, mask


def _empty_cache() -> Cache:
    return Cache(layer_class_to_replicate=DynamicLayer)
