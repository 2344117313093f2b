"""Tree drafting and verification, the torch references (triton_kernels/tree_torch.py).

- A chain tree draws and verifies exactly what the chain ops do (same keys, same tokens).
- Greedy: the path follows the verifier's argmax through the tree.
- Sampling is exact: decoding table models with trees (drafted by ``draft_children_torch``, verified
  by ``verify_tree_torch``) gives the target's distribution (chi-square, 20k rows), for several trees
  and temperatures and with more children than the draft's support (top-k = 2, three children).
  Each planted bug fails the same test: q not updated after a rejected sibling, siblings sharing one
  accept uniform.
"""

from __future__ import annotations

import pytest
import torch
from planted_bugs import q_not_updated_after_a_rejected_sibling, siblings_share_one_accept_uniform

from hsd_fast.testing.exactness import pooled_chi_square
from hsd_fast.testing.tables import TableModel, table_family
from hsd_fast.tree import Tree
from hsd_fast.triton_kernels.keyed_random_torch import DRAFT
from hsd_fast.triton_kernels.rejection_torch import verify_torch
from hsd_fast.triton_kernels.sampling_torch import sample_torch
from hsd_fast.triton_kernels.tree_torch import draft_children_torch, node_key, verify_tree_torch

VOCAB, ORDER, STEPS = 4, 2, 3


def _contexts_of(tree: Tree, history: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """[R, n + 1, ORDER]: the last ORDER tokens before each context's child (root: ``history``)."""
    contexts = [history]
    for j, p in enumerate(tree.parents):
        contexts.append(torch.cat([contexts[p + 1][:, 1:], tokens[:, j : j + 1]], 1))
    return torch.stack(contexts, 1)


def _draft_tree(
    tree: Tree, draft: TableModel, history: torch.Tensor, seeds, positions, temperature, greedy, top_k=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Level 0 drafts the tree depth by depth: each context's children from its q. Returns the
    nodes' tokens [R, n] and the draft's processed logits at every context [R, n + 1, V]."""
    rows = history.shape[0]
    tokens = torch.zeros(rows, tree.num_nodes, dtype=torch.int64)
    for d in range(tree.depth):
        contexts = _contexts_of(tree, history, tokens)  # nodes above depth d are final
        for c in range(tree.num_nodes + 1):
            kids = tree.children[c - 1] if c > 0 else tree.children[-1]
            if not kids or tree.depths[kids[0]] != d:
                continue
            logits = _processed(draft.next_logits(contexts[:, c]), top_k)
            key = node_key(positions, 0) if c == 0 else node_key(positions + d, tree.columns[c - 1])
            children, _ = draft_children_torch(logits, len(kids), temperature, seeds, key, 0, greedy)
            tokens[:, list(kids)] = children
    return tokens, _logits_at(draft, _contexts_of(tree, history, tokens), top_k)


def _logits_at(model: TableModel, contexts: torch.Tensor, top_k: int | None) -> torch.Tensor:
    """[R, n + 1, V] the model's processed logits at every context ([R, n + 1, ORDER])."""
    return _processed(model.next_logits(contexts.flatten(0, 1)), top_k).unflatten(0, contexts.shape[:2])


def _processed(logits: torch.Tensor, top_k: int | None) -> torch.Tensor:
    if top_k is None:
        return logits
    kth = logits.topk(top_k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def tree_decode(
    tree: Tree,
    family: list[TableModel],
    num_rows: int,
    *,
    temperature: float = 1.0,
    greedy: bool = False,
    top_k: int | None = None,
    seed: int = 0,
) -> list[tuple[int, ...]]:
    """Decode STEPS tokens after the prompt [0, 1] for ``num_rows`` rows with tree speculation,
    draft ``family[0]``, target ``family[-1]``; the rows' continuations."""
    draft, target = family[0], family[-1]
    total = ORDER + STEPS
    sequences = torch.zeros(num_rows, total + tree.depth + 1, dtype=torch.int64)
    sequences[:, :ORDER] = torch.arange(ORDER) % VOCAB
    lengths = torch.full((num_rows,), ORDER)
    seeds = torch.arange(num_rows, dtype=torch.int64) + 1000 * seed
    temperatures = torch.full((num_rows,), temperature)
    rows = torch.arange(num_rows)
    while bool((lengths < total).any()):
        history = sequences[rows[:, None], lengths[:, None] - ORDER + torch.arange(ORDER)]  # [R, ORDER]
        tokens, draft_logits = _draft_tree(tree, draft, history, seeds, lengths, temperatures, greedy, top_k)
        verifier_logits = _logits_at(target, _contexts_of(tree, history, tokens), top_k)
        result = verify_tree_torch(
            verifier_logits, None if greedy else draft_logits, tokens, tree, temperatures, seeds, lengths, 1,
            greedy, max_depth=total - lengths - 1,
        )  # fmt: skip
        active = lengths < total
        for d in range(result.path.shape[1]):
            node = result.path[:, d]
            write = active & (node >= 0)
            sequences[rows[write], lengths[write] + d] = tokens[rows[write], node[write]]
        at = lengths + result.num_accepted
        sequences[rows[active], at[active]] = result.next_token[active]
        lengths = torch.where(active, at + 1, lengths)
    return [tuple(s) for s in sequences[:, ORDER:total].tolist()]


def _exact(target: TableModel, temperature: float, top_k: int | None) -> dict[tuple[int, ...], float]:
    if top_k is None:
        return target.continuation_probs([0, 1], STEPS, temperature)
    return TableModel(_processed(target.logits, top_k), ORDER).continuation_probs([0, 1], STEPS, temperature)


TREES = {
    "full 2x2": Tree.full([2, 2]),
    "spine 3x3": Tree.spine(3, 3),
    "wide 4": Tree.full([4]),
    "uneven": Tree.from_parents([-1, -1, -1, 0, 0, 2, 3]),
}


@pytest.mark.parametrize(
    ("name", "temperature", "top_k"),
    [("full 2x2", 1.0, None), ("spine 3x3", 0.7, None), ("wide 4", 1.3, None), ("uneven", 1.0, 2)],
)
def test_sampled_tree_decoding_is_exact(name: str, temperature: float, top_k: int | None) -> None:
    family = table_family(VOCAB, ORDER, 2, spread=2.0, seed=5)
    samples = tree_decode(TREES[name], family, 20_000, temperature=temperature, top_k=top_k)
    assert pooled_chi_square(samples, _exact(family[-1], temperature, top_k)).p_value > 1e-3


PLANTED = [q_not_updated_after_a_rejected_sibling, siblings_share_one_accept_uniform]  # planted_bugs.py


@pytest.mark.parametrize("planted", PLANTED)
def test_each_planted_bug_fails_the_same_test(planted) -> None:
    family = table_family(VOCAB, ORDER, 2, spread=2.0, seed=5)
    with planted():
        samples = tree_decode(TREES["spine 3x3"], family, 20_000, temperature=1.0)
    assert pooled_chi_square(samples, _exact(family[-1], 1.0, None)).p_value < 1e-6


@pytest.mark.parametrize("name", list(TREES))
def test_greedy_tree_decoding_is_the_targets_greedy_output(name: str) -> None:
    family = table_family(VOCAB, ORDER, 2, spread=2.0, seed=5)
    target = family[-1]
    expected = [0, 1]
    for _ in range(STEPS):
        expected.append(int(target.next_logits(torch.tensor([expected[-ORDER:]])).argmax()))
    assert set(tree_decode(TREES[name], family, 4, greedy=True)) == {tuple(expected[ORDER:])}


def test_a_chain_tree_draws_and_verifies_what_the_chain_ops_do() -> None:
    """Tree.chain(n) against a block of n drafts: the same draft tokens (sample_torch, column 0 keys)
    and the same accepted counts and corrections or bonuses (verify_torch), token for token."""
    rows, n, vocab = 512, 4, 6
    gen = torch.Generator().manual_seed(0)
    seeds = torch.randint(0, 2**40, (rows,), generator=gen)
    positions = torch.randint(0, 1000, (rows,), generator=gen)
    temperature = torch.full((rows,), 0.9)
    draft_logits = torch.randn(rows, n + 1, vocab, generator=gen)
    # The verifier agrees with the draft often enough that all four outcomes occur.
    verifier_logits = draft_logits + 0.8 * torch.randn(rows, n + 1, vocab, generator=gen)
    tree = Tree.chain(n)
    children = [
        draft_children_torch(draft_logits[:, k], 1, temperature, seeds, node_key(positions + k, 0), 0, False)[
            0
        ]
        for k in range(n)
    ]
    tokens = torch.cat(children, 1)  # [rows, n]
    for k in range(n):
        drawn, _ = sample_torch(draft_logits[:, k], temperature, seeds, positions + k, 0, DRAFT, False)
        assert torch.equal(tokens[:, k], drawn)
    draft_lse = torch.logsumexp(draft_logits[:, :n] / temperature[:, None, None], -1)
    chain = verify_torch(
        verifier_logits, draft_logits[:, :n], draft_lse, tokens, torch.full((rows,), n), temperature, seeds,
        positions, 1, False,
    )  # fmt: skip
    result = verify_tree_torch(
        verifier_logits, draft_logits, tokens, tree, temperature, seeds, positions, 1, False
    )
    assert torch.equal(result.num_accepted, chain.num_accepted)
    assert torch.equal(result.next_token, chain.next_token)
    assert set(chain.num_accepted.tolist()) == set(range(n + 1))
    expected_path = torch.where(torch.arange(n) < chain.num_accepted[:, None], torch.arange(n), -1)
    assert torch.equal(result.path, expected_path)


def test_children_are_distinct_and_the_first_is_a_single_draw() -> None:
    rows, vocab = 256, 8
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(rows, vocab, generator=gen)
    seeds, keys = torch.arange(rows), node_key(torch.full((rows,), 7), 3)
    temperature = torch.ones(rows)
    children, _ = draft_children_torch(logits, 5, temperature, seeds, keys, 0, False)
    assert all(len(set(row)) == 5 for row in children.tolist())
    single, _ = draft_children_torch(logits, 1, temperature, seeds, keys, 0, False)
    assert torch.equal(children[:, 0], single[:, 0])
    greedy, _ = draft_children_torch(logits, 3, temperature, seeds, keys, 0, True)
    assert torch.equal(greedy, logits.topk(3, -1).indices)


def test_bad_tree_arguments_raise() -> None:
    logits = torch.zeros(2, 4)
    ones, seeds = torch.ones(2), torch.zeros(2, dtype=torch.int64)
    with pytest.raises(ValueError, match="num_children"):
        draft_children_torch(logits, 5, ones, seeds, seeds, 0, False)
    with pytest.raises(ValueError, match="2\\*\\*24"):
        node_key(torch.tensor([1 << 24]), 0)
    tree = Tree.chain(2)
    with pytest.raises(ValueError, match="draft's logits"):
        verify_tree_torch(
            torch.zeros(2, 3, 4),
            None,
            torch.zeros(2, 2, dtype=torch.int64),
            tree,
            ones,
            seeds,
            seeds,
            1,
            False,
        )
