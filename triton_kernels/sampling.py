"""Drawing one token per row from logits with keyed randomness (the drafting step of level 0).

``sample_torch`` (``sampling_torch.py``) is the reference; ``sample_triton`` here draws the same
tokens with two launches, the vocabulary split across programs as in verification (split.py):

    1. _sample_chunk_kernel [R, C]  per chunk: max and sum of exp of logits / temperature, and the
                                    exponential race's best key (greedy: the largest logit)
    2. _sample_pick_kernel  [R]     chunks -> the token and the fp32 log-sum-exp

The race needs no normaliser (argmax of x + Gumbel is invariant to shifting x), so the token and the
log-sum-exp come out of the same single read of the logits. ``sample`` (from ``ops.py``) picks the
kernels for CUDA tensors.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import checks, split
from .keyed_random import key_state
from .split import NO_SPECIALIZE, fold_argmax, fold_lse, plan, scan_chunk

__all__ = ["sample_triton"]

_BAD_TEMPERATURE: tl.constexpr = tl.constexpr(checks.TEMPERATURE_NOT_POSITIVE)


@triton.jit(do_not_specialize=NO_SPECIALIZE)
def _sample_chunk_kernel(
    logits_ptr, stride, temp_ptr, seeds_ptr, positions_ptr, max_ptr, sum_ptr, key_ptr, idx_ptr,
    V, level, purpose, chunk_size, num_chunks,
    GREEDY: tl.constexpr, BLOCK_V: tl.constexpr,
):  # fmt: skip
    row, chunk = tl.program_id(0), tl.program_id(1)
    state = key_state(tl.load(seeds_ptr + row), level, tl.load(positions_ptr + row), purpose)
    run_max, run_sum, best, best_idx = scan_chunk(
        logits_ptr + row.to(tl.int64) * stride, chunk, chunk_size, V, tl.load(temp_ptr + row), state,
        ARGMAX=True, RACE=not GREEDY, BLOCK_V=BLOCK_V,
    )  # fmt: skip
    out = row * num_chunks + chunk
    tl.store(max_ptr + out, run_max)
    tl.store(sum_ptr + out, run_sum)
    tl.store(key_ptr + out, best)
    tl.store(idx_ptr + out, best_idx)


@triton.jit(do_not_specialize=NO_SPECIALIZE)
def _sample_pick_kernel(
    max_ptr, sum_ptr, key_ptr, idx_ptr, token_ptr, lse_ptr, temp_ptr, err_ptr, num_chunks,
    BLOCK_C: tl.constexpr, HAS_FLAG: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    if HAS_FLAG:
        bad = tl.where(tl.load(temp_ptr + row) > 0, 0, _BAD_TEMPERATURE)  # NaN included (checks.py)
        tl.atomic_or(err_ptr, bad, mask=bad != 0)
    base = row * num_chunks
    chunks = tl.arange(0, BLOCK_C)
    run_max = -float("inf")
    run_sum = 0.0
    best = -float("inf")
    best_chunk = 0
    for c0 in range(0, num_chunks, BLOCK_C):
        c = c0 + chunks
        valid = c < num_chunks
        part_max = tl.load(max_ptr + base + c, mask=valid, other=-float("inf"))
        part_sum = tl.load(sum_ptr + base + c, mask=valid, other=0.0)
        run_max, run_sum = fold_lse(run_max, run_sum, part_max, part_sum, 0)
        part_key = tl.load(key_ptr + base + c, mask=valid, other=-float("inf"))
        best, best_chunk = fold_argmax(best, best_chunk, part_key, c, num_chunks, 0)
    tl.store(lse_ptr + row, run_max + tl.log(run_sum))
    tl.store(token_ptr + row, tl.load(idx_ptr + base + best_chunk).to(tl.int64))


def sample_triton(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    level: int,
    purpose: int,
    greedy: bool,
    block_v: int | None = None,
    num_chunks: int | None = None,
    *,
    error_flag: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernels: same signature, results and argument errors as ``sample_torch``. ``block_v``
    and ``num_chunks`` override the vocabulary block and split (tests and benchmarks).
    ``error_flag``: as in ``verify_triton`` (a temperature that is not > 0)."""
    num_rows, vocab = checks.check_sample_args(
        logits, temperature, seeds, positions, level, purpose, greedy, error_flag, flag_with_tensor_ops=False
    )
    checks.check_split(block_v, num_chunks)
    device = logits.device
    tokens = torch.empty(num_rows, dtype=torch.int64, device=device)
    lse = torch.empty(num_rows, dtype=torch.float32, device=device)
    if num_rows == 0:
        return tokens, lse
    block, chunks, chunk_size = plan(num_rows, vocab, device, block_v, num_chunks)
    logits, temperature = logits.contiguous(), temperature.float().contiguous()
    part_max, part_sum, part_key = (torch.empty(num_rows * chunks, device=device) for _ in range(3))
    part_idx = torch.empty(num_rows * chunks, dtype=torch.int32, device=device)
    _sample_chunk_kernel[(num_rows, chunks)](
        logits, logits.stride(0), temperature, seeds.to(torch.int64),
        positions.to(torch.int64), part_max, part_sum, part_key, part_idx,
        vocab, level, purpose, chunk_size, chunks, GREEDY=greedy, BLOCK_V=block,
    )  # fmt: skip
    # Without a flag any tensor stands in for its pointer: the kernel never touches it then.
    _sample_pick_kernel[(num_rows,)](
        part_max, part_sum, part_key, part_idx, tokens, lse, temperature,
        part_idx if error_flag is None else error_flag, chunks, BLOCK_C=split.BLOCK_C,
        HAS_FLAG=error_flag is not None,
    )  # fmt: skip
    return tokens, lse
