"""The value and cost model of a token tree (hsd_fast/tree.py, hsd_fast/tree_latency.py): the
expected accepted path length against Monte Carlo runs of the same model on random trees and rates,
the optimal tree against brute force over every tree of up to 7 nodes, and the latency per token."""

from __future__ import annotations

import math
import random

import pytest

from hsd_fast.latency import AffineCost, expected_latency, simulate
from hsd_fast.selector import select
from hsd_fast.tree import Tree, expected_path_length, optimal_tree, rank_factors
from hsd_fast.tree_latency import simulate_path_lengths, tree_acceptance, tree_cost, tree_latency


def _random_tree(rng: random.Random, n: int) -> Tree:
    """A random tree of n nodes, listed depth by depth (children grouped by parent)."""
    parents_of = [-1]  # the root, then nodes by creation
    for _ in range(n):
        parents_of.append(rng.randrange(len(parents_of)) - 1)
    kids: dict[int, list[int]] = {}
    for node, parent in enumerate(parents_of[1:]):
        kids.setdefault(parent, []).append(node)
    parents, level = [], [(-1, -1)]  # (new index, old index)
    while level:
        following = []
        for new, old in level:
            for kid in kids.get(old, []):
                parents.append(new)
                following.append((len(parents) - 1, kid))
        level = following
    return Tree(tuple(parents))


def _shapes(n: int):
    """Every ordered tree of n nodes under a root, as nested tuples of child subtrees."""
    if n == 0:
        yield ()
        return
    for first in range(1, n + 1):
        for inside in _shapes(first - 1):
            for rest in _shapes(n - first):
                yield (inside, *rest)


def _shape_depth(shape: tuple) -> int:
    return 1 + max((_shape_depth(kid) for kid in shape), default=0) if shape else 0


@pytest.mark.parametrize("seed", range(6))
def test_the_expected_path_length_matches_monte_carlo(seed: int) -> None:
    rng = random.Random(seed)
    tree = _random_tree(rng, rng.randrange(1, 16))
    rates = [rng.uniform(0.1, 0.9) for _ in range(rng.randrange(1, 5))]
    lengths = simulate_path_lengths(tree, rates, 40_000, seed=seed)
    mean = sum(lengths) / len(lengths)
    spread = math.sqrt(sum((x - mean) ** 2 for x in lengths) / (len(lengths) - 1) / len(lengths))
    assert abs(mean - expected_path_length(tree, rates)) < 4 * spread + 1e-9


def test_a_chain_reaches_the_powers_of_its_rate() -> None:
    assert expected_path_length(Tree.chain(3), [0.5]) == pytest.approx(0.5 + 0.25 + 0.125)
    assert rank_factors([0.5, 0.5, 1.0]) == pytest.approx([0.5, 0.25, 0.25])


@pytest.mark.parametrize("seed", range(8))
def test_the_optimal_tree_beats_every_tree_of_its_size(seed: int) -> None:
    """Brute force over every ordered tree of up to 7 nodes, with a depth limit in half the cases;
    rates drawn so that the rank factors are sometimes increasing (a later rank more likely)."""
    rng = random.Random(seed)
    rates = [rng.uniform(0.05, 0.95) for _ in range(rng.randrange(1, 4))]
    n = rng.randrange(1, 8)
    max_depth = rng.randrange(1, 4) if seed % 2 else None
    factors = rank_factors(rates)

    def value(shape: tuple, reach: float = 1.0) -> float:
        if any(rank >= len(factors) for rank in range(len(shape))):
            return -1.0  # a rank that is never accepted: not a candidate
        return sum(reach * factors[r] + value(kid, reach * factors[r]) for r, kid in enumerate(shape))

    best = max(
        value(shape)
        for size in range(1, n + 1)
        for shape in _shapes(size)
        if max_depth is None or _shape_depth(shape) <= max_depth
    )
    tree = optimal_tree(n, rates, max_depth)
    assert tree.num_nodes <= n and (max_depth is None or tree.depth <= max_depth)
    assert expected_path_length(tree, rates) == pytest.approx(best, rel=1e-12)
    assert Tree.optimal(n, rates, max_depth) == tree


def test_one_rate_makes_the_optimal_tree_a_chain_and_arguments_are_checked() -> None:
    assert optimal_tree(5, [0.7]) == Tree.chain(5)
    assert optimal_tree(4, [0.9, 0.5], max_depth=1) == Tree.full([2])
    with pytest.raises(ValueError, match="lie in"):
        optimal_tree(3, [1.5])
    with pytest.raises(ValueError, match="num_nodes"):
        optimal_tree(0, [0.5])
    with pytest.raises(ValueError, match="no child is ever accepted"):
        optimal_tree(3, [0.0])


def test_tree_latency_is_its_costs_over_the_expected_tokens() -> None:
    """Level 0: the token before the tree, then depths 0 and 1 of a 3-deep spine (2 nodes each);
    the verifier: 7 tokens; against a Monte Carlo run of the same tree."""
    tree, rates = Tree.spine(3, 2), [0.6, 0.3]
    draft, verifier = AffineCost(1.0, 0.1), AffineCost(10.0, 1.0)
    cost = draft(1) + 2 * draft(2) + verifier(7)
    lengths = simulate_path_lengths(tree, rates, 40_000, seed=1)
    measured = cost * len(lengths) / sum(x + 1 for x in lengths)
    assert tree_latency(tree, draft, verifier, rates) == pytest.approx(measured, rel=0.02)


def test_a_tree_in_a_hierarchy_matches_monte_carlo() -> None:
    """Three levels, a tree drafted at level 0: the exact recursion against ``latency.simulate``
    (the tree as its per-position acceptance and its cost)."""
    tree = Tree.optimal(8, [0.55, 0.3, 0.2])
    costs = [tree_cost(tree, AffineCost(1.0, 0.2)), AffineCost(4.0, 0.5), AffineCost(20.0, 2.0)]
    alphas = [tree_acceptance(tree, [0.55, 0.3, 0.2]), 0.8]
    mean, error = simulate(costs, alphas, [tree.depth, 3], rounds=30_000, seed=2)
    assert abs(mean - expected_latency(costs, alphas, [tree.depth, 3])) < 4 * error


def test_the_selector_takes_a_tree_only_where_it_pays() -> None:
    """Candidates: a draft, the same draft drafting a 3-wide spine, the target. A verifier whose cost
    hardly grows with its width makes the tree pay; a steep one makes the chain pay. Either way the
    pick is never predicted slower than the best chain."""
    rates, tree = [0.5, 0.35, 0.25], Tree.spine(4, 3)
    for per_token, tree_wins in [(0.01, True), (3.0, False)]:
        draft, target = AffineCost(1.0, 0.01), AffineCost(30.0, per_token)
        chain_alpha = rates[0]
        costs = [draft, tree_cost(tree, draft), target]
        at = tree_acceptance(tree, rates)
        alpha = [[1.0, 1.0, chain_alpha], [1.0, 1.0, at], [chain_alpha, at, 1.0]]
        pick = select(costs, alpha, max_T=8)
        chains_only = select([draft, target], [[1.0, chain_alpha], [chain_alpha, 1.0]], max_T=8)
        assert pick.predicted_latency <= chains_only.predicted_latency + 1e-12
        assert (pick.chain[0] == 1) == tree_wins, pick
