"""Sizes are bounded from the arguments, before any work (issue 46, items 3 and 6).

- A token tree's size is counted from the constructor's arguments and refused beyond ``MAX_NODES``
  before its parent list is built (``Tree.full([10**9])`` once built a 24 GB list to refuse it).
- A lookup level's ``max_ngram`` is at most ``MAX_NGRAM``, in Python and in C++ alike.
- ``select_hierarchy`` checks its sizes (``tree_sizes``, ``max_T``, ``batch``) before profiling.
- ``wrap`` checks its tree and ``compile`` when it is made; ``generate`` refuses a tree wider than the
  vocabulary naming ``tree``, and a bad ``compile``, before anything is allocated.
- A second ``__init__`` on a constructed ledger or lookup index is refused, not ignored.

``max_new_tokens`` is bounded by the models' positions (``positions.py``), which size the caches
allocated up front (docs/design.md, "Slot = position"): the request tests cover that check.
"""

from __future__ import annotations

import tracemalloc

import pytest
import torch
from hf_models import tiny_model

import hsd_fast
from hsd_fast import _C
from hsd_fast.hf_runner import HFRunner
from hsd_fast.lookup import MAX_NGRAM, LookupDraft
from hsd_fast.tree import MAX_NODES, Tree

# ------------------------------------------------------------------------------------- token trees
HUGE = {
    "chain": lambda: Tree.chain(10**6),
    "full": lambda: Tree.full([10**6]),
    "full, two depths": lambda: Tree.full([1000, 1000]),
    "spine": lambda: Tree.spine(2, 10**6),
    "from_parents": lambda: Tree.from_parents(range(-1, 10**6)),
}


@pytest.mark.parametrize("build", HUGE.values(), ids=HUGE.keys())
def test_a_huge_tree_is_refused_from_its_arguments(build) -> None:
    """Refused naming the limit, without building anything the size of the tree (a million-node
    list alone takes 8 MB)."""
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=rf"1 to {MAX_NODES} nodes"):
            build()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 100_000, f"{peak} bytes allocated before the refusal"


@pytest.mark.parametrize(
    ("fits", "too_big", "argument"),
    [
        (lambda: Tree.chain(MAX_NODES), lambda: Tree.chain(MAX_NODES + 1), "n"),
        (lambda: Tree.spine(16, 16), lambda: Tree.spine(16, 17), "depth \\* k"),
        (lambda: Tree.full([16, 15]), lambda: Tree.full([16, 16]), "widths"),
        (lambda: Tree.full([1] * MAX_NODES), lambda: Tree.full([1] * (MAX_NODES + 1)), "widths"),
    ],
    ids=["chain", "spine", "full", "full, deep"],
)
def test_the_limit_itself_is_served(fits, too_big, argument) -> None:
    assert fits().num_nodes == MAX_NODES
    with pytest.raises(ValueError, match=argument):
        too_big()


# ------------------------------------------------------------------------------------ lookup level
@pytest.mark.parametrize("max_ngram", [MAX_NGRAM + 1, 10**8, 2**62, 2**63, 2**64])
def test_max_ngram_is_bounded(max_ngram: int) -> None:
    with pytest.raises(ValueError, match=rf"max_ngram <= {MAX_NGRAM}"):
        LookupDraft(max_ngram=max_ngram)
    assert LookupDraft(max_ngram=MAX_NGRAM).max_ngram == MAX_NGRAM


def test_the_cpp_index_has_the_same_bound() -> None:
    assert _C.MAX_NGRAM == MAX_NGRAM
    _C.LookupIndex(MAX_NGRAM, 1)
    for build in (lambda: _C.LookupIndex(MAX_NGRAM + 1, 1), lambda: _C.LookupLevel(2, MAX_NGRAM + 1, 1, [])):
        with pytest.raises(ValueError, match=rf"max_ngram <= {MAX_NGRAM}"):
            build()


# --------------------------------------------------------------------- constructed once, not twice
@pytest.mark.parametrize(
    ("build", "again", "probe"),
    [
        (lambda: _C.Ledger(2, [2], [3], 5), (3, [2, 2], [3, 4], 7), lambda x: (x.num_levels, x.num_rows)),
        (lambda: _C.LookupIndex(3, 1), (5, 2), lambda x: (x.max_ngram, x.min_ngram)),
        (lambda: _C.LookupLevel(2, 3, 1, [0]), (4, 3, 1, [0]), lambda x: x.num_rows),
    ],
    ids=["Ledger", "LookupIndex", "LookupLevel"],
)
def test_a_second_init_is_refused(build, again, probe) -> None:
    """pybind11 would silently keep the old object: the caller would think it had a new one."""
    made = build()
    before = probe(made)
    with pytest.raises(TypeError, match="already constructed"):
        made.__init__(*again)
    assert probe(made) == before


def test_init_still_constructs_a_bare_instance_and_a_subclass() -> None:
    bare = _C.Ledger.__new__(_C.Ledger)
    bare.__init__(2, [2], [3], max_new_tokens=5, policy="highest_level")
    assert (bare.num_levels, bare.policy) == (2, "highest_level")

    class Sub(_C.Ledger):
        def __init__(self) -> None:
            super().__init__(3, [1, 2], [4, 4], 6)

    assert Sub().num_rows == 2


# ------------------------------------------------------------------------------- select_hierarchy
@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"tree_sizes": 4}, TypeError, "tree_sizes must be a list"),
        ({"tree_sizes": [4, 2.5]}, TypeError, "tree size in tree_sizes must be an int"),
        ({"tree_sizes": [4, MAX_NODES + 1]}, ValueError, rf"tree_sizes must be in \[1, {MAX_NODES}\]"),
        ({"tree_sizes": [0]}, ValueError, rf"tree_sizes must be in \[1, {MAX_NODES}\]"),
        ({"max_T": 65}, ValueError, r"max_T must be in \[1, 64\]"),
        ({"batch": 0}, ValueError, "batch must be >= 1"),
    ],
    ids=["an-int", "a-float", "too-big", "zero", "max_T", "batch"],
)
@pytest.mark.hf
def test_select_hierarchy_checks_its_sizes_before_profiling(kwargs, error, match, monkeypatch) -> None:
    def measured(*args, **kwargs):
        raise AssertionError("profiled before the arguments were checked")

    monkeypatch.setattr("hsd_fast.profile.ProfileCache.costs", measured)
    with pytest.raises(error, match=match):
        hsd_fast.select_hierarchy(
            torch.nn.Linear(2, 2), ["lookup"], torch.zeros(1, 8, dtype=torch.long), **kwargs
        )


# --------------------------------------------------------------------------------- wrap and generate
@pytest.fixture(scope="module")
def models() -> tuple[torch.nn.Module, torch.nn.Module]:
    """A target of 8 tokens (a tree of 9 siblings cannot be drafted from it) and a draft."""
    return tiny_model(vocab_size=8, layers=1), tiny_model(vocab_size=8, layers=1, seed=1)


WRAP_ERRORS = [
    ({"tree": "spine"}, TypeError, "tree must be a hsd_fast.Tree"),
    ({"tree": Tree.chain(3), "drafts": ["lookup"]}, ValueError, "tree: a token tree is drafted by a model"),
    ({"tree": Tree.chain(3), "drafts": []}, ValueError, "tree: a token tree is drafted by a model"),
    ({"tree": Tree.chain(65)}, ValueError, "at most 64 deep"),
    ({"compile": "yes"}, ValueError, "compile must be True, False or 'auto'"),
    ({"compile": None}, ValueError, "compile must be True, False or 'auto'"),
]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    WRAP_ERRORS,
    ids=["tree-type", "tree-lookup", "tree-alone", "deep", "yes", "None"],
)
@pytest.mark.hf
def test_wrap_checks_tree_and_compile_when_made(models, kwargs, error, match) -> None:
    target, draft = models
    kwargs = {"drafts": [draft], **kwargs}
    with pytest.raises(error, match=match):
        hsd_fast.wrap(target, **kwargs)


@pytest.fixture
def nothing_allocated(monkeypatch) -> None:
    def prepare(*args, **kwargs):
        raise AssertionError("a runner was prepared (its cache allocated) before the request was checked")

    monkeypatch.setattr(HFRunner, "prepare", prepare)


@pytest.mark.hf
def test_a_tree_wider_than_the_vocabulary_is_refused_naming_tree(models, nothing_allocated) -> None:
    target, draft = models
    ids = torch.tensor([[1, 3, 5]])
    with pytest.raises(ValueError, match="tree: a node has 9 children") as info:
        target.generate(
            ids, custom_generate=hsd_fast.generate, drafts=[draft], tree=Tree.full([9]), max_new_tokens=4,
            do_sample=False,
        )  # fmt: skip
    assert "num_children" not in str(info.value)
    with pytest.raises(ValueError, match="tree: a node has 9 children"):
        hsd_fast.wrap(target, [draft], tree=Tree.spine(2, 9)).generate(ids, max_new_tokens=4, do_sample=False)


@pytest.mark.hf
def test_generate_checks_compile_before_allocating(models, nothing_allocated) -> None:
    target, draft = models
    with pytest.raises(ValueError, match="compile must be True, False or 'auto'"):
        target.generate(
            torch.tensor([[1, 3, 5]]), custom_generate=hsd_fast.generate, drafts=[draft], compile="yes",
            max_new_tokens=4, do_sample=False,
        )  # fmt: skip


@pytest.mark.hf
def test_with_a_tree_t0_is_checked_as_any_block_size(models) -> None:
    """The decision (README, "What generate supports"): T[0] is checked like every block size, then
    stands for the tree's depth."""
    target, draft = models
    with pytest.raises(ValueError, match="T must be >= 1 and <= 64"):
        hsd_fast.wrap(target, [draft], T=[99], tree=Tree.spine(2, 2))
    ids = torch.tensor([[1, 3, 5, 2]])
    out = hsd_fast.wrap(target, [draft], T=[1], tree=Tree.spine(3, 2), compile=False).generate(
        ids, max_new_tokens=6, do_sample=False
    )
    assert torch.equal(out, target.generate(ids, max_new_tokens=6, do_sample=False))
