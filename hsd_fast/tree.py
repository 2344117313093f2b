"""Token-tree topologies for the bottom level (docs/design.md, "Token trees").

A tree of n nodes is its parent list: ``parents[j]`` is -1 (a child of the last token before the
tree, the *root*) or the index of an earlier node. Terms:

    depth     0 for a child of the root, parent's depth + 1 otherwise; never decreasing along the list,
              so the nodes of one depth are contiguous and a level drafts the tree depth by depth
    column    a node's index within its depth (0 for the first node of each depth): with the
              position it keys the node's randomness, since siblings share a position
    rank      a node's index among its siblings (0 for the first child): children are listed in the
              order they were drawn (greedy: by the draft's probability), and verified in that order
    chain     the degenerate tree ``[-1, 0, 1, ...]``: speculative decoding's usual draft block

The topology is static per run and the same for every row. A tree's value (``optimal_tree``) is
its expected accepted path length under *rank acceptance*:

    rank acceptance   ``rates[k]``: the probability that the verifier accepts a context's rank-k
                      child given that it rejected the children ranked before it (Sequoia's
                      positional acceptance, arXiv 2402.12374); the same at every context and depth
                      (the i.i.d. assumption). Ranks past the tuple are never accepted.
    rank factor       ``a_k = rates[k] * prod_{j < k} (1 - rates[j])``: the probability that the
                      walk descends into the rank-k child of a context it stands at
    reach             a node's probability of being on the accepted path: the product of the rank
                      factors along its path. The expected path length is the sum of the reaches,
                      so a tree's value is additive over its nodes.

What a tree costs and gains in seconds per token is the latency model's (``tree_latency.py``).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence, Sized
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

MAX_NODES = 256
"""The largest tree accepted: a verification feeds every node at once."""


@dataclass(frozen=True)
class Tree:
    """A static token-tree topology (module doc). Build one with ``chain``, ``full``, ``spine`` or
    ``from_parents``; the constructor checks the parent list and raises ``ValueError`` if it is
    malformed."""

    parents: tuple[int, ...]
    depths: tuple[int, ...] = field(init=False, repr=False)
    columns: tuple[int, ...] = field(init=False, repr=False)
    ranks: tuple[int, ...] = field(init=False, repr=False)
    children: tuple[tuple[int, ...], ...] = field(init=False, repr=False)  # [n + 1]: the root's last

    def __post_init__(self) -> None:
        parents = self.parents
        if not isinstance(parents, tuple) or not all(
            isinstance(p, int) and not isinstance(p, bool) for p in parents
        ):
            raise TypeError(f"Tree: parents must be a tuple of ints, got {parents!r}")
        if not 1 <= len(parents) <= MAX_NODES:
            raise ValueError(f"Tree: a tree has 1 to {MAX_NODES} nodes, got {len(parents)}")
        depths: list[int] = []
        for j, p in enumerate(parents):
            if not -1 <= p < j:
                raise ValueError(
                    f"Tree: parents[{j}] = {p}; a parent is -1 (the root) or an earlier node (< {j})"
                )
            depth = 0 if p < 0 else depths[p] + 1
            if depths and depth < depths[-1]:
                raise ValueError(
                    f"Tree: node {j} has depth {depth} after a node of depth {depths[-1]}; list the "
                    "nodes depth by depth (the depth never decreases along the list)"
                )
            depths.append(depth)
        columns, ranks = [], []
        children: list[list[int]] = [[] for _ in range(len(parents) + 1)]
        for j, (p, depth) in enumerate(zip(parents, depths, strict=True)):
            columns.append(0 if j == 0 or depths[j - 1] != depth else columns[-1] + 1)
            ranks.append(len(children[p]))  # children[-1] is the root's
            children[p].append(j)
        object.__setattr__(self, "depths", tuple(depths))
        object.__setattr__(self, "columns", tuple(columns))
        object.__setattr__(self, "ranks", tuple(ranks))
        object.__setattr__(self, "children", tuple(tuple(c) for c in children))

    # ---------------------------------------------------------------------------------- constructors
    @classmethod
    def from_parents(cls, parents: Sequence[int]) -> Tree:
        """The tree with this parent list (module doc)."""
        if isinstance(parents, Sized):  # refused before a huge sequence (a range) is copied
            _check_size("Tree.from_parents", f"len(parents) = {len(parents)}", len(parents))
        return cls(tuple(parents))

    @classmethod
    def chain(cls, n: int) -> Tree:
        """n nodes one after the other: the usual draft block of n tokens."""
        _check_count("n", n)
        _check_size("Tree.chain", f"n = {n}", n)
        return cls(tuple(range(-1, n - 1)))

    @classmethod
    def full(cls, widths: Sequence[int]) -> Tree:
        """``widths[d]`` children for every node of depth d - 1 (the root's for d = 0): a full tree
        of ``len(widths)`` levels, children grouped by parent."""
        if len(widths) == 0:
            raise ValueError("Tree.full: widths must name at least one depth")
        # The size first, from the widths alone: a product of widths can be far beyond memory.
        nodes, layer = 0, 1  # nodes so far; nodes of the depth last counted
        for d, k in enumerate(widths):
            _check_count(f"widths[{d}]", k)
            layer *= k
            nodes += layer
            shown = f"widths = {list(widths)}" if len(widths) <= 8 else f"widths[:{d + 1}]"
            _check_size("Tree.full", shown, nodes)
        parents: list[int] = []
        previous = [-1]  # the nodes of the depth above
        for k in widths:
            start = len(parents)
            parents.extend(p for p in previous for _ in range(k))
            previous = list(range(start, len(parents)))
        return cls(tuple(parents))

    @classmethod
    def spine(cls, depth: int, k: int) -> Tree:
        """The top-ranked chain of ``depth`` nodes, each with ``k - 1`` lower-ranked siblings
        (leaves): the chain the draft would take, hedged at every depth."""
        _check_count("depth", depth)
        _check_count("k", k)
        _check_size("Tree.spine", f"depth * k = {depth} * {k}", depth * k)
        parents: list[int] = []
        spine_node = -1
        for _ in range(depth):
            first = len(parents)
            parents.extend([spine_node] * k)
            spine_node = first  # the top-ranked child continues the spine
        return cls(tuple(parents))

    @classmethod
    def optimal(cls, n: int, rank_acceptance: Sequence[float], max_depth: int | None = None) -> Tree:
        """The tree of at most ``n`` nodes (and ``max_depth`` depths) whose accepted path is longest
        on average when the rank-k candidate is accepted with probability ``rank_acceptance[k]``
        given the earlier ones were rejected (``optimal_tree``)."""
        return optimal_tree(n, rank_acceptance, max_depth)

    # ---------------------------------------------------------------------------------- properties
    @property
    def num_nodes(self) -> int:
        return len(self.parents)

    @property
    def depth(self) -> int:
        """The number of depths: the longest path from the root."""
        return self.depths[-1] + 1

    @property
    def widths(self) -> tuple[int, ...]:
        """Nodes per depth."""
        return tuple(self.depths.count(d) for d in range(self.depth))

    @property
    def most_children(self) -> int:
        """The most children of one context (the root's included): siblings are distinct tokens, so
        a vocabulary of fewer tokens cannot draft this tree."""
        return max(len(kids) for kids in self.children)

    @property
    def is_chain(self) -> bool:
        return all(p == j - 1 for j, p in enumerate(self.parents))

    def depth_slice(self, d: int) -> slice:
        """The nodes of depth ``d`` (contiguous: the depth never decreases along the list)."""
        start = self.depths.index(d)
        return slice(start, start + self.widths[d])

    def is_leaf(self, j: int) -> bool:
        return not self.children[j]

    def path(self, j: int) -> list[int]:
        """The nodes from the root's first child down to node j."""
        nodes = []
        while j >= 0:
            nodes.append(j)
            j = self.parents[j]
        return nodes[::-1]

    def ancestors(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """[n, n] bool: ``[i, j]`` where node j is node i or one of its ancestors (what node i attends
        to inside the tree; for a chain the lower triangle)."""
        import torch  # here only: the topology is pure Python, and the latency model reads it

        n = self.num_nodes
        mask = torch.zeros(n, n, dtype=torch.bool)
        for i, p in enumerate(self.parents):
            if p >= 0:
                mask[i] = mask[p]
            mask[i, i] = True
        return mask.to(device)

    def __repr__(self) -> str:
        if self.is_chain:
            return f"Tree.chain({self.num_nodes})"
        return f"Tree.from_parents({list(self.parents)})"


def _check_count(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"Tree: {name} must be an int, got {value!r}")
    if value < 1:
        raise ValueError(f"Tree: {name} must be >= 1, got {value}")


def _check_size(constructor: str, asked: str, nodes: int) -> None:
    """Refuse ``nodes`` beyond ``MAX_NODES`` from the arguments alone, before any list is built."""
    if nodes > MAX_NODES:
        raise ValueError(
            f"{constructor}: {asked} gives {nodes} nodes; a tree has 1 to {MAX_NODES} nodes (MAX_NODES)"
        )


# ------------------------------------------------------------- value under rank acceptance
RankAcceptance = Sequence[float]


def rank_factors(rates: RankAcceptance) -> list[float]:
    """``a_k`` for every rank of ``rates`` (module doc)."""
    check_rates(rates)
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


def check_rates(rates: RankAcceptance) -> None:
    if not all(0.0 <= r <= 1.0 for r in rates):
        raise ValueError(f"rank acceptance rates must lie in [0, 1], got {list(rates)}")
