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

A proposal level (the lookup level) differs between rows mostly in how often anything matches,
which no shift of its rates describes: its pairs keep the calibration rows' own profiles instead
(``ProposalRows``), each shrunk towards the pooled profile by the share of their spread that is not
the noise of a few dozen calls, and a simulated row takes one of them whole (drawn independently
of ``z``: on the zoo's calibration a row's lookup success and its ``xxs``-by-``s`` agreement
correlate at 0.18).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
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


@dataclass(frozen=True)
class ProposalRows:
    """How the rows of a proposal level's pair (a lookup level, a draft with another tokenizer,
    under a model) differ: its calibration rows' own profiles, each shrunk towards the pooled one
    (``shrunk``). Its rows differ mostly in how often anything matches, which no shift of the rates
    describes: a simulated row takes one calibration row's profile whole.

    ``lengths[r]``: the fraction of row r's calls that offer b tokens (``LookupCost.lengths``);
    ``rates[r]``: the rate per block position at which the model accepts them; ``sigma``: the
    spread of the profiles' first-token success (an offer whose first token is accepted) in
    log-odds, for a model that prices a pair by one shift (``LatencyController``)."""

    lengths: tuple[tuple[float, ...], ...]
    rates: tuple[tuple[float, ...], ...]
    sigma: float

    def __post_init__(self) -> None:
        if not self.lengths or len(self.lengths) != len(self.rates):
            raise ValueError(
                f"ProposalRows needs one lengths and one rates per row, got {len(self.lengths)} and "
                f"{len(self.rates)}"
            )

    @classmethod
    def shrunk(
        cls,
        calls: Sequence[int],  # [N] each calibration row's calls
        lengths: Sequence[Sequence[float]],  # [N][max_T + 1] each row's lengths offered
        rates: Sequence[Sequence[float]],  # [N][max_T] each row's rates per position
        pooled_lengths: Sequence[float],
        pooled_rates: Sequence[float],
    ) -> ProposalRows:
        """The rows' profiles, each ``w * row + (1 - w) * pooled``: a row's profile measured over a
        few dozen calls is partly noise, which would spread the rows further apart than their texts
        do. ``w`` is the share of the rows' variance in first-token success that the noise does not
        explain (empirical Bayes: 1 - mean binomial noise / observed variance, clipped to [0, 1])."""
        n = np.asarray(calls, dtype=np.float64)
        row_lengths, row_rates = np.asarray(lengths, dtype=np.float64), np.asarray(rates, dtype=np.float64)
        if n.ndim != 1 or row_lengths.shape[0] != n.size or row_rates.shape[0] != n.size or (n < 1).any():
            raise ValueError(f"ProposalRows.shrunk needs a profile per row and calls >= 1, got calls {calls}")
        success = (1 - row_lengths[:, 0]) * row_rates[:, 0]  # [N] an offer made and its first token taken
        observed = float(success.var(ddof=1)) if n.size > 1 else 0.0
        noise = float((success * (1 - success) / n).mean())
        weight = 0.0 if observed <= 0 else min(1.0, max(0.0, 1 - noise / observed))
        mixed_lengths = weight * row_lengths + (1 - weight) * np.asarray(pooled_lengths, dtype=np.float64)
        mixed_rates = weight * row_rates + (1 - weight) * np.asarray(pooled_rates, dtype=np.float64)
        mixed_success = np.clip((1 - mixed_lengths[:, 0]) * mixed_rates[:, 0], 0.5 / n, 1 - 0.5 / n)
        sigma = float(np.log(mixed_success / (1 - mixed_success)).std(ddof=1)) if n.size > 1 else 0.0
        return cls(
            tuple(tuple(map(float, row)) for row in mixed_lengths),
            tuple(tuple(map(float, row)) for row in mixed_rates),
            sigma,
        )


Spread = float | ProposalRows
"""A pair's entry in a spread matrix: a log-odds spread for two models, the rows themselves for a
proposal level under a model."""


def sigma_of(spread: Spread) -> float:
    """A pair's spread as one log-odds shift."""
    return spread.sigma if isinstance(spread, ProposalRows) else float(spread)
