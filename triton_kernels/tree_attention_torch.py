"""Attention of a level's fed block over its slot cache, driven by compact metadata instead of a
dense ``[B, L, S]`` mask: the torch reference of ``tree_attention.py`` (docs/design.md, "Tree
attention"). It imports no Triton.

Terms:

    fed block   the L query columns of one forward, row r's real ones first catch-up tokens, then
                a chain or the nodes of a token tree (layout.py: right-aligned, padding on the left)
    slot cache  K/V ``[B, H_kv, S, D]`` per layer, a token at the slot of its position; a tree's n
                nodes at the slots ``[tree_start, tree_end)`` after the row's prefix
    last_seen   per column: the last slot it sees by position (its own position); -1 marks padding,
                which sees nothing and gets a zero output
    tree bits   per column: which tree slots it sees (its ancestors and itself), slot
                ``tree_start + j`` is bit ``j % 64`` of word ``j // 64``

A column sees slot k iff it is not padding and, for k inside the tree window, its bit for k is set,
else k <= last_seen. That is the rule of the dense mask the HF runner builds for SDPA (without a
sliding window), so both paths give the same outputs on every real column.

Metadata layout, one int64 tensor ``[B, L, META_FIXED + W]`` (W = ceil(n / 64) words, at least 1):
``[..., 0]`` last_seen, ``[..., 1]`` tree_start, ``[..., 2]`` tree_end (the same in every column of a
row; equal for a chain: an empty window), ``[..., 3:]`` the tree bits.
"""

from __future__ import annotations

import torch

META_FIXED = 3
"""Columns of the metadata before the tree bits: last_seen, tree_start, tree_end."""
WORD_BITS = 64


def pack_tree_bits(tree_sees: torch.Tensor) -> torch.Tensor:
    """``tree_sees`` [B, L, n] bool -> [B, L, W] int64 words, bit j % 64 of word j // 64 = node j."""
    batch, width, size = tree_sees.shape
    words = max(1, -(-size // WORD_BITS))
    padded = torch.zeros(batch, width, words * WORD_BITS, dtype=torch.int64, device=tree_sees.device)
    padded[..., :size] = tree_sees.to(torch.int64)
    shifts = torch.arange(WORD_BITS, dtype=torch.int64, device=tree_sees.device)  # [64]
    # Distinct powers of two: their sum is their OR (bit 63 wraps to the sign bit, as it should).
    return (padded.view(batch, width, words, WORD_BITS) << shifts).sum(-1)


def attention_meta(
    last_seen: torch.Tensor,  # [B, L] int64, -1 in padding columns
    tree_start: torch.Tensor | None = None,  # [B] int64 first tree slot; None: no tree
    tree_sees: torch.Tensor | None = None,  # [B, L, n] bool
) -> torch.Tensor:
    """The metadata tensor ``[B, L, META_FIXED + W]`` int64 (module docstring)."""
    batch, width = last_seen.shape
    if tree_sees is None:
        start = end = torch.zeros(batch, dtype=torch.int64, device=last_seen.device)
        bits = torch.zeros(batch, width, 1, dtype=torch.int64, device=last_seen.device)
    else:
        assert tree_start is not None, "a tree needs its start slot"
        start, end = tree_start, tree_start + tree_sees.shape[-1]
        bits = pack_tree_bits(tree_sees)
    window = torch.stack([start, end], dim=-1)[:, None, :].expand(batch, width, 2)  # [B, L, 2]
    return torch.cat([last_seen[..., None], window, bits], dim=-1)


def visible_slots(meta: torch.Tensor, num_slots: int) -> torch.Tensor:
    """The dense visibility ``[B, L, S]`` bool that ``meta`` describes (the reference's mask)."""
    slots = torch.arange(num_slots, device=meta.device)  # [S]
    last_seen, start, end = meta[..., 0:1], meta[..., 1:2], meta[..., 2:3]  # [B, L, 1] each
    offset = slots - start  # [B, L, S]
    in_tree = (offset >= 0) & (slots < end)
    word = meta.gather(
        -1, META_FIXED + (offset.clamp(min=0) // WORD_BITS).clamp(max=meta.shape[-1] - 1 - META_FIXED)
    )
    bit = ((word >> (offset.clamp(min=0) % WORD_BITS)) & 1).bool()
    return torch.where(in_tree, bit, slots <= last_seen) & (last_seen >= 0)


def tree_attention_torch(
    query: torch.Tensor,  # [B, H_q, L, D]
    key_cache: torch.Tensor,  # [B, H_kv, S, D], H_q a multiple of H_kv (grouped-query attention)
    value_cache: torch.Tensor,  # [B, H_kv, S, D]
    meta: torch.Tensor,  # [B, L, META_FIXED + W] int64 (module docstring)
    scale: float,
) -> torch.Tensor:
    """Softmax attention of each column over the slots it sees, in fp32: ``[B, L, H_q, D]`` in the
    query's dtype (the layout HF's attention functions return); zero for padding columns."""
    group = query.shape[1] // key_cache.shape[1]
    keys = key_cache.float().repeat_interleave(group, dim=1)  # [B, H_q, S, D]
    values = value_cache.float().repeat_interleave(group, dim=1)
    scores = (query.float() @ keys.transpose(-1, -2)) * scale  # [B, H_q, L, S]
    sees = visible_slots(meta, key_cache.shape[2])[:, None]  # [B, 1, L, S]
    scores = scores.masked_fill(~sees, -float("inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a column that sees nothing: zeros
    return (weights @ values).transpose(1, 2).to(query.dtype)  # [B, L, H_q, D]
