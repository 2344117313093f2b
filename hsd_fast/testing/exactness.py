"""Checking sampled outputs against an exact distribution: a chi-square test with pooled cells, and
``table_check``, which samples HSD over table models and tests the result against the target's exact
distribution."""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch

from hsd_fast.engine import HSDResult, run_hsd
from hsd_fast.testing.tables import TableRunner, table_family


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


@dataclass
class TableCheck:
    samples: list[tuple[int, ...]]  # continuation of every row
    exact: dict[tuple[int, ...], float]
    chi_square: ChiSquare
    result: HSDResult


def table_check(
    *,
    block_sizes: Sequence[int],
    num_samples: int = 40_000,
    steps: int = 4,
    vocab_size: int = 4,
    order: int = 2,
    spread: float = 2.0,
    temperature: float = 1.0,
    eos_token_id: int | None = None,
    family_seed: int = 1,
    seed: int = 0,
    policy: str = "most_rows",
) -> TableCheck:
    """Sample ``num_samples`` continuations of ``steps`` tokens, as rows of one batch, with a
    hierarchy of ``len(block_sizes) + 1`` table models; test them against the exact distribution."""
    family = table_family(vocab_size, order, len(block_sizes) + 1, spread=spread, seed=family_seed)
    prompt = torch.arange(order) % vocab_size
    result = run_hsd(
        [TableRunner(m) for m in family],
        [prompt] * num_samples,
        block_sizes=block_sizes,
        max_new_tokens=steps,
        eos_token_id=eos_token_id,
        seeds=seed,
        temperature=temperature,
        policy=policy,
    )
    samples = [tuple(s[order:].tolist()) for s in result.sequences]
    exact = family[-1].continuation_probs(prompt.tolist(), steps, temperature, eos_token_id)
    return TableCheck(samples, exact, pooled_chi_square(samples, exact), result)
