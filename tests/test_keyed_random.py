"""Keyed randomness: the Triton device functions equal the torch reference bit for bit (tests marked
``triton``), and the uniforms look uniform and independent across the parts of the key."""

import pytest
import torch
from keyed_hash import hash_bits, position_hashing_to
from scipy import stats

from hsd_fast.triton_kernels import keyed_random_torch as kr

SEEDS = torch.tensor([0, 1, 2**40 + 7, -5, 2**63 - 1], dtype=torch.int64)
POSITIONS = torch.tensor([0, 5, 100, 2**31 + 3, 7], dtype=torch.int64)


def _uniform_triton(*args) -> torch.Tensor:
    from hsd_fast.triton_kernels.keyed_random import uniform_triton  # imports Triton

    return uniform_triton(*args)


@pytest.mark.triton
@pytest.mark.parametrize(("level", "purpose"), [(0, kr.DRAFT), (3, kr.RESIDUAL), (2**20, kr.BONUS)])
def test_triton_equals_torch(level: int, purpose: int) -> None:
    ref = kr.uniform_grid_torch(SEEDS, level, POSITIONS, purpose, 37)
    tri = _uniform_triton(SEEDS, level, POSITIONS, purpose, 37)
    assert torch.equal(ref, tri)


def test_matches_the_documented_hash_in_plain_python() -> None:
    seed, level, pos, purpose, index = 2**40 + 7, 3, 100, kr.RESIDUAL, 5
    expected = ((hash_bits(seed, level, pos, purpose, index) >> 9) + 0.5) * 2**-23
    got = kr.uniform_grid_torch(torch.tensor([seed]), level, torch.tensor([pos]), purpose, 6)
    assert got[0, index].item() == expected


EXTREMES = pytest.mark.parametrize(
    ("bits", "expected"), [(0xFFFFFFFF, 1 - 2**-24), (0, 2**-24)], ids=["top", "bottom"]
)


def _at_extreme_hash(bits: int) -> tuple:
    """(seed, level, position, purpose, index) at which the hash of ``index`` is ``bits``."""
    seed, level, purpose, index = 2**40 + 7, 2, kr.DRAFT, 3
    return seed, level, torch.tensor([position_hashing_to(bits, seed, level, purpose, index)]), purpose, index


@EXTREMES
def test_extreme_hashes_give_uniforms_strictly_inside_the_interval(bits: int, expected: float) -> None:
    """u == 1.0 would make the race's Gumbel key +inf: that token would win whatever its weight."""
    seed, level, pos, purpose, index = _at_extreme_hash(bits)
    ref = kr.uniform_grid_torch(torch.tensor([seed]), level, pos, purpose, 8)
    assert ref[0, index].item() == expected
    assert torch.isfinite(-torch.log(-torch.log(ref))).all()


@pytest.mark.triton
@EXTREMES
def test_triton_equals_torch_at_the_extreme_hashes(bits: int, expected: float) -> None:
    seed, level, pos, purpose, _ = _at_extreme_hash(bits)
    ref = kr.uniform_grid_torch(torch.tensor([seed]), level, pos, purpose, 8)
    assert torch.equal(_uniform_triton(torch.tensor([seed]), level, pos, purpose, 8), ref)


def test_race_never_draws_an_impossible_token_at_the_top_uniform() -> None:
    seed, level, purpose, index = 11, 1, kr.RESIDUAL, 3
    pos = torch.tensor([position_hashing_to(0xFFFFFFFF, seed, level, purpose, index)] * 2)
    log_weights = torch.zeros(2, 8)
    log_weights[0, index] = -float("inf")
    log_weights[1, index] = -200.0  # possible, but e**-200 of the others' weight
    drawn = kr.race_torch(log_weights, torch.tensor([seed] * 2), level, pos, purpose)
    assert index not in drawn.tolist()


def test_uniform_and_in_open_interval() -> None:
    seeds = torch.arange(2000)
    u = kr.uniform_grid_torch(seeds, 1, torch.arange(2000) * 3, kr.ACCEPT, 50).flatten()
    assert u.min().item() > 0.0 and u.max().item() < 1.0
    assert stats.kstest(u.double().numpy(), "uniform").pvalue > 1e-3


@pytest.mark.parametrize(
    "other",
    [
        {"level": 1},
        {"purpose": kr.BONUS},
        {"positions": POSITIONS + 1},
        {"seeds": SEEDS + 1},
    ],
)
def test_every_part_of_the_key_changes_the_numbers(other: dict) -> None:
    base = {"seeds": SEEDS, "level": 0, "positions": POSITIONS, "purpose": kr.ACCEPT}
    a = kr.uniform_grid_torch(**base, vocab_size=64)
    b = kr.uniform_grid_torch(**{**base, **other}, vocab_size=64)
    assert (a != b).float().mean() > 0.99
    # and they are uncorrelated, not merely different
    assert abs(torch.corrcoef(torch.stack([a.flatten(), b.flatten()]))[0, 1].item()) < 0.15
