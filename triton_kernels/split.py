"""Splitting the vocabulary across programs, and reducing what they found (split-and-reduce, as
FlashDecoding splits the sequence): at small batch one program per row would leave most of the GPU
idle, so each row's vocabulary is cut into chunks, each program writes partials for its chunk, and a
second launch reduces them in chunk order (results do not depend on scheduling).

Device helpers for the partials (one chunk's scan, online log-sum-exp, first argmax), and the
chunking rule shared by the verification and sampling kernels. Chunk c covers
[c * chunk_size, min((c + 1) * chunk_size, V)).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from .keyed_random import uniform_from_state

NO_SPECIALIZE = ["level", "purpose", "width", "chunk_size", "num_chunks"]
"""Runtime integers that change from step to step. Triton would otherwise specialise on them (== 1,
divisible by 16) and recompile when the number of rows, the draft width or the level changes."""


@triton.jit
def finite_shift(x):
    """A usable exponent shift: 0 where x is -inf (whole chunks are, under top-k masking)."""
    return tl.where(x == -float("inf"), 0.0, x)


@triton.jit
def fold_lse(run_max, run_sum, values, weights, axis: tl.constexpr):
    """Online log-sum-exp: fold sum(weights * exp(values)) along ``axis`` into (run_max, run_sum),
    which stand for run_sum * exp(run_max). Logits come with weights 1; partials from chunks with
    their sums (each taken relative to its max, which is then its value)."""
    blk_max = tl.max(values, axis=axis)
    blk_shift = finite_shift(blk_max)
    blk_sum = tl.sum(weights * tl.exp(values - tl.expand_dims(blk_shift, axis)), axis=axis)
    new_max = tl.maximum(run_max, blk_max)
    shift = finite_shift(new_max)
    return new_max, run_sum * tl.exp(run_max - shift) + blk_sum * tl.exp(blk_shift - shift)


@triton.jit
def fold_argmax(best, best_idx, values, indices, absent, axis: tl.constexpr):
    """Running argmax: fold the max of ``values`` along ``axis`` and the smallest index holding it
    (``absent`` exceeds every index) into (best, best_idx). Blocks come in index order, so ties
    keep the earlier block: the first maximal index, as torch.argmax."""
    blk_best = tl.max(values, axis=axis)
    hit = values == tl.expand_dims(blk_best, axis)
    blk_idx = tl.min(tl.where(hit, indices, absent), axis=axis)
    take = blk_best > best
    return tl.where(take, blk_best, best), tl.where(take, blk_idx, best_idx)


@triton.jit
def scan_chunk(
    row_ptr, chunk, chunk_size, V, temp, state,
    ARGMAX: tl.constexpr, RACE: tl.constexpr, BLOCK_V: tl.constexpr,
):  # fmt: skip
    """One row's logits / temperature over chunk ``chunk``: (max, sum of exp relative to it) and,
    with ARGMAX, the max and first index of the logits, or with RACE of the logits plus Gumbel noise
    keyed by ``state`` (an exponential race: it needs no normaliser, so one read serves both)."""
    lo = chunk * chunk_size
    hi = tl.minimum(lo + chunk_size, V)
    run_max = -float("inf")
    run_sum = 0.0
    best = -float("inf")
    best_idx = 0
    for start in range(lo, hi, BLOCK_V):
        idx = start + tl.arange(0, BLOCK_V)
        x = tl.load(row_ptr + idx, mask=idx < hi, other=-float("inf")).to(tl.float32) / temp
        run_max, run_sum = fold_lse(run_max, run_sum, x, 1.0, 0)
        if ARGMAX:
            key = x  # lanes past the chunk are -inf, with or without noise
            if RACE:
                key = x - tl.log(-tl.log(uniform_from_state(state, idx)))
            best, best_idx = fold_argmax(best, best_idx, key, idx, V, 0)
    return run_max, run_sum, best, best_idx


def cdiv(a: int, b: int) -> int:
    """Ceiling division on the host. ``triton.cdiv`` is a constexpr function: called from Python it
    unwraps its arguments first, about 3 us a call, and a launcher makes a dozen calls per step."""
    return -(-a // b)


BLOCK_V_MAX = 1024
"""Vocabulary block per loop step: wide enough to stream at full bandwidth, narrow enough that the
race kernel's working set stays in registers."""
BLOCK_C = 64
"""Partials reduced per loop step; the launcher's splits stay within one step on current GPUs."""
PROGRAMS_PER_SM = 4


def _programs_wanted(device: torch.device) -> int:
    """Enough programs to fill the GPU a few times over; under the interpreter, a handful."""
    if device.type != "cuda":
        return 8
    return PROGRAMS_PER_SM * _sm_count(
        device.index if device.index is not None else torch.cuda.current_device()
    )


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def vocab_chunks(programs: int, vocab: int, block_v: int, device: torch.device) -> tuple[int, int]:
    """(chunk count, chunk size) for a grid of ``programs`` before the split: split the vocabulary,
    in whole blocks, until the grid holds ``_programs_wanted``. No split where programs fill it."""
    max_chunks = cdiv(vocab, block_v)
    chunks = min(max(cdiv(_programs_wanted(device), max(programs, 1)), 1), max_chunks)
    return split_vocab(chunks, vocab, block_v)


def split_vocab(chunks: int, vocab: int, block_v: int) -> tuple[int, int]:
    """Round the chunk size up to whole blocks; the count then shrinks so no chunk is empty."""
    chunk_size = cdiv(cdiv(vocab, chunks), block_v) * block_v
    return cdiv(vocab, chunk_size), chunk_size


def plan(
    programs: int,
    vocab: int,
    device: torch.device,
    block_v: int | None = None,
    num_chunks: int | None = None,
) -> tuple[int, int, int]:
    """(block, chunk count, chunk size) for a launch of ``programs`` before the split. ``block_v``
    and ``num_chunks`` override the choice (tests, benchmarks)."""
    block = block_v or min(1 << (vocab - 1).bit_length(), BLOCK_V_MAX)  # next power of 2
    if num_chunks is None:
        return block, *vocab_chunks(programs, vocab, block, device)
    return block, *split_vocab(num_chunks, vocab, block)
