"""The drafting kernels equal their torch reference: identical tokens, matching log-sum-exp.

On CPU under the Triton interpreter (conftest.py) on tiny shapes; `-m gpu` runs real sizes and
bf16 natively on CUDA."""

import pytest
import torch
from keyed_hash import position_hashing_to

pytest.importorskip("triton")  # every test here runs a kernel: none without Triton

from hsd_fast.triton_kernels import split
from hsd_fast.triton_kernels.keyed_random_torch import DRAFT
from hsd_fast.triton_kernels.sampling import sample_triton
from hsd_fast.triton_kernels.sampling_torch import sample_torch

pytestmark = pytest.mark.triton


def _case(rows: int, vocab: int, dtype: torch.dtype, seed: int, topk: int | None = None):
    gen = torch.Generator().manual_seed(seed)
    logits = 2 * torch.randn(rows, vocab, generator=gen)
    if topk is not None:  # whole chunks at -inf
        kth = logits.topk(topk, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, -float("inf"))
    temperature = torch.rand(rows, generator=gen) + 0.5
    seeds = torch.randint(0, 2**40, (rows,), generator=gen)
    positions = torch.randint(0, 500, (rows,), generator=gen)
    return logits.to(dtype), temperature, seeds, positions


def _assert_same(out, ref, atol: float = 1e-5) -> None:
    assert out[0].tolist() == ref[0].tolist()
    torch.testing.assert_close(out[1], ref[1], atol=atol, rtol=1e-5)


# (rows, vocab, block, chunks): one block; a block and one past it, unsplit and split by the
# launcher; three chunks of two blocks, the last a 1-token block.
SHAPES = [(1, 7, None, None), (3, 65, 64, 1), (3, 65, 64, None), (2, 65, 16, 3)]


@pytest.mark.parametrize(("rows", "vocab", "block", "chunks"), SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("greedy", [False, True], ids=["sampled", "greedy"])
def test_sample_kernel_equals_reference(rows, vocab, block, chunks, dtype, greedy) -> None:
    for seed, topk in enumerate([None, 3]):
        args = _case(rows, vocab, dtype, seed, topk)
        ref = sample_torch(*args, level=0, purpose=DRAFT, greedy=greedy)
        _assert_same(
            sample_triton(*args, level=0, purpose=DRAFT, greedy=greedy, block_v=block, num_chunks=chunks), ref
        )


def test_sample_kernel_reduces_in_several_steps(monkeypatch) -> None:
    """9 chunks reduced 4 at a time."""
    monkeypatch.setattr(split, "BLOCK_C", 4)
    args = _case(2, 72, torch.float32, seed=3)
    ref = sample_torch(*args, level=1, purpose=DRAFT, greedy=False)
    _assert_same(sample_triton(*args, level=1, purpose=DRAFT, greedy=False, block_v=8, num_chunks=9), ref)


def test_an_impossible_token_is_never_drawn_at_the_top_uniform() -> None:
    """Where a token's uniform is the largest the hash can give, its Gumbel key must stay finite."""
    seed, index = 2**33 + 1, 5
    position = position_hashing_to(0xFFFFFFFF, seed, level=0, purpose=DRAFT, index=index)
    logits = torch.zeros(2, 9)
    logits[0, index] = -float("inf")
    logits[1, index] = -200.0
    args = (logits, torch.ones(2), torch.tensor([seed] * 2), torch.tensor([position] * 2))
    out = sample_triton(*args, level=0, purpose=DRAFT, greedy=False, block_v=4)
    assert index not in out[0].tolist()
    _assert_same(out, sample_torch(*args, level=0, purpose=DRAFT, greedy=False))


def test_the_draws_are_not_the_argmax() -> None:
    """Guard against a vacuous comparison: sampled draws differ from greedy ones in these cases."""
    args = _case(64, 65, torch.float32, seed=0)
    sampled = sample_torch(*args, level=0, purpose=DRAFT, greedy=False)[0]
    greedy = sample_torch(*args, level=0, purpose=DRAFT, greedy=True)[0]
    assert (sampled != greedy).float().mean() > 0.3


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("vocab", [32000, 128256, 151936])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("rows", [1, 8, 64])
def test_sample_kernel_equals_reference_on_cuda(vocab, dtype, rows) -> None:
    for seed, topk in enumerate([None, 50]):
        args = [a.cuda() for a in _case(rows, vocab, dtype, seed, topk)]
        for greedy in (False, True):
            ref = sample_torch(*args, level=0, purpose=DRAFT, greedy=greedy)
            _assert_same(sample_triton(*args, level=0, purpose=DRAFT, greedy=greedy), ref, atol=1e-4)
