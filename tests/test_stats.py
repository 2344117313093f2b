"""HSDStats (hsd_fast/stats.py): the bookkeeping of record_forward / record_draft / record_verify on
hand-made inputs, the ratios derived from it, the sum of two runs, and the summary table."""

import math

import numpy as np
import pytest

from hsd_fast.stats import HSDStats


def _verify(stats: HSDStats, level: int, drafts, accepted, kept, cascaded) -> None:
    stats.record_verify(level, *(np.array(v, dtype=np.int64) for v in (drafts, accepted, kept, cascaded)))


def _three_levels() -> HSDStats:
    """Four rows verified by level 1, then one long block verified by level 2.

    level 1: drafts [3, 2, 0, 2], accepted [3, 1, 0, 0], kept [1, 1, 1, 0], cascaded [0, 1, 0, 0]
      row 0: all 3 accepted, bonus kept      row 1: rejected at k = 1 (correction), cascades 1 level
      row 2: no drafts, the bonus kept        row 3: rejected at k = 0 (correction), cascades 0 levels
    level 2: drafts [5], accepted [2], kept [1], cascaded [2]: rejected at k = 2, cuts both levels
    """
    stats = HSDStats(3)
    stats.record_forward(0, num_rows=4, fed=9)
    stats.record_draft(4)
    stats.record_forward(0, num_rows=2, fed=2)
    stats.record_draft(2)
    stats.record_forward(1, num_rows=4, fed=11)
    _verify(stats, 1, [3, 2, 0, 2], [3, 1, 0, 0], [1, 1, 1, 0], [0, 1, 0, 0])
    stats.record_forward(2, num_rows=1, fed=6)
    _verify(stats, 2, [5], [2], [1], [2])
    return stats


def test_a_new_record_is_all_zeros() -> None:
    stats = HSDStats(3)
    for name in ("forwards", "row_forwards", "fed_tokens", "drafted", "verified", "accepted", "bonus"):
        assert getattr(stats, name) == [0, 0, 0], name
    assert stats.corrections == [0, 0, 0] and stats.cascade_depth == [0, 0, 0]
    assert stats.verified_at == stats.accepted_at == stats.rejected_at == [[], [], []]
    assert stats.wall_time == [0.0, 0.0, 0.0]
    # the nested lists are distinct objects: recording one level leaves the others alone
    assert stats.verified_at[0] is not stats.verified_at[1]


def test_record_forward_and_draft() -> None:
    stats = _three_levels()
    assert stats.forwards == [2, 1, 1]
    assert stats.row_forwards == [6, 4, 1]
    assert stats.fed_tokens == [11, 11, 6]
    assert stats.drafted == [6, 0, 0]  # level 0's draws only


def test_record_verify_counts_per_level_and_per_block_position() -> None:
    stats = _three_levels()
    assert stats.verified == [0, 7, 5] and stats.accepted == [0, 4, 2]
    assert stats.bonus == [0, 2, 0]  # rows 0 and 2 of level 1; a rejected row's kept token is no bonus
    assert stats.corrections == [0, 2, 1]
    assert stats.verified_at == [[], [3, 3, 1], [1, 1, 1, 1, 1]]
    assert stats.accepted_at == [[], [2, 1, 1], [1, 1, 0, 0, 0]]
    assert stats.rejected_at == [[], [1, 1, 0], [0, 0, 1, 0, 0]]
    assert stats.cascade_depth == [1, 1, 1]  # level 1: depths 1 and 0; level 2: depth 2
    for level in (1, 2):  # the per-position counts add up to the totals
        assert sum(stats.verified_at[level]) == stats.verified[level]
        assert sum(stats.accepted_at[level]) == stats.accepted[level]
        assert sum(stats.rejected_at[level]) == stats.corrections[level]
    assert sum(stats.cascade_depth) == sum(stats.corrections)


def test_record_verify_grows_the_position_counts() -> None:
    stats = HSDStats(2)
    _verify(stats, 1, [1, 2], [1, 0], [1, 1], [0, 1])
    assert stats.verified_at[1] == [2, 1] and stats.rejected_at[1] == [1, 0]
    _verify(stats, 1, [4], [4], [0], [0])  # all accepted, the bonus dropped (length budget)
    assert stats.verified_at[1] == [3, 2, 1, 1]
    assert stats.accepted_at[1] == [2, 1, 1, 1]
    assert stats.rejected_at[1] == [1, 0, 0, 0]
    assert stats.bonus == [0, 1] and stats.corrections == [0, 1]
    _verify(stats, 1, [], [], [], [])  # no rows: nothing changes
    assert stats.verified == [0, 7] and stats.verified_at[1] == [3, 2, 1, 1]


def test_acceptance_rate() -> None:
    stats = _three_levels()
    assert stats.acceptance_rate(1) == pytest.approx(4 / 7)
    assert stats.acceptance_rate(2) == pytest.approx(2 / 5)
    assert math.isnan(HSDStats(2).acceptance_rate(1))  # nothing verified


def test_mean_accepted_per_target_pass() -> None:
    stats = _three_levels()
    assert stats.mean_accepted_per_target_pass == pytest.approx(2 / 1)
    stats.record_forward(2, num_rows=3, fed=3)
    assert stats.mean_accepted_per_target_pass == pytest.approx(2 / 4)
    assert math.isnan(HSDStats(3).mean_accepted_per_target_pass)


def test_sum_of_two_runs() -> None:
    a = _three_levels()
    b = HSDStats(3)
    b.record_forward(1, num_rows=1, fed=2)
    _verify(b, 1, [4], [4], [1], [0])  # wider than a's level 1: the position counts grow
    b.wall_time[2] = 0.25
    before = (a.verified_at[1].copy(), b.verified_at[1].copy())
    total = a + b
    assert total.num_levels == 3
    assert total.forwards == [2, 2, 1] and total.row_forwards == [6, 5, 1] and total.fed_tokens == [11, 13, 6]
    assert total.drafted == [6, 0, 0]
    assert total.verified == [0, 11, 5] and total.accepted == [0, 8, 2] and total.bonus == [0, 3, 0]
    assert total.corrections == [0, 2, 1] and total.cascade_depth == [1, 1, 1]
    assert total.verified_at == [[], [4, 4, 2, 1], [1, 1, 1, 1, 1]]
    assert total.accepted_at == [[], [3, 2, 2, 1], [1, 1, 0, 0, 0]]
    assert total.rejected_at == [[], [1, 1, 0, 0], [0, 0, 1, 0, 0]]
    assert total.wall_time == [0.0, 0.0, 0.25]
    assert (a.verified_at[1], b.verified_at[1]) == before  # the operands are left as they were
    assert total.rejected_at[1] is not a.rejected_at[1]
    assert (b + a).verified_at == total.verified_at


def test_sum_refuses_different_level_counts() -> None:
    with pytest.raises(ValueError, match="2 and 3 levels"):
        HSDStats(2) + HSDStats(3)


def test_summary_lists_every_level() -> None:
    stats = _three_levels()
    stats.wall_time[1] = 1.5
    lines = stats.summary().splitlines()
    assert len(lines) == 1 + 3 + 1
    assert lines[0].split() == [
        "level", "forwards", "row-fwds", "fed-tok", "verified", "accepted", "bonus", "corrections", "wall-s"
    ]  # fmt: skip
    # level 0 drafts: it verifies nothing, so it shows '-' there
    assert lines[1].split() == ["0", "2", "6", "11", "-", "-", "0", "0", "0.000"]
    assert lines[2].split() == ["1", "1", "4", "11", "7", "4", "2", "2", "1.500"]
    assert lines[3].split() == ["2", "1", "1", "6", "5", "2", "0", "1", "0.000"]
    assert lines[4] == "rollbacks by levels cascaded into: [1, 1, 1]"


def test_summary_names_the_levels_it_is_told() -> None:
    stats = _three_levels()
    unnamed = stats.summary().splitlines()
    stats.level_names = ["lookup", "exit2", "my-target"]
    lines = stats.summary().splitlines()
    assert [line.split()[0] for line in lines[1:4]] == stats.level_names
    assert [line.split()[1:] for line in lines[1:4]] == [line.split() for line in unnamed[1:4]]
    assert lines[0].split() == unnamed[0].split() and lines[4] == unnamed[4]
    stats.level_names = ["lookup", "exit2"]  # not one per level: numbers only
    assert stats.summary().splitlines() == unnamed


def test_a_sum_keeps_the_names_the_two_runs_share() -> None:
    a, b = _three_levels(), _three_levels()
    a.level_names = b.level_names = ["x", "y", "z"]
    assert (a + b).level_names == ["x", "y", "z"]
    b.level_names = ["x", "w", "z"]
    assert (a + b).level_names == []


def test_time_inside_the_steps_and_the_hosts_share() -> None:
    stats = HSDStats(2)
    stats.record_time(0, wall=0.010, inside_step=0.008)
    stats.record_time(1, wall=0.030, inside_step=0.025)
    stats.record_time(0, wall=0.002, inside_step=0.001)
    assert stats.wall_time == pytest.approx([0.012, 0.030])
    assert stats.step_time == pytest.approx([0.009, 0.025])
    assert stats.host_time == pytest.approx(0.008)
