"""Table models: explicit next-token distributions over a tiny vocabulary, for proving HSD exact.

A table model of order m gives next-token logits as a function of the last m tokens. Its runner
behaves like a model with a KV cache: it remembers exactly what it was fed, per row, and refuses a
span that does not start inside what it holds, so a ledger that forgets to re-feed or to roll back
shows up as wrong distributions (or an error), not as silently right answers.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import torch

from hsd_fast.engine import Feed, ragged_arange


class TableModel:
    def __init__(self, logits: torch.Tensor, order: int) -> None:  # logits [V**order, V]
        vocab = logits.shape[-1]
        if logits.shape != (vocab**order, vocab):
            raise ValueError(f"logits must be [V**order, V] = {(vocab**order, vocab)}, got {logits.shape}")
        self.logits, self.order, self.vocab_size = logits, order, vocab

    def next_logits(self, contexts: torch.Tensor) -> torch.Tensor:  # [N, order] -> [N, V]
        weights = self.vocab_size ** torch.arange(self.order - 1, -1, -1, device=contexts.device)
        return self.logits[(contexts * weights).sum(-1)]

    def continuation_probs(
        self, prompt: Sequence[int], steps: int, temperature: float = 1.0, eos: int | None = None
    ) -> dict[tuple[int, ...], float]:
        """Exact distribution of the next ``steps`` tokens (a sequence stops after ``eos``)."""
        probs: dict[tuple[int, ...], float] = {}
        for cont in itertools.product(range(self.vocab_size), repeat=steps):
            if eos is not None and eos in cont:
                cont = cont[: cont.index(eos) + 1]
                if cont in probs:
                    continue
            seq, prob = list(prompt), 1.0
            for tok in cont:
                ctx = torch.tensor([seq[-self.order :]])
                p = torch.softmax(self.next_logits(ctx)[0].double() / temperature, -1)
                prob *= float(p[tok])
                seq.append(tok)
            probs[cont] = prob
        return probs


def table_family(
    vocab_size: int,
    order: int,
    num_levels: int,
    *,
    spread: float = 1.0,
    scale: float = 1.5,
    seed: int = 0,
) -> list[TableModel]:
    """Levels 0..K of increasing similarity to the target (the last): level l adds noise of size
    ``spread * (K - l) / K`` to the target's logits."""
    gen = torch.Generator().manual_seed(seed)
    shape = (vocab_size**order, vocab_size)
    target = scale * torch.randn(shape, generator=gen)
    top = num_levels - 1
    return [
        TableModel(target + spread * (top - lvl) / max(top, 1) * torch.randn(shape, generator=gen), order)
        for lvl in range(num_levels)
    ]


class TableRunner:
    """Runner for a TableModel. Its 'cache' is the tokens it was fed, per row and position."""

    def __init__(self, model: TableModel) -> None:
        self.model = model
        self.vocab_size = model.vocab_size
        self.history = torch.zeros(0, 0, dtype=torch.int64)  # [B, S]
        self.valid = np.zeros(0, dtype=np.int64)  # [B] positions held

    def prepare(self, num_rows: int, capacity: int) -> None:
        self.history = torch.zeros(num_rows, capacity, dtype=torch.int64)
        self.valid = np.zeros(num_rows, dtype=np.int64)

    def forward(self, feed: Feed) -> torch.Tensor:
        rows = feed.rows
        if np.any(feed.starts > self.valid[rows]):
            raise RuntimeError("a fed span starts beyond what this level has cached: a gap")
        owner, pos = ragged_arange(feed.starts, feed.ends)
        self.history[rows[owner], pos] = feed.tokens.cpu()
        self.valid[rows] = feed.ends  # positions past the span are stale: rolled back
        o_owner, o_pos = ragged_arange(feed.out_starts, feed.ends)
        if np.any(o_pos < self.model.order - 1):
            raise ValueError(f"table models of order {self.model.order} need prompts that long")
        window = o_pos[:, None] + np.arange(1 - self.model.order, 1)[None, :]  # [N, order]
        contexts = self.history[rows[o_owner][:, None], window]
        return self.model.next_logits(contexts)  # [N, V]
