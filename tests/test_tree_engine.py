"""Token trees in the engine (hsd_fast/tree_steps.py): level 0 drafts a tree, level 1 verifies it in
one forward and hands a chain to the levels above.

- Greedy: tree HSD equals the target's own greedy output, token for token: table models and tiny HF
  models of two architectures (RoPE and a learned position table), chain, full, spine and uneven
  trees, one and two drafts above the tree, ragged padded batches with an EOS, length budgets
  shorter than the tree.
- Sampling is exact: chi-square against the target's exact distribution (table models, 20k rows;
  a tiny HF model), several trees and temperatures, top-k 2 with three children, an EOS. Each
  planted bug fails the same test: (a) q not updated after a rejected sibling, (b) siblings sharing
  one accept uniform, (c) the residual stored as the emitted token's q (three levels).
- ``Tree.chain(n)`` samples exactly the tokens of ``T[0] = n``, same seed.
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from enumerated import exact_distribution
from hf_models import derived_drafts, noisy_copy, tiny_model
from planted_bugs import (
    q_not_updated_after_a_rejected_sibling,
    siblings_share_one_accept_uniform,
    tree_residual_stored_as_q,
)
from transformers import TopKLogitsWarper

import hsd_fast
from hsd_fast import LookupDraft, Tree, run_hsd
from hsd_fast.hf_runner import HFRunner
from hsd_fast.layout import FedBlock
from hsd_fast.processors import LogitsTransform
from hsd_fast.testing.exactness import pooled_chi_square
from hsd_fast.testing.tables import TableModel, TableRunner, table_family

VOCAB, ORDER, STEPS = 4, 2, 4
PROMPT = torch.tensor([0, 1])
TREES = {
    "chain 3": Tree.chain(3),
    "full 2x2": Tree.full([2, 2]),
    "spine 3x3": Tree.spine(3, 3),
    "uneven": Tree.from_parents([-1, -1, -1, 0, 0, 2, 3]),
    "wide 3": Tree.full([3]),
}


def _table_levels(num_models: int, seed: int = 5) -> list[TableRunner]:
    return [TableRunner(m) for m in table_family(VOCAB, ORDER, num_models, spread=2.0, seed=seed)]


# ------------------------------------------------------------------------------------- greedy
@pytest.mark.parametrize("num_models", [2, 3])
@pytest.mark.parametrize("name", ["chain 3", "full 2x2", "spine 3x3", "uneven"])
def test_greedy_tree_hsd_is_the_targets_greedy_output(name: str, num_models: int) -> None:
    """Ragged rows, an EOS, and budgets shorter than the tree (2 < depth 3) and longer."""
    prompts = [torch.tensor(p) for p in ([0, 1], [3, 2, 1, 0, 2], [1, 1, 3], [2, 0])]
    budgets = [12, 2, 9, 1]
    kwargs = {"max_new_tokens": budgets, "eos_token_id": 3, "greedy": True}
    levels = _table_levels(num_models)
    expected = run_hsd(levels[-1:], prompts, block_sizes=[], **kwargs)
    out = run_hsd(levels, prompts, block_sizes=[1] * (num_models - 1), tree=TREES[name], **kwargs)
    assert [s.tolist() for s in out.sequences] == [s.tolist() for s in expected.sequences]
    stats = out.stats
    assert stats.drafted[0] > 0 and stats.accepted[1] > 0 and stats.corrections[1] > 0, stats.summary()
    # an accepted EOS node ends its row: counted by rank, but given to the ledger as the extra token
    assert stats.accepted[1] <= sum(stats.accepted_by_rank) <= stats.accepted[1] + len(prompts)


# ------------------------------------------------------------------------------------ sampling
def _top_k(model: TableModel, k: int) -> TableModel:
    kth = model.logits.topk(k, dim=-1).values[..., -1:]
    return TableModel(model.logits.masked_fill(model.logits < kth, -float("inf")), model.order)


def _sampled(
    tree: Tree, num_models: int, rows: int = 20_000, temperature: float = 1.0, top_k: int | None = None,
    eos: int | None = None,
) -> tuple[list[tuple[int, ...]], dict, hsd_fast.HSDStats]:  # fmt: skip
    """``rows`` sampled continuations by tree HSD over table models, and the exact distribution."""
    levels = _table_levels(num_models)
    transform = LogitsTransform([TopKLogitsWarper(top_k)] if top_k else [])
    out = run_hsd(
        levels, [PROMPT] * rows, block_sizes=[1] + [2] * (num_models - 2), max_new_tokens=STEPS, seeds=3,
        temperature=temperature, transform=transform, eos_token_id=eos, tree=tree,
    )  # fmt: skip
    target = levels[-1].model if top_k is None else _top_k(levels[-1].model, top_k)
    exact = target.continuation_probs(PROMPT.tolist(), STEPS, temperature, eos)
    samples = [tuple(s[len(PROMPT) :].tolist()) for s in out.sequences]
    return samples, exact, out.stats


@pytest.mark.parametrize(
    ("name", "num_models", "temperature", "top_k", "eos"),
    [
        ("spine 3x3", 2, 1.0, None, None),
        ("full 2x2", 3, 0.7, None, None),
        ("uneven", 2, 1.3, None, 3),
        ("wide 3", 2, 1.0, 2, None),  # three children, two tokens in q's support
    ],
)
def test_sampled_tree_hsd_is_exact(name, num_models, temperature, top_k, eos) -> None:
    samples, exact, stats = _sampled(TREES[name], num_models, temperature=temperature, top_k=top_k, eos=eos)
    assert pooled_chi_square(samples, exact).p_value > 1e-3
    assert stats.accepted[1] > 0 and stats.corrections[1] > 0, stats.summary()
    assert len(stats.accepted_by_rank) > 1, "no sibling was ever accepted: the test would miss (a), (b)"


@pytest.mark.parametrize(
    ("planted", "num_models"),
    [
        (q_not_updated_after_a_rejected_sibling, 2),
        (siblings_share_one_accept_uniform, 2),
        (tree_residual_stored_as_q, 3),
    ],
)
def test_each_planted_bug_fails_the_same_test(planted, num_models: int) -> None:
    with planted():
        samples, exact, _ = _sampled(TREES["spine 3x3"], num_models)
    assert pooled_chi_square(samples, exact).p_value < 1e-6


def test_a_chain_tree_samples_the_tokens_of_a_block() -> None:
    """``Tree.chain(3)`` and ``T[0] = 3``: the same keys, hence the same tokens, under three levels."""
    kwargs = {"max_new_tokens": 10, "seeds": 11, "eos_token_id": 3}
    prompts = [PROMPT, torch.tensor([3, 1, 2])] * 500
    chain = run_hsd(_table_levels(3), prompts, block_sizes=[3, 2], **kwargs)
    tree = run_hsd(_table_levels(3), prompts, block_sizes=[1, 2], tree=Tree.chain(3), **kwargs)
    assert [s.tolist() for s in tree.sequences] == [s.tolist() for s in chain.sequences]
    assert tree.stats.accepted[1] > 0 and tree.stats.corrections[2] > 0, tree.stats.summary()


def test_tree_arguments_are_checked() -> None:
    levels = _table_levels(2)
    with pytest.raises(TypeError, match=r"hsd_fast\.Tree"):
        run_hsd(levels, [PROMPT], block_sizes=[1], max_new_tokens=2, tree=[-1, 0])
    with pytest.raises(ValueError, match="drafted by a model"):
        run_hsd([LookupDraft(), *levels], [PROMPT], block_sizes=[1, 1], max_new_tokens=2, tree=Tree.chain(2))
    with pytest.raises(ValueError, match="drafted by a model"):
        run_hsd(levels[1:], [PROMPT], block_sizes=[], max_new_tokens=2, tree=Tree.chain(2))
    with pytest.raises(ValueError, match="at most 64 deep"):
        run_hsd(levels, [PROMPT], block_sizes=[1], max_new_tokens=2, tree=Tree.chain(65))


# ------------------------------------------------------------------------------- tiny HF models
def _greedy(model, ids, **kwargs):
    return model.generate(ids, do_sample=False, max_new_tokens=16, **kwargs)


@pytest.mark.hf
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_greedy_tree_hsd_on_hf_models(arch: str) -> None:
    """Batch 1, then a left-padded batch where one row stops at an EOS; trees of every constructor
    under one and two drafts (the tree drafted by the smallest)."""
    target = tiny_model(arch, lm_head_scale=2.0)
    prompts = [[5, 9, 11, 40, 3, 7, 12, 60], [70, 71, 3], [8, 8, 9, 30, 31, 32, 1, 4, 6, 7, 2]]
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    free = _greedy(target, ids, attention_mask=mask, eos_token_id=None)
    eos = int(free[1, width + 5])  # row 1 stops there (or earlier)
    padded = {"attention_mask": mask, "eos_token_id": eos, "pad_token_id": 0}
    expected = _greedy(target, ids, **padded)
    assert (expected[:, width:] == 0).any(), "no row stopped early"
    single = _greedy(target, ids[:1], eos_token_id=None)
    for num_drafts, tree in [
        (1, Tree.full([2, 2])),
        (1, Tree.spine(3, 2)),
        (2, Tree.chain(3)),
        (2, Tree.spine(2, 3)),
    ]:
        hsd = {"custom_generate": hsd_fast.generate, "drafts": derived_drafts(target, num_drafts)}
        hsd |= {"T": [1] + [2] * (num_drafts - 1), "tree": tree, "compile": False}
        assert _greedy(target, ids[:1], eos_token_id=None, **hsd).tolist() == single.tolist(), tree
        out = _greedy(target, ids, **padded, **hsd, output_hsd_stats=True)
        assert out.sequences.tolist() == expected.tolist(), tree
        assert out.hsd_stats.accepted[1] > 0, out.hsd_stats.summary()


@pytest.mark.slow
@pytest.mark.hf
def test_sampled_tree_hsd_on_a_tiny_hf_model_is_exact() -> None:
    vocab, steps = 6, 3
    target = tiny_model("llama", vocab_size=vocab, lm_head_scale=4.0)
    prompt = torch.tensor([3, 4, 5, 1])
    exact = exact_distribution(target, prompt, vocab, steps)
    out = target.generate(
        prompt.expand(5000, -1), custom_generate=hsd_fast.generate, drafts=[noisy_copy(target, 0.3, seed=1)],
        T=[1], tree=Tree.spine(2, 2), do_sample=True, top_k=None, max_new_tokens=steps, eos_token_id=None,
        seed=0, compile=False, output_hsd_stats=True,
    )  # fmt: skip
    samples = [tuple(row) for row in out.sequences[:, len(prompt) :].tolist()]
    assert pooled_chi_square(samples, exact).p_value > 1e-3
    assert out.hsd_stats.accepted[1] > 0 and out.hsd_stats.corrections[1] > 0, out.hsd_stats.summary()


@pytest.mark.hf
def test_wrap_takes_a_tree() -> None:
    target = tiny_model("qwen2", lm_head_scale=2.0)
    ids = torch.tensor([[5, 9, 11, 40, 3, 7]])
    model = hsd_fast.wrap(target, derived_drafts(target, 1), T=[1], tree=Tree.spine(2, 2), compile=False)
    assert _greedy(model, ids, eos_token_id=None).tolist() == _greedy(target, ids, eos_token_id=None).tolist()
    with pytest.raises(ValueError, match="tree= is set by the wrapper"):
        model.generate(ids, tree=Tree.chain(2))


@pytest.mark.hf
@pytest.mark.slow
def test_compiled_tree_steps_sample_what_the_eager_ones_do() -> None:
    """The tree steps compiled (fullgraph, static shapes): the same tokens as eagerly, greedy and
    sampled, with no graph break."""
    target = tiny_model("llama", layers=2, lm_head_scale=2.0)
    ids = torch.tensor([[5, 9, 11, 40, 3, 7, 12, 60], [0, 0, 0, 70, 71, 3, 4, 5]])
    kwargs = {"custom_generate": hsd_fast.generate, "drafts": derived_drafts(target, 1), "T": [1]}
    kwargs |= {"tree": Tree.spine(3, 2), "max_new_tokens": 20, "eos_token_id": None, "seed": 1}
    kwargs |= {"attention_mask": (ids > 0).long(), "pad_token_id": 0}
    torch._dynamo.utils.counters.clear()
    for do_sample in (False, True):
        eager = target.generate(ids, do_sample=do_sample, compile=False, **kwargs)
        compiled = target.generate(ids, do_sample=do_sample, compile=True, **kwargs)
        assert compiled.tolist() == eager.tolist()
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > 0, "nothing was compiled"
    assert not torch._dynamo.utils.counters["graph_break"]


@pytest.mark.hf
@pytest.mark.parametrize("tree", [Tree.full([2, 2]), Tree.spine(3, 3)], ids=["full", "spine"])
def test_caches_after_tree_runs_equal_a_chain_fed_cache(tree: Tree) -> None:
    """After a run of tree verifications and moves, both levels' caches hold what feeding the
    committed sequence as a chain gives (up to the positions they hold validly at the end)."""
    target = tiny_model("llama", lm_head_scale=2.0)
    draft = derived_drafts(target, 1)[0]
    prompt = torch.tensor([5, 9, 11, 40, 3, 7, 12, 60])
    runners = [HFRunner(draft, 96), HFRunner(target, 96)]
    out = run_hsd(
        runners, [prompt], block_sizes=[1], max_new_tokens=24, greedy=True, tree=tree, compile=False
    )
    sequence = out.sequences[0]
    assert out.stats.accepted[1] > 0 and len(out.stats.accepted_by_rank) > 1, out.stats.summary()
    for runner, held in zip(runners, [len(sequence) - 2, len(sequence) - 1], strict=True):
        chain = HFRunner(runner.model, 96)
        chain.prepare(1, len(sequence))
        positions = torch.arange(held)[None]
        chain.forward(
            FedBlock(sequence[None, :held], positions, torch.ones_like(positions, dtype=torch.bool)), 1
        )
        for ours, theirs in zip(
            runner.cache.keys + runner.cache.values, chain.cache.keys + chain.cache.values, strict=True
        ):
            torch.testing.assert_close(ours[:, :, :held], theirs[:, :, :held], atol=1e-5, rtol=1e-5)
