"""How much a pair's acceptance differs between the rows of a batch (docs/design.md, "Rows that
accept apart").

Terms: a pair's *rate* ``alpha`` is its acceptance averaged over every context of the calibration
text; a *row's rate* is that average over one row's own text (one prompt and its continuation). Rows
on easy text accept more than rows on hard text, and a batch waits for its slowest row, so a batch
is slower than rows that all accept at ``alpha`` would make it. The *spread* ``sigma`` of a pair is
the standard deviation of its rows' rates in log-odds, net of the noise a rate measured over a
finite text carries: 0.0 where every text is alike.

A simulated row draws one standard normal ``z`` and takes, for every pair, the rate
``sigmoid(logit(alpha) + shift + sigma * z)``: one ``z`` for all pairs, because a text that is hard
for one draft is hard for the others; ``shift`` keeps the rows' mean rate at ``alpha``.
"""

from __future__ import annotations

import functools
import math
from statistics import NormalDist

import numpy as np

from hsd_fast.latency import Acceptance

_NODES, _WEIGHTS = np.polynomial.hermite_e.hermegauss(24)  # E[f(z)], z ~ N(0, 1), by quadrature
_WEIGHTS = _WEIGHTS / _WEIGHTS.sum()
_EDGE = 1e-6  # rates this close to 0 or 1 are taken as they are: their log-odds are unbounded


def spread(scores: np.ndarray) -> float:
    """A pair's spread from its per-context acceptance ``scores`` [N, L] (N texts of L contexts
    each: 1.0 / 0.0 whether two argmaxes agreed, or under sampling ``sum min(p, q)``): the variance
    of the texts' log-odds rates minus the mean variance their finite contexts alone would give
    (each text's, by the delta method: its contexts' variance / L over (r (1 - r))^2), clipped at 0."""
    if scores.ndim != 2:
        raise ValueError(f"spread needs scores [texts, contexts], got shape {tuple(scores.shape)}")
    texts, contexts = scores.shape
    if texts < 2 or contexts < 2:
        return 0.0
    scores = scores.astype(np.float64)
    # a rate of exactly 0 or 1 has no log-odds: shrink each by half a context towards 1/2
    rates = (scores.sum(1) + 0.5) / (contexts + 1)  # [N]
    log_odds = np.log(rates / (1 - rates))
    noise = scores.var(1, ddof=1) / contexts / (rates * (1 - rates)) ** 2  # [N]
    return math.sqrt(max(0.0, float(log_odds.var(ddof=1)) - float(noise.mean())))


def row_rate(alpha: Acceptance, sigma: float, z: float) -> Acceptance:
    """The rate of a row ``z`` standard deviations from the mean text, for a pair of rate ``alpha``
    (one rate or one per block position: each position moves) and spread ``sigma``."""
    if sigma <= 0.0:
        return alpha
    if isinstance(alpha, tuple):
        return tuple(_moved(a, sigma, z) for a in alpha)
    return _moved(alpha, sigma, z)


@functools.lru_cache(maxsize=64)  # asked at every scored hierarchy of a controller's decision
def slowest_row_z(rows: int) -> float:
    """Where the slowest of ``rows`` rows lies, in standard deviations: the expected smallest of
    ``rows`` standard normals (Blom's approximation; 0.0 for one row)."""
    if rows <= 1:
        return 0.0
    return NormalDist().inv_cdf(0.625 / (rows + 0.25))


def _moved(alpha: float, sigma: float, z: float) -> float:
    if not _EDGE < alpha < 1 - _EDGE:
        return alpha
    centre = math.log(alpha / (1 - alpha)) + _mean_keeping_shift(alpha, sigma)
    return 1 / (1 + math.exp(-(centre + sigma * z)))


@functools.lru_cache(maxsize=4096)  # a replay asks for the same few (rate, spread) for every row
def _mean_keeping_shift(alpha: float, sigma: float) -> float:
    """The shift c with E[sigmoid(logit(alpha) + c + sigma z)] = alpha, by bisection (the mean
    grows with c)."""
    base = math.log(alpha / (1 - alpha))
    low, high = -4 * sigma - 1, 4 * sigma + 1
    for _ in range(50):
        mid = (low + high) / 2
        mean = float(_WEIGHTS @ (1 / (1 + np.exp(-(base + mid + sigma * _NODES)))))
        low, high = (mid, high) if mean < alpha else (low, mid)
    return (low + high) / 2
