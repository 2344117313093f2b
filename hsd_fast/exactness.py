"""Checking sampled outputs against an exact distribution: a chi-square test with pooled cells."""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable, Mapping
from typing import NamedTuple

import torch


class ChiSquare(NamedTuple):
    statistic: float
    dof: int
    p_value: float
    cells: int  # cells after pooling


def pooled_chi_square(
    samples: Iterable[Hashable], exact: Mapping[Hashable, float], min_expected: float = 5.0
) -> ChiSquare:
    """Pearson's chi-square of ``samples`` against the probabilities ``exact`` (which must cover
    every sample). Cells expected fewer than ``min_expected`` times are pooled into one cell (the
    pool is merged into the smallest remaining cell if it is itself too small)."""
    counts = Counter(samples)
    unknown = set(counts) - set(exact)
    if unknown:
        raise ValueError(f"samples outside the exact distribution's support: {sorted(unknown)[:5]}")
    n = sum(counts.values())
    cells = sorted(((n * p, counts.get(k, 0)) for k, p in exact.items()), reverse=True)
    kept = [c for c in cells if c[0] >= min_expected]
    pool = (sum(e for e, _ in cells[len(kept) :]), sum(o for _, o in cells[len(kept) :]))
    if pool[0] > 0:
        if pool[0] < min_expected and kept:
            e, o = kept.pop()
            pool = (pool[0] + e, pool[1] + o)
        kept.append(pool)
    expected = torch.tensor([e for e, _ in kept], dtype=torch.float64)
    observed = torch.tensor([o for _, o in kept], dtype=torch.float64)
    statistic = float(((observed - expected) ** 2 / expected).sum())
    dof = len(kept) - 1
    # P(chi2_dof >= statistic) = Q(dof / 2, statistic / 2), the regularised upper gamma function.
    p_value = float(torch.special.gammaincc(torch.tensor(dof / 2), torch.tensor(statistic / 2)))
    return ChiSquare(statistic, dof, p_value if dof > 0 else 1.0, len(kept))
