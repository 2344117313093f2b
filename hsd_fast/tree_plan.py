"""A token tree as a run holds it (docs/design.md, "Token trees in the engine"): its topology as the
index tensors the tree steps use (``TreePlan``), and every row's pending tree (``TreeBuffers``).
Below both the run state, which keeps a run's tree buffers, and the tree steps, which fill them."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hsd_fast.buffer_pool import POOL
from hsd_fast.tree import Tree


@dataclass
class TreePlan:
    """A tree's topology as the tensors the steps index with, built once per run."""

    tree: Tree
    depths: torch.Tensor  # [n] int64
    columns: torch.Tensor  # [n] int64
    ranks: torch.Tensor  # [n] int64
    ancestors: torch.Tensor  # [n, n] bool: node i sees node j
    # per depth d, the contexts whose children are drafted after the forward over depth d - 1,
    # grouped by their number of children k: (contexts [m], children [m, k]); context 0 is the root
    groups: list[list[tuple[torch.Tensor, torch.Tensor]]]

    @classmethod
    def of(cls, tree: Tree, device: torch.device) -> TreePlan:
        def ints(values) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int64, device=device)

        groups = []
        for d in range(tree.depth):
            parents = [-1] if d == 0 else range(tree.depth_slice(d - 1).start, tree.depth_slice(d - 1).stop)
            by_count: dict[int, list[int]] = {}
            for parent in parents:
                if tree.children[parent]:
                    by_count.setdefault(len(tree.children[parent]), []).append(parent)
            groups.append(
                [
                    (ints([p + 1 for p in ps]), ints([tree.children[p] for p in ps]))
                    for ps in by_count.values()
                ]
            )
        return cls(
            tree, ints(tree.depths), ints(tree.columns), ints(tree.ranks), tree.ancestors(device), groups
        )


class TreeBuffers:
    """The pending tree of every row: its nodes' tokens and (sampling) level 0's processed logits at
    every context, the q level 1 verifies against."""

    def __init__(self, plan: TreePlan, num_rows: int, vocab: int, dtype: torch.dtype, greedy: bool) -> None:
        n, device = plan.tree.num_nodes, plan.depths.device
        self.plan = plan
        self.tokens = POOL.zeros(self, (num_rows, n), torch.int64, device)  # [B, n]
        self.q_logits = None if greedy else POOL.zeros(self, (num_rows, n + 1, vocab), dtype, device)
