"""Drafts from the context (heart.runtime.lookup): what greedy decoding is likely to copy next."""

import pytest

from heart.runtime.lookup import PromptLookup


def test_a_draft_continues_the_latest_earlier_occurrence_of_the_last_ngram():
    lookup = PromptLookup([1, 2, 3, 4, 5, 9, 1, 2, 3, 7, 8, 6, 1, 2, 3])
    assert lookup.draft(3) == [7, 8, 6]  # the later "1 2 3" (followed by 7 8 6), not the first


def test_the_longest_matching_ngram_wins_and_a_draft_stops_at_the_limit():
    lookup = PromptLookup([5, 2, 3, 40, 41, 9, 1, 2, 3, 50, 51, 52, 2, 3], max_ngram=3, min_ngram=1)
    # the suffix "2 3" occurred twice; "x 2 3" as a trigram never did: the bigram's latest occurrence
    assert lookup.draft(2) == [50, 51]
    assert lookup.draft(0) == []


def test_no_draft_without_an_earlier_occurrence_of_a_long_enough_ngram():
    lookup = PromptLookup([1, 2, 3, 4], min_ngram=3)
    assert lookup.draft(4) == []
    lookup.extend([9, 2, 3, 4])  # "2 3 4" occurred before, continued by 9
    assert lookup.draft(4) == [9, 2, 3, 4]
    assert PromptLookup([1, 2, 1, 2], max_ngram=3, min_ngram=3).draft(4) == []  # only a bigram repeats


def test_the_answer_so_far_is_part_of_the_context():
    lookup = PromptLookup([7, 8], min_ngram=1)
    lookup.extend([10, 11, 12, 10])
    assert lookup.draft(5) == [11, 12, 10]


def test_bad_ngram_sizes_are_refused():
    with pytest.raises(ValueError, match="min_ngram <= max_ngram"):
        PromptLookup([1], max_ngram=2, min_ngram=3)
    with pytest.raises(ValueError, match="min_ngram <= max_ngram"):
        PromptLookup([1], max_ngram=0, min_ngram=0)
