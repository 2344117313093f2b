"""Attention of a fed block (catch-up tokens, a chain or a token tree) over the slot cache, read in
place, with no dense mask: flash-attention forward driven by the compact metadata of
``tree_attention_torch.py`` (terms and the visibility rule there; docs/design.md, "Tree attention").

Two launches, flash-decoding style, because a verify feeds few queries (L * group rows per KV head)
against a long cache and one program per (row, KV head) would leave most of a GPU idle:

    1. _tree_attention_kernel [B * H_kv, M blocks, splits]   each program: the M block's query
            rows (column i, head h = kv_head * group + g, row m = i * group + g) against one split of
            the slots, online softmax with fp32 accumulators; key blocks past the last slot any
            query of the row sees are skipped. With one split it writes the output directly.
    2. _combine_kernel [B * H_kv, M rows]   the splits' partial (max, sum, accumulator) -> the output

Grouped-query attention shares every K/V load between the group's heads. The number of splits
depends only on shapes and the device (never on the data), so the launches are CUDA-graph safe and
a compiled step traces them as they are.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from .tree_attention_torch import META_FIXED, tree_attention_torch

__all__ = ["tree_attention_torch", "tree_attention_triton"]

_LOG2_E = 1.4426950408889634  # the kernel works in powers of two: exp(x) = exp2(x * log2(e))
_META_FIXED: tl.constexpr = tl.constexpr(META_FIXED)
_NO_SCORE: tl.constexpr = tl.constexpr(
    -1.0e30
)  # finite: a block where a row sees nothing must not make exp2(-inf - -inf)


@triton.jit
def _attend(
    q, acc, run_max, run_sum, k_base, v_base, sk_s, sv_s, start, hi, d, d_ok, meta_row, column, m_ok, meta_l,
    last_seen, tree_start, tree_end, scale_log2,
    MASKED: tl.constexpr, PRECISION: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """One key block of the online softmax. ``MASKED``: apply the visibility rule (else every query
    sees every slot of the block)."""
    slot = start + tl.arange(0, BLOCK_N)  # [N]
    s_ok = slot < hi
    k = tl.load(k_base + slot[:, None] * sk_s + d[None, :], mask=s_ok[:, None] & d_ok[None, :], other=0.0)
    scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2  # [M, N] log2 units
    if MASKED:  # tree_attention_torch.py: the tree window by bit, every other slot by position
        offset = slot - tree_start  # [N]
        in_tree = (offset >= 0) & (slot < tree_end)
        offset = tl.maximum(offset, 0)  # slots before the window read no bit (and shift by >= 0)
        word = tl.load(
            meta_row + column[:, None] * meta_l + _META_FIXED + (offset // 64)[None, :],
            mask=m_ok[:, None] & in_tree[None, :],
            other=0,
        )  # fmt: skip  [M, N] int64
        by_bit = ((word >> (offset % 64)[None, :]) & 1) != 0
        sees = tl.where(in_tree[None, :], by_bit, slot[None, :] <= last_seen[:, None])
        sees = sees & s_ok[None, :] & (last_seen[:, None] >= 0)
        scores = tl.where(sees, scores, _NO_SCORE)
    new_max = tl.maximum(run_max, tl.max(scores, 1))
    alpha = tl.exp2(run_max - new_max)
    p = tl.exp2(scores - new_max[:, None])
    if MASKED:
        p = tl.where(sees, p, 0.0)
    v = tl.load(v_base + slot[:, None] * sv_s + d[None, :], mask=s_ok[:, None] & d_ok[None, :], other=0.0)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return acc, new_max, run_sum * alpha + tl.sum(p, 1)


@triton.jit
def _tree_attention_kernel(
    q_ptr, k_ptr, v_ptr, meta_ptr, out_ptr, part_acc_ptr, part_max_ptr, part_sum_ptr,
    sq_b, sq_h, sq_l, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s, so_b, so_l, so_h, meta_b, meta_l,
    num_kv_heads, width, num_slots, head_dim, split_size, scale_log2,
    GROUP: tl.constexpr, SPLITS: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    row_head, m_block, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    row, kv_head = row_head // num_kv_heads, row_head % num_kv_heads
    m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)  # [M] query rows of this KV head
    column, head = m // GROUP, kv_head * GROUP + m % GROUP
    m_ok = column < width
    d = tl.arange(0, BLOCK_D)
    d_ok = d < head_dim
    meta_row = meta_ptr + row.to(tl.int64) * meta_b
    last_seen = tl.load(meta_row + column * meta_l, mask=m_ok, other=-1).to(tl.int32)  # [M] -1: sees nothing
    real = last_seen >= 0
    tree_start, tree_end = tl.load(meta_row + 1).to(tl.int32), tl.load(meta_row + 2).to(tl.int32)
    q = tl.load(
        q_ptr + row.to(tl.int64) * sq_b + head[:, None] * sq_h + column[:, None] * sq_l + d[None, :],
        mask=m_ok[:, None] & d_ok[None, :],
        other=0.0,
    )  # fmt: skip  [M, D]
    # Slots past the last one any query here sees hold nothing it reads: stop there. Slots below
    # every real query's own position and before the tree are seen by all: no mask there (padding
    # rows read them too, and are zeroed at the end).
    kv_end = tl.maximum(tl.max(last_seen, 0) + 1, tl.where(tree_end > tree_start, tree_end, 0))
    seen_by_all = tl.min(tl.where(real, last_seen, num_slots), 0) + 1
    seen_by_all = tl.where(tree_end > tree_start, tl.minimum(seen_by_all, tree_start), seen_by_all)
    lo = split * split_size
    hi = tl.minimum(tl.minimum(lo + split_size, kv_end), num_slots)
    unmasked_hi = lo + tl.maximum(tl.minimum(seen_by_all, hi) - lo, 0) // BLOCK_N * BLOCK_N
    run_max = tl.full([BLOCK_M], _NO_SCORE, tl.float32)
    run_sum = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    k_base = k_ptr + row.to(tl.int64) * sk_b + kv_head * sk_h
    v_base = v_ptr + row.to(tl.int64) * sv_b + kv_head * sv_h
    for start in range(lo, unmasked_hi, BLOCK_N):
        acc, run_max, run_sum = _attend(
            q, acc, run_max, run_sum, k_base, v_base, sk_s, sv_s, start, hi, d, d_ok, meta_row, column, m_ok,
            meta_l, last_seen, tree_start, tree_end, scale_log2,
            MASKED=False, PRECISION=PRECISION, BLOCK_N=BLOCK_N,
        )  # fmt: skip
    for start in range(unmasked_hi, hi, BLOCK_N):
        acc, run_max, run_sum = _attend(
            q, acc, run_max, run_sum, k_base, v_base, sk_s, sv_s, start, hi, d, d_ok, meta_row, column, m_ok,
            meta_l, last_seen, tree_start, tree_end, scale_log2,
            MASKED=True, PRECISION=PRECISION, BLOCK_N=BLOCK_N,
        )  # fmt: skip
    run_sum = tl.where(real, run_sum, 0.0)  # padding: a zero output
    acc = tl.where(real[:, None], acc, 0.0)
    if SPLITS == 1:
        out = acc / tl.where(run_sum > 0, run_sum, 1.0)[:, None]
        tl.store(
            out_ptr + row.to(tl.int64) * so_b + column[:, None] * so_l + head[:, None] * so_h + d[None, :],
            out.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & d_ok[None, :],
        )  # fmt: skip
    else:
        part = (row_head * tl.num_programs(1) * BLOCK_M + m) * SPLITS + split  # [M]
        tl.store(part_max_ptr + part, run_max)
        tl.store(part_sum_ptr + part, run_sum)
        tl.store(part_acc_ptr + part[:, None] * BLOCK_D + d[None, :], acc)


@triton.jit
def _combine_kernel(
    out_ptr, part_acc_ptr, part_max_ptr, part_sum_ptr, so_b, so_l, so_h, num_kv_heads, width, head_dim,
    GROUP: tl.constexpr, SPLITS: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    row_head, m = tl.program_id(0), tl.program_id(1)
    row, kv_head = row_head // num_kv_heads, row_head % num_kv_heads
    column, head = m // GROUP, kv_head * GROUP + m % GROUP
    if column < width:
        s = tl.arange(0, SPLITS)
        d = tl.arange(0, BLOCK_D)
        part = (row_head * tl.num_programs(1) + m) * SPLITS + s  # [SPLITS]
        part_max = tl.load(part_max_ptr + part)
        weight = tl.exp2(part_max - tl.max(part_max, 0))  # [SPLITS]
        total = tl.sum(tl.load(part_sum_ptr + part) * weight, 0)
        acc = tl.sum(tl.load(part_acc_ptr + part[:, None] * BLOCK_D + d[None, :]) * weight[:, None], 0)
        out = acc / tl.where(total > 0, total, 1.0)
        tl.store(
            out_ptr + row.to(tl.int64) * so_b + column * so_l + head * so_h + d,
            out.to(out_ptr.dtype.element_ty), mask=d < head_dim,
        )  # fmt: skip


@functools.cache
def _processor_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4  # the interpreter: a few splits, so that the combine path is exercised


MIN_SPLIT_SLOTS = 1024
"""A split covers at least this many slots: below it, the second launch costs more than it gains."""


def plan_splits(programs: int, num_slots: int, processors: int) -> int:
    """How many slot splits (a power of two): enough programs to fill the processors, each split at
    least ``MIN_SPLIT_SLOTS`` long. Shapes only, never data: the same count for every call of a
    compiled step."""
    splits = 1
    while programs * splits < processors and num_slots >= splits * 2 * MIN_SPLIT_SLOTS:
        splits *= 2
    return splits


def tree_attention_triton(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    meta: torch.Tensor,
    scale: float,
    *,
    splits: int | None = None,
    block_n: int | None = None,
) -> torch.Tensor:
    """The kernels: same arguments and results as ``tree_attention_torch`` (up to float rounding).
    ``splits`` (a power of two) and ``block_n`` (the key block) override the launcher's choice
    (tests and benchmarks)."""
    batch, heads, width, dim = query.shape
    _, kv_heads, num_slots, _ = key_cache.shape
    if heads % kv_heads or value_cache.shape != key_cache.shape or key_cache.shape[-1] != dim:
        raise ValueError(
            f"tree_attention: query {list(query.shape)}, keys {list(key_cache.shape)} and values "
            f"{list(value_cache.shape)} do not match (query heads a multiple of K/V heads, one head dim)"
        )
    if meta.dtype != torch.int64 or meta.shape[:2] != (batch, width) or meta.shape[2] <= META_FIXED:
        raise ValueError(
            f"tree_attention: meta must be int64 [B, L, {META_FIXED} + W], got {list(meta.shape)}"
        )
    out = torch.empty(batch, width, heads, dim, dtype=query.dtype, device=query.device)
    if out.numel() == 0:
        return out
    group = heads // kv_heads
    key_cache, value_cache, meta = (
        t if t.stride(-1) == 1 else t.contiguous() for t in (key_cache, value_cache, meta)
    )
    query = query if query.stride(-1) == 1 else query.contiguous()
    block_m = max(16, min(64, triton.next_power_of_2(width * group)))
    block_d = max(16, triton.next_power_of_2(dim))
    m_blocks = triton.cdiv(width * group, block_m)
    programs = batch * kv_heads * m_blocks
    if splits is None:
        splits = plan_splits(programs, num_slots, _processor_count(query.device))
    elif splits < 1 or splits & (splits - 1):
        raise ValueError(f"tree_attention: splits must be a power of two, got {splits}")
    if block_n is None:  # fp32 tiles of head dim 128 at 64 keys overflow a Hopper's shared memory
        block_n = 32 if query.element_size() * block_d > 256 else 64
    split_size = triton.cdiv(triton.cdiv(num_slots, splits), block_n) * block_n
    if splits > 1:  # the splits' partial results, fp32
        rows = programs * block_m * splits
        part_acc = torch.empty(rows, block_d, dtype=torch.float32, device=query.device)
        part_max, part_sum = (torch.empty(rows, device=query.device) for _ in range(2))
    else:  # written straight to the output: nothing to allocate (the kernel never reads these)
        part_acc = part_max = part_sum = out
    precision = "ieee" if query.dtype == torch.float32 else "tf32"  # fp32 models get fp32 products
    _tree_attention_kernel[(batch * kv_heads, m_blocks, splits)](
        query, key_cache, value_cache, meta, out, part_acc, part_max, part_sum,
        *query.stride()[:3], *key_cache.stride()[:3], *value_cache.stride()[:3], *out.stride()[:3],
        meta.stride(0), meta.stride(1), kv_heads, width, num_slots, dim, split_size, scale * _LOG2_E,
        GROUP=group, SPLITS=splits, PRECISION=precision, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d,
    )  # fmt: skip
    if splits > 1:
        _combine_kernel[(batch * kv_heads, m_blocks * block_m)](
            out, part_acc, part_max, part_sum, *out.stride()[:3], kv_heads, width, dim,
            GROUP=group, SPLITS=splits, BLOCK_D=block_d,
        )  # fmt: skip
    return out
