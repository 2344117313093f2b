"""A running request's lookup counts carried to the lookup's replay at any block size (docs/design.md,
"Rates at each block size", *Carried to the other block sizes*).

Terms. A lookup level's profile holds a *replay* per block size T (``latency.DepthRates``): the
``lengths`` its calls offer (b = 0..T, ``LookupCost.lengths``) and a verifier's *rates* per block
position. Where a run's calls sit depends on T, so each T has its own. A run at block size T_run
counts *calls* (``[2, L]``: ended at length b, cut there by the block size) and *trials* per block
position (``[P]`` passed, tried); beside them the controller keeps what the replay at the T of each
count *expected* of it: the calls ending at b (the calls that reached b uncut x the replay's hazard
there) and the passes (the tries x the replay's rate).

The run's *surplus* over that expectation is what its text adds to the calibration's, and it is
added to every T's replay alike, shrunk by the prior's pseudo-counts:

    hazard_T(b) + (ended(b) - expected ended(b)) / (reached(b) + pseudo-calls reaching b)
    rate_T(p) + (passed(p) - expected passed(p)) / (tried(p) + pseudo-trials reaching p)

At the T that ran these are exactly the counts added to that replay as a prior (the product-limit
hazards, the pooled trials); at another T the replays keep their difference, which is where the calls
of a run at that T would sit. Positions and lengths the run never reached keep the replay's values."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hsd_fast.latency import rate_at


def hazards(lengths: Sequence[float]) -> np.ndarray:
    """``[len - 1]`` the share of proposals at least b long that end at b, b = 0..len - 2 (the
    last entry of ``lengths``, at least that long, ends nothing the replay saw)."""
    lengths = np.asarray(lengths, dtype=float)
    at_least = lengths[::-1].cumsum()[::-1][:-1]  # [len - 1] P(offers >= b)
    return np.divide(lengths[:-1], at_least, out=np.zeros(len(lengths) - 1), where=at_least > 0)


def from_hazards(hazard: Sequence[float]) -> tuple[float, ...]:
    """The lengths (``LookupCost.lengths``) whose hazards are ``hazard``, the last entry: the rest."""
    out, survive = [], 1.0
    for h in hazard:
        out.append(survive * float(h))
        survive *= 1.0 - float(h)
    return (*out, survive)


def reaching_calls(counts: np.ndarray) -> np.ndarray:
    """``[L]`` the calls of ``counts`` (``[2, L]``: ended at b, cut at b) that reached length b
    and say whether they end there: those that ended at b or later, or were cut later."""
    ended, cut = counts
    return ended[::-1].cumsum()[::-1] + np.append(cut[::-1].cumsum()[::-1][1:], 0.0)


def expected_ends(calls: np.ndarray, lengths: Sequence[float]) -> np.ndarray:
    """``[L]`` the calls of ``calls`` (``[2, L]``) the replay with ``lengths`` expected to end at
    each length (past the replay's lengths: none)."""
    hazard = np.zeros(calls.shape[1])
    own = hazards(lengths)[: calls.shape[1]]
    hazard[: len(own)] = own
    return reaching_calls(calls) * hazard


def expected_passes(tried: np.ndarray, rates: tuple[float, ...]) -> np.ndarray:
    """``[P]`` the passes of ``tried`` ``[P]`` trials per position under the replay's ``rates``
    (positions past them at its last rate: ``latency.rate_at``)."""
    return tried * np.array([rate_at(rates, p + 1) for p in range(len(tried))])


def carried_lengths(
    lengths: Sequence[float], calls: np.ndarray, expected: np.ndarray, prior_calls: float
) -> tuple[float, ...]:
    """A replay's ``lengths`` with the run's surplus of ended calls over ``expected``
    (``expected_ends`` at the T of each count) added to its hazards, ``prior_calls`` pseudo-calls
    of the replay shrinking it (module doc)."""
    lengths = np.asarray(lengths, dtype=float)
    hazard = hazards(lengths)
    n = min(len(hazard), calls.shape[1])
    pseudo = prior_calls * lengths[::-1].cumsum()[::-1][:n]  # [n] pseudo-calls reaching b
    reached = reaching_calls(calls)[:n] + pseudo
    surplus = np.divide(calls[0, :n] - expected[:n], reached, out=np.zeros(n), where=reached > 0)
    hazard[:n] = np.clip(hazard[:n] + surplus, 0.0, 1.0)
    return from_hazards(hazard)


def carried_rates(
    rates: Sequence[float], passed: np.ndarray, tried: np.ndarray, expected: np.ndarray, weights: np.ndarray
) -> tuple[float, ...]:
    """A replay's per-position ``rates`` with the run's surplus of passes over ``expected``
    (``expected_passes`` at the T of each count) added, ``weights`` ``[len(rates)]`` pseudo-trials
    of the replay at each position shrinking it (module doc)."""
    out = np.asarray(rates, dtype=float).copy()
    n = min(len(out), len(tried))
    trials = tried[:n] + weights[:n]
    surplus = np.divide(passed[:n] - expected[:n], trials, out=np.zeros(n), where=trials > 0)
    out[:n] = np.clip(out[:n] + surplus, 0.0, 1.0)
    return tuple(float(r) for r in out)
