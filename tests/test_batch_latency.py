"""`hsd_fast.batch_latency`: the engine's loop replayed on the real ledger over a batch of rows with
random acceptance, and the selection it ranks (docs/design.md, "Selecting for a batch"). Pure math
on fake costs: no model runs."""

from dataclasses import replace

import pytest

from hsd_fast.batch_latency import batch_latency, chain_latency, select_for_batch
from hsd_fast.latency import AffineCost, LookupCost, expected_latency
from hsd_fast.row_spread import ProposalRows
from hsd_fast.selector import select

# Costs with no per-token part: a verification costs the same over any span, so neither the
# compiled steps' buckets nor catch-up tokens (which the one-row recursion leaves out) change them.
FLAT = [AffineCost(0.001), AffineCost(0.004), AffineCost(0.03)]
LONG = 2000  # tokens per row: long enough that the last rounds (rows finishing apart) weigh little


def _close(simulated: tuple[float, float], exact: float, slack: float = 0.02) -> bool:
    mean, error = simulated
    return abs(mean - exact) <= 4 * error + slack * exact


@pytest.mark.parametrize(
    ("costs", "alphas", "T"),
    [
        (FLAT[1:], [0.7], [4]),
        (FLAT, [0.8, 0.7], [2, 4]),
        ([LookupCost(0.0002, (0.5, 0.1, 0.1, 0.1, 0.2)), FLAT[2]], [(0.6, 0.8, 0.9)], [4]),
    ],
    ids=["one draft", "two drafts", "lookup"],
)
def test_one_row_follows_the_recursion(costs, alphas, T) -> None:
    assert _close(
        batch_latency(costs, alphas, T, rows=1, max_new_tokens=LONG, runs=4),
        expected_latency(costs, alphas, T),
    )


def test_rows_that_accept_everything_stay_in_step() -> None:
    """Every row gains the same every round: the batch runs the steps of one row, to the token."""
    one = batch_latency(FLAT, [1.0, 1.0], [2, 3], rows=1, max_new_tokens=60, runs=2)
    assert batch_latency(FLAT, [1.0, 1.0], [2, 3], rows=8, max_new_tokens=60, runs=2) == one


def test_two_drafts_fall_out_of_step_and_one_does_not() -> None:
    """With two drafts, rows whose verifications gained differently want different levels next,
    and a step serves only some of them at the cost of all; with one draft every row drafts, then
    every row is verified, and the batch pays only for rows that finish apart."""

    def slowdown(costs, alphas, T) -> float:
        batch = batch_latency(costs, alphas, T, rows=16, max_new_tokens=LONG, runs=2)[0]
        return batch / batch_latency(costs, alphas, T, rows=1, max_new_tokens=LONG, runs=2)[0]

    assert slowdown(FLAT, [0.8, 0.7], [2, 4]) > 1.1
    assert slowdown(FLAT[1:], [0.7], [4]) < 1.03


def test_a_lookup_level_pads_to_the_widest_row() -> None:
    """Proposals of 0-3 tokens: a verification feeds at most 4, a bucket, so the simulation's cost
    per span is the recursion's; with per-token costs, padding to the widest of 16 rows costs what
    ``LookupCost.padded_block`` predicts, more than one row's own block."""
    lookup = LookupCost(0.0002, (0.4, 0.3, 0.2, 0.1))
    target = AffineCost(0.01, 0.005)
    alphas, T = [(0.6, 0.8, 0.9)], [3]
    padded = expected_latency([replace(lookup, rows=16), target], alphas, T)
    assert padded > 1.1 * expected_latency([lookup, target], alphas, T)
    assert _close(
        batch_latency([replace(lookup, rows=16), target], alphas, T, rows=16, max_new_tokens=LONG),
        padded,
        slack=0.05,  # rows finishing apart: a few rounds in a thousand run with some rows done
    )


def test_batch_latency_refuses_bad_arguments() -> None:
    with pytest.raises(ValueError, match="rows, max_new_tokens and runs >= 1"):
        batch_latency(FLAT, [0.8, 0.7], [2, 4], rows=0)
    with pytest.raises(ValueError, match="2 draft level"):
        batch_latency(FLAT, [0.8], [2, 4], rows=2)


# ----------------------------------------------------------------------------- selecting
COSTS = [AffineCost(0.0005, 0.00005), AffineCost(0.002, 0.0002), AffineCost(0.03, 0.001)]
ALPHA = [[1.0, 0.9, 0.75], [0.9, 1.0, 0.85], [0.75, 0.85, 1.0]]


def test_select_for_batch_drops_a_hierarchy_its_rows_take_out_of_step() -> None:
    one_row = select(COSTS, ALPHA)
    assert len(one_row.chain) == 3  # both drafts pay for one row
    pick = select_for_batch(COSTS, ALPHA, rows=16)
    assert len(pick.chain) == 2
    assert pick.predicted_latency == chain_latency(COSTS, ALPHA, pick.chain, pick.T, rows=16)
    ranked = [pick.predicted_latency, *(r.predicted_latency for r in pick.runner_ups)]
    assert ranked == sorted(ranked)
    two_drafts = next(r for r in pick.runner_ups if r.chain == one_row.chain)
    assert two_drafts.predicted_latency > 1.1 * one_row.predicted_latency
    ar = next(r for r in pick.runner_ups if len(r.chain) == 1)
    assert pick.speedup_over_ar == pytest.approx(ar.predicted_latency / pick.predicted_latency)
    assert select_for_batch(COSTS, ALPHA, rows=1) == one_row


# ----------------------------------------------------------------------------- rows that accept apart
def test_rows_alike_replay_as_before() -> None:
    """A spread of 0 draws no row rates: the replay is the one with rates alike, to the bit."""
    args = (FLAT, [0.8, 0.7], [2, 4])
    assert batch_latency(*args, rows=8, runs=3) == batch_latency(*args, rows=8, runs=3, spreads=[0.0, 0.0])


def test_a_batch_waits_for_its_slowest_rows() -> None:
    """One draft keeps its rows in step, but rows that accept apart need different numbers of rounds
    and the batch runs until the last is done: with the same mean rate, a spread of 1.5 in log-odds
    slows 16 rows by more than a third; one row alone does not wait for anyone and barely moves."""
    costs, alphas, T = FLAT[1:], [0.75], [3]
    alike = batch_latency(costs, alphas, T, rows=16, max_new_tokens=128, runs=16)[0]
    apart = batch_latency(costs, alphas, T, rows=16, max_new_tokens=128, runs=16, spreads=[1.5])[0]
    assert apart > 1.35 * alike
    lone = [
        batch_latency(costs, alphas, T, rows=1, max_new_tokens=128, runs=64, spreads=[s])[0] for s in (0, 1.5)
    ]
    assert lone[1] < 1.25 * lone[0]


def test_spreads_reach_the_selection_and_rank_plain_decoding_first() -> None:
    """A cheap draft the rows-alike replay ranks first at batch 16 loses to plain decoding once its
    rows accept apart (the zoo on the 2-core CPU: `xxs > s` measured 0.6x plain decoding)."""
    costs = [AffineCost(0.002, 0.0002), AffineCost(0.011, 0.0015)]
    alpha = [[1.0, 0.75], [0.75, 1.0]]
    assert len(select_for_batch(costs, alpha, rows=16).chain) == 2
    spread = [[0.0, 1.9], [1.9, 0.0]]
    pick = select_for_batch(costs, alpha, rows=16, spread=spread)
    assert pick.chain == (1,)
    draft = next(r for r in pick.runner_ups if len(r.chain) == 2)
    assert draft.predicted_latency == chain_latency(costs, alpha, draft.chain, draft.T, 16, spread=spread)
    assert select_for_batch(costs, alpha, rows=1, spread=spread) == select(
        costs, alpha
    )  # one row: the recursion


def test_batch_latency_refuses_spreads_of_another_length() -> None:
    with pytest.raises(ValueError, match="as many alphas, T and spreads"):
        batch_latency(FLAT, [0.8, 0.7], [2, 4], rows=2, spreads=[1.0])


def test_a_lookup_level_waits_for_its_rows_that_never_match() -> None:
    """A lookup whose calibration rows either always offer 4 tokens the target takes (a call per 5
    tokens) or never offer anything (a call per token): pooled over their calls, nothing matches in
    5/6 of them, and 16 rows alike finish together; taken whole, the batch waits for a row that
    never matches, at plain decoding's pace. One row alone takes one profile and, on average over
    rows, the pooled pace."""
    pooled = LookupCost(0.0002, (5 / 6, 0.0, 0.0, 0.0, 1 / 6), rows=16)
    rows = ProposalRows(((1.0, 0.0, 0.0, 0.0, 0.0), (0.0, 0.0, 0.0, 0.0, 1.0)), ((0.0,) * 4, (1.0,) * 4), 3.0)
    costs, alphas, T = [pooled, FLAT[2]], [(1.0,) * 4], [4]
    alike = batch_latency(costs, alphas, T, rows=16, max_new_tokens=128)[0]
    apart = batch_latency(costs, alphas, T, rows=16, max_new_tokens=128, spreads=[rows])[0]
    assert apart > 1.3 * alike and apart == pytest.approx(FLAT[2](1), rel=0.05)  # a token per round
    lone = [replace(pooled, rows=1), FLAT[2]]
    one_pooled = batch_latency(lone, alphas, T, rows=1, max_new_tokens=128, runs=64)[0]
    assert _close(
        batch_latency(lone, alphas, T, rows=1, max_new_tokens=128, runs=64, spreads=[rows]), one_pooled
    )


def test_only_a_proposal_level_has_rows_of_its_own() -> None:
    rows = ProposalRows(((1.0, 0.0),), ((0.5,),), 0.0)
    with pytest.raises(ValueError, match="only a proposal level"):
        batch_latency(FLAT[1:], [0.7], [4], rows=2, spreads=[rows])
    with pytest.raises(ValueError, match="only a proposal level"):
        batch_latency(
            [LookupCost(0.0002, (1.0, 0.0)), *FLAT[1:]], [(0.5,), 0.7], [1, 4], rows=2, spreads=[0.0, rows]
        )
