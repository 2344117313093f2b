"""Table models: explicit next-token distributions over a tiny vocabulary, for proving HSD exact.

A table model of order m gives next-token logits as a function of the last m tokens. Its runner
behaves like a model with a KV cache: it remembers exactly what it was fed, per row, and refuses a
span that does not start inside what it holds, so a ledger that forgets to re-feed or to roll back
shows up as wrong distributions (or an error), not as silently right answers.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch

from hsd_fast.layout import FedBlock


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

    dtype = torch.float32

    def __init__(self, model: TableModel) -> None:
        self.model = model
        self.vocab_size = model.vocab_size
        self.history = torch.zeros(0, 0, dtype=torch.int64)  # [B, S]
        self.held = torch.zeros(0, dtype=torch.int64)  # [B] positions held

    def prepare(self, num_rows: int, capacity: int) -> None:
        self.history = torch.zeros(num_rows, capacity, dtype=torch.int64)
        self.held = torch.zeros(num_rows, dtype=torch.int64)

    def forward(self, block: FedBlock, num_outputs: int) -> torch.Tensor:  # [B, O, V]
        valid, positions = block.valid.cpu(), block.positions.cpu()
        fed = valid.any(1)  # [B] rows that feed something
        first = torch.where(valid, positions, torch.iinfo(torch.int64).max).amin(1)  # [B]
        if (first > self.held)[fed].any():
            raise RuntimeError("a fed span starts beyond what this level has cached: a gap")
        rows, cols = valid.nonzero(as_tuple=True)
        self.history[rows, positions[rows, cols]] = block.input_ids.cpu()[rows, cols]
        last = torch.where(valid, positions, -1).amax(1) + 1  # [B]
        self.held = torch.where(fed, last, self.held)  # positions past the span are stale: rolled back
        out_positions = positions[:, -num_outputs:]  # [B, O]
        window = out_positions[..., None] + torch.arange(1 - self.model.order, 1)  # [B, O, order]
        if (window[:, -1][valid[:, -1]] < 0).any():  # the last column's logits are always used
            raise ValueError(f"table models of order {self.model.order} need prompts that long")
        contexts = self.history[torch.arange(len(window))[:, None, None], window.clamp(min=0)]
        logits = self.model.next_logits(contexts.flatten(0, 1))  # [B * O, V]
        return logits.unflatten(0, out_positions.shape).to(block.positions.device)
