"""Token-tree topologies (hsd_fast/tree.py): the constructors build the trees they name, the derived
terms (depth, column, rank, children, ancestors) follow the parent list, and malformed lists raise."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from hsd_fast.tree import MAX_NODES, Tree


@st.composite
def parent_lists(draw: st.DrawFn) -> list[int]:
    """Well-formed parent lists: depth by depth, each node's parent among the previous depth's nodes."""
    parents: list[int] = []
    previous = [-1]
    for _ in range(draw(st.integers(1, 4))):
        width = draw(st.integers(1, 4))
        start = len(parents)
        parents += sorted(draw(st.sampled_from(previous)) for _ in range(width))
        previous = list(range(start, len(parents)))
    return parents


def test_a_chain_is_the_degenerate_tree() -> None:
    tree = Tree.chain(4)
    assert tree.parents == (-1, 0, 1, 2) and tree.is_chain and tree.depth == 4
    assert tree.columns == (0, 0, 0, 0) and tree.ranks == (0, 0, 0, 0) and tree.widths == (1, 1, 1, 1)
    assert torch.equal(tree.ancestors(), torch.ones(4, 4, dtype=torch.bool).tril())
    assert repr(tree) == "Tree.chain(4)"


def test_full_gives_every_node_of_a_depth_its_children() -> None:
    tree = Tree.full([2, 3])
    assert tree.parents == (-1, -1, 0, 0, 0, 1, 1, 1)
    assert tree.widths == (2, 6) and tree.columns == (0, 1, 0, 1, 2, 3, 4, 5)
    assert tree.ranks == (0, 1, 0, 1, 2, 0, 1, 2)
    assert tree.children[0] == (2, 3, 4) and tree.children[-1] == (0, 1)  # children[-1]: the root's
    assert not tree.is_chain and tree.is_leaf(7) and not tree.is_leaf(1)


def test_spine_hedges_the_top_ranked_chain() -> None:
    tree = Tree.spine(3, 2)
    assert tree.parents == (-1, -1, 0, 0, 2, 2)
    assert tree.path(4) == [0, 2, 4] and tree.path(5) == [0, 2, 5] and tree.path(1) == [1]
    assert Tree.spine(3, 1) == Tree.chain(3)


@given(parent_lists())
def test_derived_terms_follow_the_parent_list(parents: list[int]) -> None:
    tree = Tree.from_parents(parents)
    ancestors = tree.ancestors()
    for j, p in enumerate(parents):
        assert tree.depths[j] == (0 if p < 0 else tree.depths[p] + 1)
        assert tree.depths[j] == len(tree.path(j)) - 1
        assert ancestors[j].nonzero().flatten().tolist() == sorted(tree.path(j))
        assert tree.children[p][tree.ranks[j]] == j
        assert tree.columns[j] == j - tree.depth_slice(tree.depths[j]).start
    assert sum(tree.widths) == tree.num_nodes == len(parents)
    assert sorted(c for kids in tree.children for c in kids) == list(range(len(parents)))


@pytest.mark.parametrize(
    ("parents", "match"),
    [
        ([], "1 to"),
        ([0], "earlier node"),
        ([-1, 1], "earlier node"),
        ([-1, -2], "earlier node"),
        ([-1, 0, -1], "depth by depth"),
        (list(range(-1, MAX_NODES)), "1 to"),
    ],
)
def test_malformed_parent_lists_raise(parents: list[int], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Tree.from_parents(parents)


def test_bad_constructor_arguments_raise() -> None:
    with pytest.raises(ValueError, match=">= 1"):
        Tree.chain(0)
    with pytest.raises(TypeError, match="int"):
        Tree.spine(2, 1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least one depth"):
        Tree.full([])
    with pytest.raises(ValueError, match="1 to"):
        Tree.full([16, 16])
    with pytest.raises(TypeError, match="tuple of ints"):
        Tree((-1, True))
