"""The padded layout every level step works in, and the bucket rule that keeps its shapes few.

A step feeds, for each of the B rows, the span of positions ``[starts[r], ends[r])`` the level has
not cached yet. Spans are ragged; a step works on a ``[B, L]`` block with L a *bucket* (one of a few
widths), right-aligned: column c of row r holds position ``ends[r] - L + c``, valid when it is
``>= starts[r]`` (and the row takes part). Right alignment puts every row's last positions in the
last columns, so the logits a step needs (the last O positions of each row) are the block's last O
columns. Padding columns feed token 0 at position 0 and write to the scratch slot of the
cache (docs/design.md, "Padding and rows that sit out"). Everything here is static in shape once
B, L and O are fixed: what a compiled step needs (no data-dependent shapes, no host syncs).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import numpy as np
import torch

BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
"""Fed widths a step is compiled for. Finer than powers of two where widths are common (a verify of
T drafts feeds T + 1 tokens plus a few catch-up ones): a wider block costs CPU time per column."""
MAX_WIDTH = BUCKETS[-1]
"""A longer span (a prompt) is fed in chunks of this width before the step (``head_chunks``)."""


def capacity_bucket(positions: int) -> int:
    """The size of a buffer holding ``positions`` positions (the token buffer, the KV slots): the
    smallest of 128, 192, 256, 384, 512, 768, ... (powers of two and 1.5 times them) that holds
    them. The attention over the cache reads at most 1.5 times the positions it needs. Where
    compiled steps trace the size as a symbol (``symbolic_capacity``: a CPU) a new prompt length or
    ``max_new_tokens`` compiles nothing new; elsewhere only a request that crosses a size does."""
    size = 128
    while size < positions:
        size = size * 3 // 2 if size & (size - 1) == 0 else size * 4 // 3
    return size


def symbolic_capacity(device: torch.device) -> bool:
    """Whether compiled steps on ``device`` trace the capacity as a symbol, one graph for every
    size: on a CPU, where a graph costs tens of seconds to compile and holds its own copy of the
    weights. Elsewhere each capacity compiles graphs of its own (on CUDA each size would record
    its own CUDA graph anyway; the symbolic path is untested on a GPU)."""
    return device.type == "cpu"


def capacity_key(capacity: int, device: torch.device) -> int | None:
    """The capacity as part of a compiled step's key: None where it is symbolic (one graph serves
    every size), else the size itself."""
    return None if symbolic_capacity(device) else capacity


def capacity_buffer(tensor: torch.Tensor, dim: int) -> torch.Tensor:
    """``tensor``, whose ``dim`` is a run's capacity (a ``capacity_bucket`` size, maybe plus a
    scratch slot), marked dynamic there where the capacity is symbolic (``symbolic_capacity``):
    a request that crosses a size then compiles nothing new (docs/design.md, "Few graphs per
    run"). A step reads the capacity from such a tensor's size, never from a Python int: compiled
    steps keep no guards on ints, so one would be baked into the graph unchecked."""
    if symbolic_capacity(tensor.device):
        torch._dynamo.mark_dynamic(tensor, dim)
    return tensor


def bucket(width: int) -> int:
    """The smallest bucket holding ``width`` (>= 1) columns; ``width`` must be <= MAX_WIDTH."""
    for b in BUCKETS:
        if b >= width:
            return b
    raise ValueError(f"width {width} beyond the largest bucket {MAX_WIDTH}: feed it in chunks")


class FedBlock(NamedTuple):
    """What one forward of a level feeds: ``[B, L]`` each.

    A chain's tokens are cached at their positions, and each sees every slot up to its own position.
    A token tree's n nodes share positions (siblings stand at the same depth), so they are cached at
    the slots ``[tree_start, tree_start + n)`` after the row's prefix, and a tree block says which of
    those slots each column sees (``tree_sees``: a node sees its ancestors and itself, whether fed in
    this forward or an earlier one). Every other slot is seen by position, as for a chain
    (docs/design.md, "Token trees")."""

    input_ids: torch.Tensor  # int64, 0 in padding columns
    positions: torch.Tensor  # int64 absolute positions, clamped to >= 0 in padding columns
    valid: torch.Tensor  # bool: a real token of a row that takes part
    slots: torch.Tensor | None = None  # [B, L] int64 the cache slots written; None: the positions
    tree_start: torch.Tensor | None = None  # [B] int64 the first tree slot (the prefix length P)
    tree_sees: torch.Tensor | None = None  # [B, L, n] bool: column i sees tree slot tree_start + j


def fed_block(
    tokens: torch.Tensor,  # [B, S] every row's tokens by position
    starts: torch.Tensor,  # [B] int64 first position to feed
    ends: torch.Tensor,  # [B] int64 one past the last position to feed
    active: torch.Tensor,  # [B] bool: rows taking part in this forward
    width: int,
) -> FedBlock:
    """The right-aligned ``[B, width]`` block of positions ``[starts, ends)``."""
    columns = torch.arange(width, device=tokens.device)  # [L]
    positions = ends[:, None] - width + columns  # [B, L]
    valid = (positions >= starts[:, None]) & active[:, None]  # [B, L]
    # Padding at position 0: a row that stopped early in a multi-token draft step keeps counting
    # past its end, beyond the token buffer and a learned position table (GPT-2) near the limit.
    positions = torch.where(valid, positions, 0)
    input_ids = torch.where(valid, tokens.gather(1, positions), 0)  # [B, L]
    return FedBlock(input_ids, positions, valid)


def head_chunks(starts: np.ndarray, ends: np.ndarray, width: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Spans ``[starts, ends)`` longer than ``width`` (prompts) are fed ``width`` at a time before
    the step: yields each chunk's (starts, ends), all [B], until every row's remaining span
    ``[cursor, ends)`` fits one step. A row with nothing left in a chunk has starts == ends there."""
    head_end = np.maximum(starts, ends - width)  # the step itself feeds [head_end, ends)
    cursor = starts
    while (cursor < head_end).any():
        following = np.minimum(cursor + width, head_end)
        yield cursor, following
        cursor = following
