"""`hsd_fast.row_spread`: how far apart the rows of a batch accept, measured from per-context
scores and drawn by the batch replay (docs/design.md, "Rows that accept apart"). Pure math."""

import math
import statistics

import numpy as np
import pytest

from hsd_fast.row_spread import row_rate, spread


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
