"""Draft tokens from the context itself (prompt lookup), for speculative greedy decoding.

Role answers copy much of their input: the Router copies the plan's tool names and the
values it binds, the Primitive its bindings, the Planner the tools' names and descriptions,
and an unadapted base repeats its own plan steps until its budget runs out. So the tokens
that followed the last occurrence of the current n-gram, in the prompt or in the answer so
far, are often the tokens greedy decoding is about to produce. A decoder feeds such a draft
together with the row's last token in one call, and keeps the longest prefix its own greedy
choices agree with (``LlamaCppBackend``): the answer is the one token-by-token decoding
gives, in fewer calls. On a pipeline run's held-out role answers (re-tokenised, n-grams of
3 down to 1, 8-token drafts) that would be 2.0 (Primitive) to 4.4 (base Planner) answer
tokens per call; what it buys on a CPU is smaller, because a call's cost grows with the
tokens it feeds, and beside other rows a draft splits the call (``heart.runtime.llamacpp.DRAFT_ROWS``).

This is vLLM's ``ngram`` speculative method / transformers' ``prompt_lookup_num_tokens``,
kept incremental: an index from each n-gram to where its latest occurrence continues, updated
as tokens are appended, so a draft costs a dictionary lookup, not a scan of the context.
"""

from __future__ import annotations


class PromptLookup:
    """The context of one row (prompt, then answer) and the drafts it suggests."""

    def __init__(self, tokens: list[int], max_ngram: int = 3, min_ngram: int = 1):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.tokens: list[int] = []
        self._continues: dict[tuple[int, ...], int] = {}
        """n-gram → the position just after its latest occurrence that has a continuation."""
        self.extend(tokens)

    def extend(self, tokens: list[int]) -> None:
        """Append tokens to the context."""
        for token in tokens:
            end = len(self.tokens)  # the n-grams ending here now have a continuation: ``token``
            for n in range(self.min_ngram, min(self.max_ngram, end) + 1):
                self._continues[tuple(self.tokens[end - n:end])] = end
            self.tokens.append(token)

    def draft(self, limit: int) -> list[int]:
        """Up to ``limit`` tokens that followed the latest earlier occurrence of the longest
        suffix n-gram (``max_ngram`` down to ``min_ngram``) that occurred before; [] when none did."""
        if limit <= 0:
            return []
        for n in range(min(self.max_ngram, len(self.tokens)), self.min_ngram - 1, -1):
            start = self._continues.get(tuple(self.tokens[-n:]))
            if start is not None:
                return self.tokens[start:start + limit]
        return []
