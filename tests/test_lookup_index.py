"""Prompt-lookup drafting (csrc/lookup_index.{hpp,cpp}): the incremental index proposes, after any mix
of extends and truncates, exactly what a direct search of the current sequence does; the run's level
(an index per row, kept to each row's valid prefix) does the same per row; hand examples of the
contract; bad arguments."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hsd_fast._C import LookupIndex, LookupLevel

NGRAM_SETTINGS = [(1, 1), (2, 1), (3, 1), (3, 2), (4, 4), (5, 2)]  # (max_ngram, min_ngram)


def propose_brute_force(seq: Sequence[int], k: int, max_ngram: int, min_ngram: int) -> list[int]:
    """The contract, by direct search: for n from max_ngram down to min_ngram (n <= N - 1), k tokens
    of the continuation of the suffix's latest occurrence starting at s with s + n <= N - 1, the
    sequence extended by the proposal itself where it ends first (an overlapping copy)."""
    seq = list(seq)
    size = len(seq)
    for n in range(max_ngram, min_ngram - 1, -1):
        if n > size - 1:
            continue
        suffix = seq[size - n :]
        for s in range(size - 1 - n, -1, -1):
            if seq[s : s + n] == suffix:
                extended = list(seq)
                while len(extended) < s + n + k:
                    extended.append(extended[len(extended) - (size - s - n)])
                return extended[s + n : s + n + k]
    return []


def _check(index: LookupIndex, seq: list[int]) -> None:
    assert index.tokens.tolist() == seq and len(index) == len(seq)
    for k in range(6):
        assert index.propose(k).tolist() == propose_brute_force(seq, k, index.max_ngram, index.min_ngram)


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
    # Truncating takes back exactly what extending added: nothing stale is left behind, so whatever
    # follows, the index proposes what one built afresh from the same tokens does.
    fresh = _fresh(seq, max_ngram, min_ngram)
    for token in data.draw(st.lists(st.integers(0, vocab - 1), max_size=12)):
        index.extend([token])
        fresh.extend([token])
        for k in range(4):
            assert index.propose(k).tolist() == fresh.propose(k).tolist()


@given(
    st.lists(
        st.tuples(st.integers(0, 2), st.integers(0, 40), st.lists(st.integers(0, 3), max_size=6)), max_size=20
    )
)
def test_the_level_syncs_each_row_to_its_valid_prefix_plus_new_tokens(steps) -> None:
    # Each step: a verification of one row replaced its tokens from `cut` on (invalidate), the row
    # grew by `tokens`, and a round proposes for all rows from a window of their tokens.
    num_rows, eos = 3, 3
    level = LookupLevel(num_rows, max_ngram=3, min_ngram=1, eos_ids=[eos])
    rows: list[list[int]] = [[], [], []]
    everyone = np.arange(num_rows)
    for row, cut, tokens in steps:
        cut = min(cut, len(rows[row]))
        level.invalidate([row], [cut])
        rows[row] = rows[row][:cut] + tokens
        low = level.window_start(everyone)
        ends = np.array([len(r) for r in rows])
        window = np.zeros((num_rows, int(ends.max()) - low), dtype=np.int64)
        for r, seq in enumerate(rows):
            window[r, : len(seq) - low] = seq[low:]
        proposed, counts, last_is_eos = level.propose(everyone, window, ends, np.full(num_rows, 4))
        assert proposed.shape == (num_rows, 4)
        for r, seq in enumerate(rows):
            assert level.row(r).tolist() == seq and level.valid()[r] == len(seq)
            expected = propose_brute_force(seq, 4, 3, 1)
            if eos in expected:  # nothing is proposed past an EOS
                expected = expected[: expected.index(eos) + 1]
            assert proposed[r, : counts[r]].tolist() == expected
            assert not proposed[r, counts[r] :].any()
            assert last_is_eos[r] == (eos in expected)


def test_the_level_reads_only_what_changed() -> None:
    # Row 0 is valid up to 4, row 1 up to 2: the window starts at 2, and what stands before a row's
    # valid prefix in it is never read.
    level = LookupLevel(2, max_ngram=2, min_ngram=1, eos_ids=[])
    level.propose([0, 1], np.array([[1, 2, 1, 2], [5, 6, 5, 6]]), [4, 4], [2, 2])
    level.invalidate([0, 1], [9, 2])
    assert level.window_start([0, 1]) == 2 and level.window_start([0]) == 4
    window = np.array([[-1, -1, 1, 2], [7, 5, 6, 7]])  # positions 2..5; row 0's first two are stale
    proposed, counts, _ = level.propose([0, 1], window, [6, 6], [3, 3])
    assert level.row(0).tolist() == [1, 2, 1, 2, 1, 2] and level.row(1).tolist() == [5, 6, 7, 5, 6, 7]
    assert proposed[0, : counts[0]].tolist() == [1, 2, 1] and proposed[1, : counts[1]].tolist() == [5, 6, 7]


def test_the_level_refuses_bad_rounds() -> None:
    level = LookupLevel(2, max_ngram=2, min_ngram=1, eos_ids=[0])
    window = np.zeros((2, 3), dtype=np.int64)
    with pytest.raises(ValueError, match="listed twice"):
        level.propose([1, 1], window, [3, 3], [1, 1])
    with pytest.raises(ValueError, match="out of range"):
        level.propose([0, 2], window, [3, 3], [1, 1])
    with pytest.raises(ValueError, match="window's end"):
        level.propose([0, 1], window, [3, 4], [1, 1])
    with pytest.raises(ValueError, match="wanted"):
        level.propose([0, 1], window, [3, 3], [1, -1])
    with pytest.raises(ValueError, match="window must be"):
        level.propose([0, 1], np.zeros(3, dtype=np.int64), [3, 3], [1, 1])
    with pytest.raises(TypeError, match="integers"):
        level.propose([0, 1], np.zeros((2, 3)), [3, 3], [1, 1])
    with pytest.raises(ValueError, match="first_changed"):
        level.invalidate([0], [-1])
    assert level.valid().tolist() == [0, 0]  # the failed calls changed nothing
    with pytest.raises(ValueError, match="num_rows"):
        LookupLevel(-1, 2, 1, [])


def test_a_repeated_passage_proposes_its_continuation() -> None:
    index = _fresh([5, 6, 7, 8, 9, 1, 2, 5, 6], max_ngram=3, min_ngram=1)
    assert index.propose(3).tolist() == [7, 8, 9]


def test_the_most_recent_occurrence_wins() -> None:
    # [1, 2] occurs at 0 (followed by 3) and at 3 (followed by 4): the later one wins.
    index = _fresh([1, 2, 3, 1, 2, 4, 1, 2], max_ngram=2, min_ngram=2)
    assert index.propose(1).tolist() == [4]


def test_a_longer_ngram_wins_over_a_shorter_one() -> None:
    # The suffix [2] last occurred at 4 (followed by 7), but [1, 2] only at 0 (followed by 3).
    index = _fresh([1, 2, 3, 9, 2, 7, 1, 2], max_ngram=2, min_ngram=1)
    assert index.propose(2).tolist() == [3, 9]
    assert _fresh([1, 2, 3, 9, 2, 7, 1, 2], max_ngram=1, min_ngram=1).propose(2).tolist() == [7, 1]


def test_an_occurrence_may_overlap_the_suffix() -> None:
    # [0, 0, 0, 0]: the suffix [0, 0, 0] last occurred at 0, overlapping it, followed by one 0.
    assert _fresh([0, 0, 0, 0], max_ngram=3, min_ngram=3).propose(5).tolist() == [0] * 5


def test_no_match_proposes_nothing() -> None:
    assert _fresh([1, 2, 3, 4], max_ngram=3, min_ngram=1).propose(4).tolist() == []
    # [3, 4] occurred before, but only n = 3 is tried.
    assert _fresh([3, 4, 5, 3, 4], max_ngram=3, min_ngram=3).propose(4).tolist() == []


def test_the_continuation_reads_on_into_the_proposal_where_the_sequence_ends() -> None:
    # [1, 2] last occurred at 2, followed by [3, 1, 2]: a loop of period 3, which the proposal continues.
    assert _fresh([1, 2, 1, 2, 3, 1, 2], max_ngram=2, min_ngram=1).propose(7).tolist() == [
        3,
        1,
        2,
        3,
        1,
        2,
        3,
    ]
    assert _fresh([5, 6, 7, 5, 6, 7], max_ngram=3, min_ngram=3).propose(5).tolist() == [5, 6, 7, 5, 6]


def test_too_short_a_sequence_proposes_nothing() -> None:
    index = LookupIndex()
    assert index.propose(3).tolist() == []
    index.extend([7])
    assert index.propose(3).tolist() == []
    index.extend([7])
    assert index.propose(3).tolist() == [7, 7, 7]
    index.truncate(1)
    assert index.propose(3).tolist() == [] and index.tokens.tolist() == [7]


def test_k_zero_proposes_nothing() -> None:
    assert _fresh([1, 1, 1], max_ngram=2, min_ngram=1).propose(0).tolist() == []


def test_tokens_is_a_copy() -> None:
    index = _fresh([1, 2, 3], max_ngram=2, min_ngram=1)
    tokens = index.tokens
    tokens[0] = 5
    index.extend([4])
    assert tokens.tolist() == [5, 2, 3] and index.tokens.tolist() == [1, 2, 3, 4]


def test_a_bare_instance_is_refused() -> None:
    for cls in (LookupIndex, LookupLevel):
        with pytest.raises(TypeError, match="never initialised"):
            len(cls.__new__(cls)) if cls is LookupIndex else cls.__new__(cls).valid()


@pytest.mark.parametrize(("max_ngram", "min_ngram"), [(3, 0), (1, 2), (0, 0), (-1, 1)])
def test_bad_ngram_sizes_raise(max_ngram: int, min_ngram: int) -> None:
    with pytest.raises(ValueError, match="min_ngram"):
        LookupIndex(max_ngram, min_ngram)
    with pytest.raises(ValueError, match="min_ngram"):
        LookupLevel(2, max_ngram, min_ngram, [])


def test_bad_truncate_and_k_raise() -> None:
    index = _fresh([1, 2, 3], max_ngram=2, min_ngram=1)
    with pytest.raises(ValueError, match="truncate"):
        index.truncate(4)
    with pytest.raises(ValueError, match="truncate"):
        index.truncate(-1)
    with pytest.raises(ValueError, match="k must"):
        index.propose(-1)
    _check(index, [1, 2, 3])  # the failed calls changed nothing
