"""The pooled chi-square test used by the distribution tests and the demo."""

import pytest
import torch
from scipy import stats

from hsd_fast.testing.exactness import pooled_chi_square


def test_agrees_with_scipy_without_pooling() -> None:
    exact = {"a": 0.5, "b": 0.3, "c": 0.2}
    samples = ["a"] * 480 + ["b"] * 330 + ["c"] * 190
    ours = pooled_chi_square(samples, exact)
    ref = stats.chisquare([480, 330, 190], [500, 300, 200])
    assert ours.statistic == pytest.approx(ref.statistic)
    assert ours.p_value == pytest.approx(ref.pvalue, rel=1e-6)
    assert ours.dof == 2


def test_pools_rare_cells() -> None:
    exact = {"a": 0.9, "b": 0.09, "c": 0.005, "d": 0.005}  # c, d expected 1 each in 200
    result = pooled_chi_square(["a"] * 180 + ["b"] * 18 + ["c", "d"], exact)
    # c and d (1 + 1 expected) pool into 2 < 5, so the pool merges into b: two cells remain
    assert result.cells == 2


def test_detects_a_wrong_distribution() -> None:
    gen = torch.Generator().manual_seed(0)
    draws = torch.multinomial(torch.tensor([0.4, 0.3, 0.3]), 20_000, True, generator=gen)
    result = pooled_chi_square(draws.tolist(), {0: 0.5, 1: 0.25, 2: 0.25})
    assert result.p_value < 1e-6


def test_refuses_samples_outside_the_support() -> None:
    with pytest.raises(ValueError, match="outside"):
        pooled_chi_square(["z"], {"a": 1.0})
