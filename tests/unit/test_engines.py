"""The engine switch (``--engine peft|llamacpp[:weights]``) and llama.cpp's grammar-constrained choice."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from heart.runtime import engines
from heart.runtime.base import SamplingConfig
from heart.runtime.gguf_files import BASE_WEIGHTS


def test_every_llamacpp_weight_spec_is_a_precision_gguf_files_can_build():
    assert set(engines.LLAMACPP_WEIGHTS) == set(BASE_WEIGHTS)
    assert engines.ENGINE_SPECS == ("peft", "llamacpp", *(f"llamacpp:{w}" for w in BASE_WEIGHTS))


def test_a_weight_spec_reaches_the_llamacpp_backend(monkeypatch):
    import heart.runtime.llamacpp as llamacpp

    made = []
    monkeypatch.setattr(llamacpp, "LlamaCppBackend", lambda model, **options: made.append((model, options)))
    engines.local_backend("llamacpp:f16", "smollm2-135m", {"planner": "a"}, 4)
    engines.local_backend("llamacpp", "smollm2-135m")
    assert made == [("smollm2-135m", {"weights": "f16", "adapters": {"planner": "a"}, "max_batch_size": 4}),
                    ("smollm2-135m", {"adapters": {}, "max_batch_size": 8})]


@pytest.mark.parametrize("spec", ["llamacpp:f8", "peft:f16", "vllm", "llama.cpp"])
def test_an_unknown_engine_spec_is_refused_naming_the_choices(spec):
    with pytest.raises(ValueError, match=r"engine must be one of .*llamacpp:f16.*" + spec.replace(".", r"\.")):
        engines.local_backend(spec, "smollm2-135m")


class OnlyTokens:
    """An xgrammar-like matcher that allows a fixed set of tokens at every step."""

    def __init__(self, allowed: set[int]):
        self.allowed, self.accepted = allowed, []

    def is_terminated(self) -> bool:
        return False

    def fill_next_token_bitmask(self, bitmask, index: int) -> None:
        words = np.zeros(bitmask.shape[1], dtype=np.uint32)
        for token in self.allowed:
            words[token >> 5] |= np.uint32(1 << (token & 31))
        bitmask[index] = torch.from_numpy(words.view(np.int32))

    def accept_token(self, token: int) -> bool:
        assert token in self.allowed, f"the engine chose {token}, which the grammar does not allow"
        self.accepted.append(token)
        return True


def _backend(vocab: int):
    from types import SimpleNamespace

    from heart.runtime.continuous import DecodeStats
    from heart.runtime.llamacpp import LlamaCppBackend

    backend = LlamaCppBackend.__new__(LlamaCppBackend)  # _choose needs the vocabulary size, a bitmask and its timers
    backend.chat, backend._bitmask = SimpleNamespace(vocab_size=vocab), None
    backend.stats = DecodeStats()
    return backend


@pytest.mark.parametrize("allowed, expected", [
    ({3, 40, 70}, 40),   # the unmasked argmax (40) is allowed: taken without masking
    ({3, 70}, 70),       # it is not: the best allowed token
    ({3}, 3),
])
def test_a_greedy_row_takes_the_best_token_its_grammar_allows(allowed, expected):
    from heart.runtime.llamacpp import LlamaRow

    scores = np.zeros(100, dtype=np.float32)
    scores[[3, 40, 70, 99]] = [0.5, 3.0, 1.0, 2.0]
    scores[99] = -1.0
    matcher = OnlyTokens(allowed)
    row = LlamaRow([1, 2], "planner", SamplingConfig(), matcher)
    _backend(100)._choose([row], [scores])
    assert row.tokens == [expected] == matcher.accepted


def test_a_sampled_row_samples_only_allowed_tokens():
    from heart.runtime.llamacpp import LlamaRow

    backend = _backend(64)
    scores = np.zeros(64, dtype=np.float32)
    scores[0] = 50.0  # overwhelmingly likely, and not allowed
    for seed in range(20):
        matcher = OnlyTokens({33, 63})
        row = LlamaRow([1], "router", SamplingConfig(temperature=1.0), matcher, rng=np.random.default_rng(seed))
        backend._choose([row], [scores])
        assert row.tokens[0] in {33, 63}


def _slots(cached: list[list[int]], busy: list[bool], contiguous: bool = True):
    """A llama.cpp context's slot bookkeeping without llama.cpp: copies and cuts act on the token lists."""
    from heart.runtime.llamacpp import RoleContext

    class Context(RoleContext):
        def share(self, source, slot, length):
            self.copies.append((source, slot, length))
            self.cached[slot] = self.cached[source][:length]

        def truncate(self, slot, length):
            del self.cached[slot][length:]

    context = Context.__new__(Context)
    context.cached, context.busy, context.contiguous, context.copies = cached, busy, contiguous, []
    return context


def test_a_new_row_takes_the_slot_that_keeps_the_busy_ones_consecutive_and_copies_its_prefix_there():
    prompt = [1, 2, 3, 4, 5]
    # slots 0 and 2 busy; slot 3 holds the prompt's prefix, but a row there would leave runs {0}, {2, 3}
    context = _slots([[9], [7], [9], [1, 2, 3, 4], []], [True, False, True, False, False])
    assert context.claim(prompt) == (1, 4)  # the hole: one run 0-2
    assert context.copies == [(3, 1, 4)]  # the prefix copied from slot 3, not computed again
    assert context.busy == [True, True, True, False, False]


def test_without_contiguous_slots_a_row_takes_the_slot_with_the_longest_cached_prefix():
    context = _slots([[9], [7], [9], [1, 2, 3, 4], []], [True, False, True, False, False], contiguous=False)
    assert context.claim([1, 2, 3, 4, 5]) == (3, 4)
    assert context.copies == []


def test_between_equally_consecutive_slots_the_cached_prefix_decides():
    # slots 0 and 2 busy: slot 1 closes the hole (one run) and wins over slot 3's longer prefix, copied over
    context = _slots([[9], [1, 2], [], [1, 2, 3]], [True, False, True, False])
    assert context.claim([1, 2, 3, 4]) == (1, 3)
    # nothing busy: every slot leaves one run; the longest cached prefix wins
    context = _slots([[], [1, 2], [], [1, 2, 3]], [False, False, False, False])
    assert context.claim([1, 2, 3, 4]) == (3, 3)
    assert context.copies == []
