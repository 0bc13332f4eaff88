"""Per-row constrained decoding for transformers' ``generate``: one grammar (or none) per row.

xgrammar's own ``contrib.hf.LogitsProcessor`` needs a grammar for every row; a batch that
mixes roles holds rows with different schemas (each Primitive constrains to its own tool's
arguments) and rows without any. Here a row with ``None`` keeps an all-ones bitmask, so it
decodes exactly as it would unconstrained.

Like xgrammar's, a processor serves one ``generate`` call: make a new one per call.
"""

from __future__ import annotations

import torch
import transformers
import xgrammar as xgr


class RowGrammarProcessor(transformers.LogitsProcessor):
    """Masks each row's logits to the tokens its own compiled grammar allows next."""

    def __init__(self, grammars: list["xgr.CompiledGrammar | None"], vocab_size: int):
        self.matchers = [None if g is None else xgr.GrammarMatcher(g) for g in grammars]
        self.bitmask = xgr.allocate_token_bitmask(len(grammars), vocab_size)
        self.started = False

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if input_ids.shape[0] != len(self.matchers):
            raise RuntimeError(f"batch of {input_ids.shape[0]} rows for {len(self.matchers)} grammars")
        for i, matcher in enumerate(self.matchers):
            if matcher is None:
                continue
            # From the second call on, the last column is the token this row just sampled.
            if self.started and not matcher.is_terminated():
                matcher.accept_token(int(input_ids[i, -1]))
            if matcher.is_terminated():  # a finished row only produces padding
                self.bitmask[i].fill_(-1)
            else:
                matcher.fill_next_token_bitmask(self.bitmask, i)
        self.started = True
        device = scores.device
        scores = scores.to("cpu") if device.type != "cuda" else scores
        xgr.apply_token_bitmask_inplace(scores, self.bitmask.to(scores.device))
        return scores.to(device)
