"""What a token tree at level 0 is expected to gain and to cost, and the tree of n nodes that gains
most (docs/design.md, "Choosing a tree"). Pure Python math, like ``latency.py``.

Terms:

    rank acceptance   ``rates[k]``: the probability that the verifier accepts a context's rank-k
                      child given that it rejected the children ranked before it (Sequoia's
                      positional acceptance, arXiv 2402.12374); the same at every context and depth
                      (the i.i.d. assumption). Ranks past the tuple are never accepted.
    rank factor       ``a_k = rates[k] * prod_{j < k} (1 - rates[j])``: the probability that the
                      walk descends into the rank-k child of a context it stands at
    reach             a node's probability of being on the accepted path: the product of the rank
                      factors along its path. The expected path length is the sum of the reaches,
                      so a tree's value is additive over its nodes.

A verification emits the path and one more token (a correction or a bonus), so a tree of expected
path length E gives E + 1 tokens per verification.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Sequence

from hsd_fast.latency import Cost, TreeCost, expected_latency
from hsd_fast.tree import MAX_NODES, Tree

RankAcceptance = Sequence[float]


def rank_factors(rates: RankAcceptance) -> list[float]:
    """``a_k`` for every rank of ``rates`` (module doc)."""
    _check_rates(rates)
    factors, rejected = [], 1.0
    for rate in rates:
        factors.append(rejected * rate)
        rejected *= 1.0 - rate
    return factors


def reaches(tree: Tree, rates: RankAcceptance) -> list[float]:
    """[n] each node's probability of being on the accepted path."""
    factors = rank_factors(rates)
    out: list[float] = []
    for parent, rank in zip(tree.parents, tree.ranks, strict=True):
        factor = factors[rank] if rank < len(factors) else 0.0
        out.append(factor * (out[parent] if parent >= 0 else 1.0))
    return out


def expected_path_length(tree: Tree, rates: RankAcceptance) -> float:
    """The expected number of tree nodes a verification accepts (length budget ignored)."""
    return sum(reaches(tree, rates))


def simulate_path_lengths(tree: Tree, rates: RankAcceptance, trials: int, seed: int = 0) -> list[int]:
    """Accepted path lengths of ``trials`` verifications drawn under the model: at each context,
    try the children in rank order, accepting the rank-k one with probability ``rates[k]``."""
    _check_rates(rates)
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


def optimal_tree(num_nodes: int, rates: RankAcceptance, max_depth: int | None = None) -> Tree:
    """The tree of at most ``num_nodes`` nodes (and ``max_depth`` depths) with the largest expected
    path length under ``rates``: Sequoia's dynamic program over how a context's nodes are split
    among its children, exact because a tree's value is the sum of its nodes' reaches. Children
    ranked past ``rates`` are never added (they are never accepted)."""
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or not 1 <= num_nodes <= MAX_NODES:
        raise ValueError(f"num_nodes must be an int in [1, {MAX_NODES}], got {num_nodes!r}")
    depth_limit = num_nodes if max_depth is None else max_depth
    if isinstance(depth_limit, bool) or not isinstance(depth_limit, int) or depth_limit < 1:
        raise ValueError(f"max_depth must be an int >= 1, got {max_depth!r}")
    factors = rank_factors(rates)

    @functools.cache
    def below(nodes: int, depths: int) -> tuple[float, tuple]:
        """The best value of a context's descendants: at most ``nodes`` of them, within ``depths``
        depths; with the shape, a tuple of (child subtree shapes) in rank order."""
        return children(0, nodes, depths)

    @functools.cache
    def children(rank: int, nodes: int, depths: int) -> tuple[float, tuple]:
        """The best value of children ranked ``rank`` and later with their subtrees, ``nodes`` in all."""
        if nodes == 0 or depths == 0 or rank >= len(factors) or factors[rank] == 0.0:
            return 0.0, ()
        best = (0.0, ())
        for inside in range(nodes):  # nodes under this child; it takes one itself
            value, shape = below(inside, depths - 1)
            rest_value, rest_shape = children(rank + 1, nodes - 1 - inside, depths)
            total = factors[rank] * (1.0 + value) + rest_value
            if total > best[0]:
                best = (total, (shape, *rest_shape))
        return best

    _, shape = below(num_nodes, depth_limit)
    if not shape:
        raise ValueError(f"no child is ever accepted under rates {list(rates)}: no tree gains anything")
    return _from_shape(shape)


def _from_shape(shape: tuple) -> Tree:
    """The tree whose root has the child subtrees ``shape`` (each a tuple of its own), its nodes
    listed depth by depth, siblings in rank order, children grouped by parent."""
    parents: list[int] = []
    level = [(-1, shape)]  # (node, its children's shapes) of one depth
    while level:
        following = []
        for node, kids in level:
            for kid in kids:
                parents.append(node)
                following.append((len(parents) - 1, kid))
        level = following
    return Tree(tuple(parents))


def _check_rates(rates: RankAcceptance) -> None:
    if not all(0.0 <= r <= 1.0 for r in rates):
        raise ValueError(f"rank acceptance rates must lie in [0, 1], got {list(rates)}")
