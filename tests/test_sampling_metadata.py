"""SamplingMetadata: per-row seeds, temperatures and EOS ids, validated and placed on the device."""

import pytest
import torch

from hsd_fast.sampling_metadata import SamplingMetadata, epoch_seeds, row_seeds, run_seeds


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


@pytest.mark.parametrize("temperature", [0.0, -1.0, float("nan"), float("inf"), [1.0, 0.0, 1.0]])
def test_build_refuses_a_temperature_that_is_not_positive_and_finite(temperature) -> None:
    with pytest.raises(ValueError, match="temperature must be finite and > 0"):
        SamplingMetadata.build(3, torch.device("cpu"), temperature=temperature)
    SamplingMetadata.build(3, torch.device("cpu"), temperature=temperature, greedy=True)  # unused there


def test_build_refuses_temperatures_of_the_wrong_shape() -> None:
    for temperature in ([1.0, 1.0], [[1.0, 1.0, 1.0]]):
        with pytest.raises(ValueError, match=r"temperature must be one float or one per row \(3\)"):
            SamplingMetadata.build(3, torch.device("cpu"), temperature=temperature)


def test_run_hsd_refuses_a_zero_temperature_where_the_ops_read_no_values(monkeypatch) -> None:
    """On CUDA the ops check no tensor values (that would cost a sync per call), so ``run_hsd`` must
    refuse a bad temperature itself: here the ops are made to skip their value checks as on CUDA."""
    from hsd_fast.engine import run_hsd
    from hsd_fast.testing.tables import TableRunner, table_family
    from hsd_fast.triton_kernels import checks

    monkeypatch.setattr(checks, "host_values", lambda tensor: False)
    runners = [TableRunner(m) for m in table_family(vocab_size=5, order=2, num_levels=2)]
    with pytest.raises(ValueError, match="temperature"):
        run_hsd(runners, [torch.tensor([0, 1])] * 2, block_sizes=[2], max_new_tokens=6, temperature=0.0)


def test_a_policys_later_runs_are_keyed_apart_from_its_first_and_from_every_epoch() -> None:
    """``run_seeds``: a policy's first run keeps the seeds (a fresh policy's runs are reproducible);
    each later run has seeds of its own, none an epoch's of the first run or of each other."""
    seeds = row_seeds(7, 4)
    assert torch.equal(run_seeds(seeds, 0), seeds)
    later = [run_seeds(seeds, n) for n in (1, 2, 3)]
    keyed = {tuple(seeds.tolist())} | {tuple(epoch_seeds(seeds, e).tolist()) for e in range(1, 9)}
    assert len({tuple(s.tolist()) for s in later} | keyed) == len(later) + len(keyed)
    built = SamplingMetadata.build(4, torch.device("cpu"), 7, runs_before=2)
    assert torch.equal(built.seeds, later[1]) and built.host_seeds.tolist() == later[1].tolist()
