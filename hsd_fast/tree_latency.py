"""What a token tree at level 0 is expected to gain and to cost in the latency model (docs/design.md,
"Choosing a tree"). Pure Python math, like ``latency.py``. The tree's value under rank acceptance
(rank factors, reaches, the optimal tree) is part of the topology module, ``tree.py``, which defines
the terms.

A verification emits the path and one more token (a correction or a bonus), so a tree of expected
path length E gives E + 1 tokens per verification.
"""

from __future__ import annotations

import random

from hsd_fast.latency import Cost, TreeCost, expected_latency
from hsd_fast.tree import RankAcceptance, Tree, check_rates, reaches


def simulate_path_lengths(tree: Tree, rates: RankAcceptance, trials: int, seed: int = 0) -> list[int]:
    """Accepted path lengths of ``trials`` verifications drawn under the model: at each context,
    try the children in rank order, accepting the rank-k one with probability ``rates[k]``."""
    check_rates(rates)
    rng = random.Random(seed)
    lengths = []
    for _ in range(trials):
        context, length = -1, 0  # children[-1] is the root's
        while True:
            for child in tree.children[context]:
                rank = tree.ranks[child]
                if rank < len(rates) and rng.random() < rates[rank]:
                    context, length = child, length + 1
                    break
            else:
                break
        lengths.append(length)
    return lengths


def tree_acceptance(tree: Tree, rates: RankAcceptance) -> tuple[float, ...]:
    """The tree as a block of ``depth`` proposals to the latency model (``latency.Acceptance``):
    position j's rate is P(path length >= j) / P(path length >= j - 1), where P(path length >= j)
    is the summed reach of the depth j - 1 nodes (their events are disjoint)."""
    at_least = [1.0] + [0.0] * tree.depth  # [j]: P(path length >= j)
    for reach, depth in zip(reaches(tree, rates), tree.depths, strict=True):
        at_least[depth + 1] += reach
    return tuple(
        at_least[j] / at_least[j - 1] if at_least[j - 1] > 0 else 0.0 for j in range(1, tree.depth + 1)
    )


def tree_cost(tree: Tree, draft_cost: Cost) -> TreeCost:
    """A model drafting ``tree``, as the latency model's level-0 cost."""
    return TreeCost(draft_cost, tree.widths)


def tree_latency(tree: Tree, draft_cost: Cost, verifier_cost: Cost, rates: RankAcceptance) -> float:
    """Expected seconds per emitted token of one draft drafting ``tree`` under one verifier: level 0's
    forwards (one for the token before the tree, then one per depth but the last over that depth's
    nodes) and the verifier's one forward over the token before the tree and the n nodes, over the
    expected path length + 1. Catch-up tokens are ignored, as in ``latency.py``."""
    costs = [tree_cost(tree, draft_cost), verifier_cost]
    return expected_latency(costs, [tree_acceptance(tree, rates)], [tree.depth])
