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
        # From the second call on, the last column is the token each row just sampled.
        if self.started:
            for i, matcher in enumerate(self.matchers):
                if matcher is not None and not matcher.is_terminated():
                    matcher.accept_token(int(input_ids[i, -1]))
        self.started = True
        return mask_to_grammars(self.matchers, scores, self.bitmask)


def mask_to_grammars(matchers: list["xgr.GrammarMatcher | None"], scores: torch.Tensor,
                     bitmask: torch.Tensor | None = None) -> torch.Tensor:
    """Mask each row's scores to the tokens its matcher allows next (None, or a terminated
    matcher: the row is left as is); returns the masked scores on their own device.
    ``bitmask`` is reused when given (``xgr.allocate_token_bitmask(rows, vocab_size)``)."""
    if all(m is None or m.is_terminated() for m in matchers):
        return scores
    if bitmask is None:
        bitmask = xgr.allocate_token_bitmask(len(matchers), scores.shape[-1])
    for i, matcher in enumerate(matchers):
        if matcher is None or matcher.is_terminated():  # a finished row only produces padding
            bitmask[i].fill_(-1)
        else:
            matcher.fill_next_token_bitmask(bitmask, i)
    device = scores.device
    # xgrammar applies a bitmask on CUDA or CPU tensors only
    on_host = scores if device.type in ("cuda", "cpu") else scores.to("cpu")
    xgr.apply_token_bitmask_inplace(on_host, bitmask.to(on_host.device))
    return on_host.to(device)
