"""SamplingMetadata: per-row seeds, temperatures and EOS ids, validated and placed on the device."""

import pytest
import torch

from hsd_fast.sampling_metadata import SamplingMetadata, row_seeds


def test_one_int_seed_gives_each_row_its_own_seed_independent_of_the_batch() -> None:
    four, two = row_seeds(7, 4), row_seeds(7, 2)
    assert torch.equal(four[:2], two)  # row r gets the same seed in any batch
    assert len(set(four.tolist())) == 4
    assert not torch.equal(row_seeds(8, 4), four)
    assert row_seeds(2**63 - 1, 3).dtype == torch.int64


def test_build_broadcasts_and_converts() -> None:
    meta = SamplingMetadata.build(3, torch.device("cpu"), seeds=5, temperature=0.5, eos_token_id=[2, 9])
    assert meta.seeds.shape == (3,) and meta.seeds.dtype == torch.int64
    assert meta.temperature.tolist() == [0.5] * 3 and meta.temperature.dtype == torch.float32
    assert meta.eos_ids.tolist() == [2, 9] and not meta.greedy
    per_row = SamplingMetadata.build(
        2, torch.device("cpu"), seeds=torch.tensor([4, 5]), temperature=[1.0, 0.7]
    )
    assert per_row.seeds.tolist() == [4, 5] and per_row.temperature.tolist() == pytest.approx([1.0, 0.7])
    assert SamplingMetadata.build(1, torch.device("cpu"), eos_token_id=None).eos_ids.numel() == 0


def test_build_refuses_a_seed_per_row_of_the_wrong_length() -> None:
    with pytest.raises(ValueError, match="one per row"):
        SamplingMetadata.build(3, torch.device("cpu"), seeds=torch.tensor([1, 2]))
