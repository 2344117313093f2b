"""`hsd_fast.row_spread`: how far apart the rows of a batch accept, measured from per-context
scores and drawn by the batch replay (docs/design.md, "Rows that accept apart"). Pure math."""

import math
import statistics

import numpy as np
import pytest

from hsd_fast.row_spread import ProposalRows, row_rate, sigma_of, spread


def _bernoulli_scores(rates: np.ndarray, contexts: int, seed: int) -> np.ndarray:
    """[len(rates), contexts] 0/1 agreements, each text at its own rate."""
    rng = np.random.default_rng(seed)
    return (rng.random((len(rates), contexts)) < rates[:, None]).astype(np.float64)


def test_texts_alike_have_no_spread_beyond_their_noise() -> None:
    """64 texts all at 0.75, 128 contexts each: their measured rates differ by binomial noise alone
    (log-odds std about 0.2), which the estimate takes off."""
    scores = _bernoulli_scores(np.full(64, 0.75), 128, seed=0)
    noisy = np.log(scores.mean(1) / (1 - scores.mean(1))).std()
    assert noisy > 0.1  # the noise is there to be taken off
    assert spread(scores) < 0.1


@pytest.mark.parametrize("sigma", [0.5, 1.0, 2.0])
def test_texts_apart_give_their_log_odds_spread(sigma: float) -> None:
    rng = np.random.default_rng(1)
    rates = 1 / (1 + np.exp(-(1.0 + sigma * rng.standard_normal(400))))
    scores = _bernoulli_scores(rates, 256, seed=2)
    assert spread(scores) == pytest.approx(float(np.log(rates / (1 - rates)).std()), rel=0.15)


def test_sampled_scores_take_their_own_noise() -> None:
    """Under sampling a context scores sum min(p, q) in [0, 1], noisier than nothing and less than a
    coin: texts alike, each context's score drawn around 0.75, still have no spread."""
    rng = np.random.default_rng(3)
    scores = np.clip(0.75 + 0.2 * rng.standard_normal((64, 128)), 0, 1)
    assert spread(scores) < 0.05


def test_spread_needs_texts_and_contexts() -> None:
    assert spread(np.ones((1, 50))) == 0.0  # one text: nothing to spread over
    assert spread(np.ones((5, 1))) == 0.0
    with pytest.raises(ValueError, match=r"\[texts, contexts\]"):
        spread(np.ones(5))


@pytest.mark.parametrize("alpha", [0.3, 0.75, 0.97])
@pytest.mark.parametrize("sigma", [0.5, 2.0])
def test_rows_keep_the_pairs_mean_rate(alpha: float, sigma: float) -> None:
    """Rows drawn at random z average the pair's rate (the shift keeps the mean), and spread apart."""
    rng = np.random.default_rng(4)
    rows = [row_rate(alpha, sigma, float(z)) for z in rng.standard_normal(20_000)]
    assert statistics.fmean(rows) == pytest.approx(alpha, abs=0.006)
    assert min(rows) < alpha < max(rows)
    assert row_rate(alpha, sigma, -1.0) < row_rate(alpha, sigma, 0.0) < row_rate(alpha, sigma, 1.0)


def test_rates_per_position_all_move_and_edges_stay() -> None:
    moved = row_rate((0.6, 0.8, 0.9), 1.0, -1.0)
    assert isinstance(moved, tuple) and all(m < a for m, a in zip(moved, (0.6, 0.8, 0.9), strict=True))
    assert row_rate(0.7, 0.0, -2.0) == 0.7  # no spread: the pair's rate
    assert row_rate(1.0, 1.5, -2.0) == 1.0 and row_rate(0.0, 1.5, 2.0) == 0.0  # no log-odds to move
    assert math.isclose(row_rate((0.5,), 1.0, 0.0)[0], 0.5, abs_tol=1e-6)  # symmetric about 1/2


# ----------------------------------------------------------------------------- a proposal level's rows
def _lookup_rows(match: np.ndarray, calls: int, seed: int) -> tuple[list, list, list]:
    """Calibration rows of a lookup that offers 4 tokens (or nothing) with probability ``match[r]``
    and has them all accepted: each row's calls, lengths offered and rates, as a replay of ``calls``
    calls per row measures them."""
    rng = np.random.default_rng(seed)
    offered = (rng.random((len(match), calls)) < match[:, None]).mean(1)  # [N] measured
    lengths = [[1 - o, 0.0, 0.0, 0.0, o] for o in offered]
    return [calls] * len(match), lengths, [[1.0] * 4] * len(match)


def test_rows_alike_are_shrunk_to_the_pooled_profile() -> None:
    """32 rows all matching half their calls, 25 calls each: their measured profiles differ by
    binomial noise alone, which the shrinkage takes off (every row about the pooled one)."""
    calls, lengths, rates = _lookup_rows(np.full(32, 0.5), 25, seed=0)
    assert np.std([row[0] for row in lengths]) > 0.05  # the noise is there to be taken off
    rows = ProposalRows.shrunk(calls, lengths, rates, [0.5, 0, 0, 0, 0.5], [1.0] * 4)
    assert max(abs(row[0] - 0.5) for row in rows.lengths) < 0.04
    assert rows.sigma < 0.15


def test_rows_apart_keep_their_own_profiles() -> None:
    """Half the rows never match, half nearly always: the noise is a small part of their spread, so
    each keeps most of its own profile (and a large log-odds spread)."""
    calls, lengths, rates = _lookup_rows(np.repeat([0.02, 0.95], 16), 40, seed=1)
    rows = ProposalRows.shrunk(calls, lengths, rates, [0.5, 0, 0, 0, 0.5], [1.0] * 4)
    nothing = sorted(row[0] for row in rows.lengths)
    assert max(nothing[:16]) < 0.15 and min(nothing[16:]) > 0.85
    assert rows.sigma > 2 and sigma_of(rows) == rows.sigma and sigma_of(1.5) == 1.5


def test_proposal_rows_refuse_profiles_that_do_not_match() -> None:
    with pytest.raises(ValueError, match="a profile per row"):
        ProposalRows.shrunk([10, 10], [[1.0, 0.0]], [[0.5]], [1.0, 0.0], [0.5])
    with pytest.raises(ValueError, match="calls >= 1"):
        ProposalRows.shrunk([10, 0], [[1.0, 0.0]] * 2, [[0.5]] * 2, [1.0, 0.0], [0.5])
    with pytest.raises(ValueError, match="one lengths and one rates per row"):
        ProposalRows(((1.0,),), (), 0.0)
