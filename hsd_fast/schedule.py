"""How many tokens level 0 drafts per step: the scheduling rule that the engine's loop
(``engine.py``) and the batch latency model's replay of it (``batch_latency.py``) share, so that the
model charges the steps the engine really runs. Numpy and the C++ ledger only."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hsd_fast._C import Ledger

TOKENS_PER_DECODE_STEP = 4
"""Without drafts (K = 0) the target decodes this many tokens per step (stopping at EOS)."""


def draft_count(block_sizes: Sequence[int]) -> int:
    """The most tokens a draft step draws: the block size T_0, or ``TOKENS_PER_DECODE_STEP`` when
    the target decodes alone (no block sizes)."""
    return block_sizes[0] if len(block_sizes) else TOKENS_PER_DECODE_STEP


def drafts_wanted(ledger: Ledger, rows: np.ndarray, budget_end: np.ndarray, block_sizes) -> np.ndarray:
    """[R] how many tokens each row drafts before it wants another level: up to its block size T_0
    (or TOKENS_PER_DECODE_STEP without drafts), within its length budget."""
    frontiers = ledger.frontiers()[rows]  # [R, K + 1]
    room = budget_end[rows] - frontiers[:, 0]
    if len(block_sizes) == 0:
        return np.minimum(room, TOKENS_PER_DECODE_STEP)
    return np.minimum(room, block_sizes[0] - (frontiers[:, 0] - frontiers[:, 1]))
