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
    """Runner for a TableModel. Its 'cache' is the tokens it was fed, per row and slot, with the
    position each stands for: a chain's tokens sit at their positions, a token tree's nodes at
    their tree slots, and a node's context is read along its ancestors (what it may see)."""

    dtype = torch.float32
    compilable = False  # host-side bookkeeping in every forward: compile="auto" leaves it eager

    def __init__(self, model: TableModel) -> None:
        self.model = model
        self.vocab_size = model.vocab_size
        self.history = torch.zeros(0, 0, dtype=torch.int64)  # [B, S] token per slot
        self.slot_positions = torch.zeros(0, 0, dtype=torch.int64)  # [B, S] the position each stands for
        self.held = torch.zeros(0, dtype=torch.int64)  # [B] positions held

    def prepare(self, num_rows: int, capacity: int, tree_slots: int = 0) -> None:
        self.history = torch.zeros(num_rows, capacity + tree_slots, dtype=torch.int64)
        self.slot_positions = torch.full_like(self.history, -1)
        self.held = torch.zeros(num_rows, dtype=torch.int64)

    def forward(self, block: FedBlock, num_outputs: int) -> torch.Tensor:  # [B, O, V]
        valid, positions = block.valid.cpu(), block.positions.cpu()
        slots = positions if block.slots is None else block.slots.cpu()
        in_chain = valid  # tree nodes stand in the slots past the prefix and hold no position yet
        if block.tree_start is not None:
            in_chain = valid & (slots < block.tree_start.cpu()[:, None])
        fed = in_chain.any(1)  # [B] rows that feed a chain
        first = torch.where(in_chain, positions, torch.iinfo(torch.int64).max).amin(1)  # [B]
        if (first > self.held)[fed].any():
            raise RuntimeError("a fed span starts beyond what this level has cached: a gap")
        rows, cols = valid.nonzero(as_tuple=True)
        self.history[rows, slots[rows, cols]] = block.input_ids.cpu()[rows, cols]
        self.slot_positions[rows, slots[rows, cols]] = positions[rows, cols]
        last = torch.where(in_chain, positions, -1).amax(1) + 1  # [B]
        self.held = torch.where(fed, last, self.held)  # positions past the span are stale: rolled back
        if num_outputs == 0:  # only cached
            return torch.zeros(len(positions), 0, self.model.vocab_size, device=block.positions.device)
        out_positions = positions[:, -num_outputs:]  # [B, O]
        window = out_positions[..., None] + torch.arange(1 - self.model.order, 1)  # [B, O, order]
        if (window[:, -1][valid[:, -1]] < 0).any():  # the last column's logits are always used
            raise ValueError(f"table models of order {self.model.order} need prompts that long")
        at = window.clamp(min=0)  # [B, O, order] the slot of each context position, for a chain
        if block.tree_sees is not None:  # a position at or past the tree: the ancestor standing there
            start, size = block.tree_start.cpu(), block.tree_sees.shape[-1]
            sees = block.tree_sees.cpu()[:, -num_outputs:]  # [B, O, n]
            tree_slots = start[:, None] + torch.arange(size)  # [B, n]
            stands = self.slot_positions.gather(1, tree_slots)  # [B, n]
            match = sees[:, :, None, :] & (stands[:, None, None, :] == window[..., None])  # [B, O, order, n]
            in_tree = window >= start[:, None, None]
            at = torch.where(in_tree, start[:, None, None] + match.int().argmax(-1), at)
        contexts = self.history[torch.arange(len(window))[:, None, None], at]
        logits = self.model.next_logits(contexts.flatten(0, 1))  # [B * O, V]
        return logits.unflatten(0, out_positions.shape).to(block.positions.device)

    def move(self, tree_start: torch.Tensor, nodes: torch.Tensor, lengths: torch.Tensor) -> None:
        """A verified tree's path to the slots of its positions; what it holds then runs to the
        path's end (``Runner.move``)."""
        tree_start, nodes, lengths = tree_start.cpu(), nodes.cpu(), lengths.cpu()
        depth = torch.arange(nodes.shape[1])
        targets = tree_start[:, None] + depth  # [B, K]
        sources = torch.where(depth < lengths[:, None], tree_start[:, None] + nodes, targets)
        rows = torch.arange(len(tree_start))[:, None]
        self.history[rows, targets] = self.history[rows, sources]
        self.slot_positions[rows, targets] = self.slot_positions[rows, sources]
        moved = (lengths > 0) & (self.held >= tree_start)
        self.held = torch.where(moved, tree_start + lengths, self.held)
