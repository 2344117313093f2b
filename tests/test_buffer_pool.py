"""``buffer_pool.BufferPool``: a run's buffers serve the next run of the same shapes (on CUDA that keeps
the addresses the compiled steps' graphs were recorded for), zeroed, never while their first
owner lives; and runs through a pool decode exactly what runs without one do."""

from __future__ import annotations

import gc

import pytest
import torch

from hsd_fast import Tree, buffer_pool, run_hsd
from hsd_fast.buffer_pool import BufferPool
from hsd_fast.testing.tables import TableRunner, table_family

CPU = torch.device("cpu")


class _Owner:
    """Stands for a run's DecodeState."""


def test_a_collected_owners_buffer_serves_the_next_owner_zeroed() -> None:
    pool = BufferPool(frozenset({"cpu"}))
    first = _Owner()
    buffer = pool.zeros(first, (2, 3), torch.int64, CPU)
    buffer.fill_(7)
    second = _Owner()
    other = pool.zeros(second, (2, 3), torch.int64, CPU)
    assert other.data_ptr() != buffer.data_ptr()  # the first owner lives: never shared
    del first
    gc.collect()
    assert pool.free_buffers == 1
    again = pool.zeros(_Owner(), (2, 3), torch.int64, CPU)
    assert again.data_ptr() == buffer.data_ptr() and not again.any()
    other_dtype = pool.zeros(_Owner(), (2, 3), torch.float32, CPU)  # in the key, as the shape is
    assert other_dtype.data_ptr() != buffer.data_ptr()


def test_the_pool_keeps_its_most_recent_shapes_only() -> None:
    pool = BufferPool(frozenset({"cpu"}), max_shapes=2)
    kept = []  # the buffers stay referenced here, so a new allocation cannot reuse their memory
    for rows in (1, 2, 3):
        owner = _Owner()
        kept.append(pool.zeros(owner, (rows, 4), torch.int64, CPU))
        del owner
    gc.collect()
    assert pool.free_buffers == 2
    assert pool.zeros(_Owner(), (1, 4), torch.int64, CPU).data_ptr() != kept[0].data_ptr()  # dropped
    assert pool.zeros(_Owner(), (3, 4), torch.int64, CPU).data_ptr() == kept[2].data_ptr()


def test_other_devices_are_not_pooled() -> None:
    pool = BufferPool()  # CUDA only, the default
    owner = _Owner()
    pool.zeros(owner, (2, 2), torch.int64, CPU)
    del owner
    gc.collect()
    assert pool.free_buffers == 0


@pytest.mark.parametrize("tree", [None, Tree.full([2, 2])], ids=["chain", "tree"])
def test_runs_through_a_pool_decode_what_runs_without_one_do(tree: Tree | None, monkeypatch) -> None:
    """Sampled runs, one after the other with other seeds, through the pool (so the second takes
    the first's token buffer, q ring and tree buffers): the same tokens as without it."""
    levels = [TableRunner(m) for m in table_family(6, 2, 3, spread=2.0, seed=5)]
    prompts = [torch.tensor([0, 1]), torch.tensor([3, 2, 1, 0, 2])]
    kwargs = {"block_sizes": [1, 2], "max_new_tokens": 12, "eos_token_id": 3, "greedy": False, "tree": tree}

    def tokens(seed: int) -> list[list[int]]:
        return [s.tolist() for s in run_hsd(levels, prompts, seeds=seed, **kwargs).sequences]

    expected = [tokens(seed) for seed in (1, 2, 3)]
    monkeypatch.setattr(buffer_pool.POOL, "device_types", frozenset({"cpu", "cuda"}))
    monkeypatch.setattr(buffer_pool.POOL, "_free", {})
    held = []
    for seed, want in zip((1, 2, 3), expected, strict=True):
        assert tokens(seed) == want
        gc.collect()
        held.append(buffer_pool.POOL.free_buffers)
    # tokens, q logits, q log-sum-exps (and the tree's two): each run takes them again, adds none
    assert held[0] >= 3 and held == [held[0]] * 3
