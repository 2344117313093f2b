"""Keyed randomness: the Triton device functions equal the torch reference bit for bit, and the
uniforms look uniform and independent across the parts of the key."""

import pytest
import torch
from scipy import stats

from hsd_fast.triton_kernels import keyed_random as kr

SEEDS = torch.tensor([0, 1, 2**40 + 7, -5, 2**63 - 1], dtype=torch.int64)
POSITIONS = torch.tensor([0, 5, 100, 2**31 + 3, 7], dtype=torch.int64)


@pytest.mark.parametrize(("level", "purpose"), [(0, kr.DRAFT), (3, kr.RESIDUAL), (2**20, kr.TREE)])
def test_triton_equals_torch(level: int, purpose: int) -> None:
    ref = kr.uniform_grid_torch(SEEDS, level, POSITIONS, purpose, 37)
    tri = kr.uniform_triton(SEEDS, level, POSITIONS, purpose, 37)
    assert torch.equal(ref, tri)


def test_matches_the_documented_hash_in_plain_python() -> None:
    def mix(x: int) -> int:
        x ^= x >> 16
        x = (x * 0x7FEB352D) & 0xFFFFFFFF
        x ^= x >> 15
        x = (x * 0x846CA68B) & 0xFFFFFFFF
        return x ^ (x >> 16)

    seed, level, pos, purpose, index = 2**40 + 7, 3, 100, kr.RESIDUAL, 5
    h = mix(0x9E3779B9)
    for part in (seed & 0xFFFFFFFF, seed >> 32, (level << 8) | purpose, pos, index):
        h = mix(h ^ part)
    expected = ((h >> 8) + 0.5) * 2**-24
    got = kr.uniform_grid_torch(torch.tensor([seed]), level, torch.tensor([pos]), purpose, 6)
    assert got[0, index].item() == expected


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
