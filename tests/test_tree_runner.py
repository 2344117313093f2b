"""A token tree through the HF runner (hsd_fast/hf_runner.py, FedBlock ``slots`` and ``sees``): one
forward over catch-up tokens and a tree gives, at every node, the logits of the model run on the
prompt followed by the node's path; after the accepted path's K/V move to the slots it now stands
for (``SlotCache.move``), decoding on from it gives the logits of a plain run. Ragged rows, with a
padding column."""

from __future__ import annotations

import pytest
import torch
from hf_models import tiny_model

from hsd_fast.hf_runner import HFRunner
from hsd_fast.layout import FedBlock, fed_block
from hsd_fast.tree import Tree

pytestmark = pytest.mark.hf

VOCAB = 96


def _plain_logits(model: torch.nn.Module, sequence: list[int]) -> torch.Tensor:
    """[V] the model's logits after ``sequence``, without any cache."""
    with torch.no_grad():
        return model(input_ids=torch.tensor([sequence])).logits[0, -1]


def _tree_block(
    tree: Tree, catch_up: list[list[int]], prompt_lens: list[int], nodes: torch.Tensor, width: int
) -> FedBlock:
    """Per row: its catch-up tokens (the prompt's last ones, not yet cached) then the tree's nodes,
    right-aligned in ``width`` columns. Node j stands at position P + depth_j and is cached at slot
    P + j, P the row's prompt length; it sees the prompt and its ancestors."""
    rows, n = len(catch_up), tree.num_nodes
    ids = torch.zeros(rows, width, dtype=torch.int64)
    positions, slots = torch.zeros_like(ids), torch.zeros_like(ids)
    valid = torch.zeros(rows, width, dtype=torch.bool)
    tree_sees = torch.zeros(rows, width, n, dtype=torch.bool)
    tree_sees[:, width - n :] = tree.ancestors()
    depths = torch.tensor(tree.depths)
    for r, (tokens, length) in enumerate(zip(catch_up, prompt_lens, strict=True)):
        c = len(tokens)
        ids[r, width - n - c :] = torch.cat([torch.tensor(tokens), nodes[r]])
        positions[r, width - n - c :] = torch.cat([torch.arange(length - c, length), length + depths])
        slots[r, width - n - c :] = torch.cat([torch.arange(length - c, length), length + torch.arange(n)])
        valid[r, width - n - c :] = True
    return FedBlock(ids, positions, valid, slots, torch.tensor(prompt_lens), tree_sees)


def _depth_block(tree: Tree, d: int, prompt_lens: list[int], nodes: torch.Tensor) -> FedBlock:
    """The nodes of depth d alone, as level 0 feeds them when it drafts depth d + 1: each sees its
    ancestors, cached by the forwards of the depths above."""
    span = tree.depth_slice(d)
    rows, width = len(prompt_lens), span.stop - span.start
    lens = torch.tensor(prompt_lens)[:, None]
    tree_sees = tree.ancestors()[span].expand(rows, -1, -1)
    slots = lens + torch.arange(span.start, span.stop)  # [rows, width]
    valid = torch.ones(rows, width, dtype=torch.bool)
    return FedBlock(nodes[:, span], (lens + d).expand(-1, width), valid, slots, lens[:, 0], tree_sees)


def _cached_prompts(
    model: torch.nn.Module, prompts: list[list[int]], uncached: list[int], attention_path: str
) -> tuple:
    """A runner for ``model`` (on ``attention_path``) that has cached each prompt but its last
    ``uncached[r]`` tokens, and the token buffer ([rows, 32]) holding the prompts."""
    rows = len(prompts)
    runner = HFRunner(model, VOCAB, attention_path)
    runner.prepare(rows, 32)
    tokens = torch.zeros(rows, 32, dtype=torch.int64)
    for r, p in enumerate(prompts):
        tokens[r, : len(p)] = torch.tensor(p)
    ends = torch.tensor([len(p) - u for p, u in zip(prompts, uncached, strict=True)])
    everyone = torch.ones(rows, dtype=torch.bool)
    with torch.no_grad():
        runner.forward(fed_block(tokens, torch.zeros(rows, dtype=torch.int64), ends, everyone, 8), 1)
    return runner, tokens


# "fused": the tree-attention kernel (interpreted on the CPU) through transformers' attention
# interface, reading the compact metadata instead of a dense mask (hsd_fast/attention.py).
PATHS = ["dense", pytest.param("fused", marks=pytest.mark.triton)]


@pytest.mark.parametrize("attention_path", PATHS)
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_a_tree_forward_gives_every_path_its_own_logits(arch: str, attention_path: str) -> None:
    model = tiny_model(arch, vocab_size=VOCAB, seed=3)
    tree = Tree.from_parents([-1, -1, 0, 0, 1, 2, 2])
    prompts = [[5, 17, 3, 40, 8, 11], [9, 9, 30, 2, 71, 64, 12, 7]]
    catch_up = [prompts[0][-1:], prompts[1][-2:]]  # row 0 cached all but 1 prompt token, row 1 all but 2
    lens = [len(p) for p in prompts]
    runner, tokens = _cached_prompts(model, prompts, [len(c) for c in catch_up], attention_path)
    with torch.no_grad():
        nodes = torch.randint(3, VOCAB, (2, tree.num_nodes), generator=torch.Generator().manual_seed(0))
        width = 2 + tree.num_nodes + 1  # one padding column for row 1, two for row 0
        logits = runner.forward(_tree_block(tree, catch_up, lens, nodes, width), tree.num_nodes + 1)

    for r, prompt in enumerate(prompts):
        torch.testing.assert_close(logits[r, 0], _plain_logits(model, prompt), atol=1e-4, rtol=1e-4)
        for j in range(tree.num_nodes):
            path = nodes[r, tree.path(j)].tolist()
            torch.testing.assert_close(
                logits[r, j + 1], _plain_logits(model, prompt + path), atol=1e-4, rtol=1e-4
            )

    # Accept the path 0 -> 3 in row 0 and 0 -> 2 -> 5 in row 1: move their K/V from the tree's slots
    # P + j to the path's slots P + depth (row 0's third entry is unused: scratch to scratch), then
    # feed one more token.
    accepted = [tree.path(3), tree.path(5)]
    scratch = runner.scratch
    sources = torch.tensor(
        [[lens[0] + j for j in accepted[0]] + [scratch], [lens[1] + j for j in accepted[1]]]
    )
    targets = torch.tensor([[lens[0], lens[0] + 1, scratch], [lens[1] + d for d in range(3)]])
    runner.cache.move(torch.arange(2), sources, targets)
    following = [44, 13]
    for r in range(2):
        at = lens[r] + len(accepted[r])
        tokens[r, lens[r] : at] = nodes[r, accepted[r]]
        tokens[r, at] = following[r]
    ends = torch.tensor([lens[r] + len(accepted[r]) + 1 for r in range(2)])
    with torch.no_grad():
        after = runner.forward(fed_block(tokens, ends - 1, ends, torch.ones(2, dtype=torch.bool), 1), 1)
    for r in range(2):
        sequence = prompts[r] + nodes[r, accepted[r]].tolist() + [following[r]]
        torch.testing.assert_close(after[r, 0], _plain_logits(model, sequence), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("attention_path", PATHS)
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_a_tree_fed_depth_by_depth_sees_its_cached_ancestors(arch: str, attention_path: str) -> None:
    model = tiny_model(arch, vocab_size=VOCAB, seed=4)
    tree = Tree.full([2, 2, 1])
    prompts = [[5, 17, 3, 40], [9, 30, 2, 71, 64, 12]]
    lens = [len(p) for p in prompts]
    runner, _ = _cached_prompts(model, prompts, [0, 0], attention_path)
    nodes = torch.randint(3, VOCAB, (2, tree.num_nodes), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        for d in range(tree.depth):
            span = tree.depth_slice(d)
            logits = runner.forward(_depth_block(tree, d, lens, nodes), span.stop - span.start)
            for r, prompt in enumerate(prompts):
                for j in range(span.start, span.stop):
                    path = nodes[r, tree.path(j)].tolist()
                    expected = _plain_logits(model, prompt + path)
                    torch.testing.assert_close(logits[r, j - span.start], expected, atol=1e-4, rtol=1e-4)


def test_overlapping_moves_read_before_they_write() -> None:
    model = tiny_model("llama", vocab_size=VOCAB, layers=1)
    runner = HFRunner(model, VOCAB)
    runner.prepare(1, 16)
    keys = runner.cache.keys[0]
    keys.copy_(torch.arange(keys.numel(), dtype=keys.dtype).reshape(keys.shape))
    before = keys.clone()
    # slot 3 -> 2 and 2 -> 1: a move that writes 2 after reading it must read the old value
    runner.cache.move(torch.tensor([0]), torch.tensor([[3, 2]]), torch.tensor([[2, 1]]))
    assert torch.equal(keys[0, :, 2], before[0, :, 3]) and torch.equal(keys[0, :, 1], before[0, :, 2])
