"""Prompt-lookup drafting (hsd_fast/lookup_index.py): the incremental index proposes, after any mix of
extends and truncates, exactly what a direct search of the current sequence does; hand examples of
the contract; bad arguments."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hsd_fast.lookup_index import LookupIndex, LookupIndexes

NGRAM_SETTINGS = [(1, 1), (2, 1), (3, 1), (3, 2), (4, 4), (5, 2)]  # (max_ngram, min_ngram)


def propose_brute_force(seq: Sequence[int], k: int, max_ngram: int, min_ngram: int) -> list[int]:
    """The contract, by direct search: for n from max_ngram down to min_ngram (n <= N - 1), the
    continuation of the suffix's latest occurrence starting at s with s + n <= N - 1."""
    seq = list(seq)
    size = len(seq)
    for n in range(max_ngram, min_ngram - 1, -1):
        if n > size - 1:
            continue
        suffix = seq[size - n :]
        for s in range(size - 1 - n, -1, -1):
            if seq[s : s + n] == suffix:
                return seq[s + n : s + n + k]
    return []


def _check(index: LookupIndex, seq: list[int]) -> None:
    assert list(index.tokens) == seq and len(index) == len(seq)
    for k in range(6):
        assert index.propose(k) == propose_brute_force(seq, k, index.max_ngram, index.min_ngram)


def _fresh(seq: list[int], max_ngram: int, min_ngram: int) -> LookupIndex:
    index = LookupIndex(max_ngram, min_ngram)
    index.extend(seq)
    return index


@pytest.mark.parametrize(("max_ngram", "min_ngram"), NGRAM_SETTINGS)
@given(vocab=st.integers(2, 4), data=st.data())
def test_incremental_index_proposes_what_brute_force_does(
    max_ngram: int, min_ngram: int, vocab: int, data: st.DataObject
) -> None:
    index = LookupIndex(max_ngram, min_ngram)
    seq: list[int] = []
    _check(index, seq)
    tokens = st.lists(st.integers(0, vocab - 1), max_size=12)
    for op in data.draw(st.lists(st.sampled_from(["extend", "truncate"]), max_size=25)):
        if op == "extend":
            appended = data.draw(tokens)
            index.extend(appended)
            seq += appended
        else:
            length = data.draw(st.integers(0, len(seq)))
            index.truncate(length)
            del seq[length:]
        _check(index, seq)
    # Truncating takes back exactly what extending added: nothing stale is left behind.
    fresh = _fresh(seq, max_ngram, min_ngram)
    assert (index._last_end, index._links) == (fresh._last_end, fresh._links)


@given(
    st.lists(
        st.tuples(st.integers(0, 2), st.integers(0, 40), st.lists(st.integers(0, 2), max_size=6)), max_size=20
    )
)
def test_indexes_sync_each_row_to_its_valid_prefix_plus_new_tokens(steps) -> None:
    indexes = LookupIndexes(3, max_ngram=3, min_ngram=1)
    rows: list[list[int]] = [[], [], []]
    for row, valid, tokens in steps:
        valid = min(valid, len(rows[row]))
        indexes.sync(row, valid, tokens)
        rows[row] = rows[row][:valid] + tokens
        for r in range(3):
            assert list(indexes[r].tokens) == rows[r]
            assert indexes.propose(r, 4) == propose_brute_force(rows[r], 4, 3, 1)


def test_a_repeated_passage_proposes_its_continuation() -> None:
    index = _fresh([5, 6, 7, 8, 9, 1, 2, 5, 6], max_ngram=3, min_ngram=1)
    assert index.propose(3) == [7, 8, 9]


def test_the_most_recent_occurrence_wins() -> None:
    # [1, 2] occurs at 0 (followed by 3) and at 3 (followed by 4): the later one wins.
    index = _fresh([1, 2, 3, 1, 2, 4, 1, 2], max_ngram=2, min_ngram=2)
    assert index.propose(1) == [4]


def test_a_longer_ngram_wins_over_a_shorter_one() -> None:
    # The suffix [2] last occurred at 4 (followed by 7), but [1, 2] only at 0 (followed by 3).
    index = _fresh([1, 2, 3, 9, 2, 7, 1, 2], max_ngram=2, min_ngram=1)
    assert index.propose(2) == [3, 9]
    assert _fresh([1, 2, 3, 9, 2, 7, 1, 2], max_ngram=1, min_ngram=1).propose(2) == [7, 1]


def test_an_occurrence_may_overlap_the_suffix() -> None:
    # [0, 0, 0, 0]: the suffix [0, 0, 0] last occurred at 0, overlapping it, followed by one 0.
    assert _fresh([0, 0, 0, 0], max_ngram=3, min_ngram=3).propose(5) == [0]


def test_no_match_proposes_nothing() -> None:
    assert _fresh([1, 2, 3, 4], max_ngram=3, min_ngram=1).propose(4) == []
    # [3, 4] occurred before, but only n = 3 is tried.
    assert _fresh([3, 4, 5, 3, 4], max_ngram=3, min_ngram=3).propose(4) == []


def test_the_continuation_stops_at_the_end_of_the_sequence() -> None:
    assert _fresh([1, 2, 1, 2, 3, 1, 2], max_ngram=2, min_ngram=1).propose(5) == [3, 1, 2]


def test_too_short_a_sequence_proposes_nothing() -> None:
    index = LookupIndex()
    assert index.propose(3) == []
    index.extend([7])
    assert index.propose(3) == []
    index.extend([7])
    assert index.propose(3) == [7]
    index.truncate(1)
    assert index.propose(3) == [] and list(index.tokens) == [7]


def test_k_zero_proposes_nothing() -> None:
    assert _fresh([1, 1, 1], max_ngram=2, min_ngram=1).propose(0) == []


def test_tokens_is_a_read_only_view() -> None:
    index = _fresh([1, 2, 3], max_ngram=2, min_ngram=1)
    view = index.tokens
    assert view[0] == 1 and view[-1] == 3 and list(view) == [1, 2, 3]
    view[:2].append(9)  # a slice is a copy
    with pytest.raises(TypeError):
        view[0] = 5  # type: ignore[index]
    index.extend([4])
    assert list(view) == [1, 2, 3, 4]


@pytest.mark.parametrize(("max_ngram", "min_ngram"), [(3, 0), (1, 2), (0, 0), (-1, 1)])
def test_bad_ngram_sizes_raise(max_ngram: int, min_ngram: int) -> None:
    with pytest.raises(ValueError, match="min_ngram"):
        LookupIndex(max_ngram, min_ngram)
    with pytest.raises(ValueError, match="min_ngram"):
        LookupIndexes(2, max_ngram, min_ngram)


def test_bad_truncate_and_k_raise() -> None:
    index = _fresh([1, 2, 3], max_ngram=2, min_ngram=1)
    with pytest.raises(ValueError, match="truncate"):
        index.truncate(4)
    with pytest.raises(ValueError, match="truncate"):
        index.truncate(-1)
    with pytest.raises(ValueError, match="k must"):
        index.propose(-1)
    with pytest.raises(ValueError, match="truncate"):
        LookupIndexes(1, 2, 1).sync(0, 1, [5])
    _check(index, [1, 2, 3])  # the failed calls changed nothing
