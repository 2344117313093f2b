"""Batched HSD through HF's `generate`: left padding, rows finishing at different times, all four
architectures, batch invariance and the sampled distribution in batch. (Streaming via `wrap`:
tests/test_wrapper.py.)"""

import pytest
import torch
from enumerated import exact_distribution
from hf_models import ARCHS, derived_drafts, left_padded, noisy_copy, tiny_model

import hsd_fast
from hsd_fast.testing.exactness import pooled_chi_square

pytestmark = pytest.mark.hf

# Lengths 9, 4, 6, 7, 5: left padding differs per row.
PROMPTS = [
    [5, 9, 11, 40, 3, 7, 12, 60, 33],
    [8, 9, 10, 11],
    [70, 71, 3, 4, 5, 6],
    [20, 19, 18, 50, 51, 52, 53],
]
PROMPTS += [[90, 4, 33, 21, 8]]


@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("T", [[], [2], [3, 2], [2, 2, 2]], ids=lambda t: f"T={t}")
def test_batched_greedy_equals_hf(arch: str, T: list[int]) -> None:
    target = tiny_model(arch)
    drafts = derived_drafts(target, len(T))
    ids, mask = left_padded(PROMPTS)
    free = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=30, eos_token_id=None)
    eos = int(free[1, ids.shape[1] + 11])  # row 1 meets this EOS after 12 tokens: rows end apart
    kwargs = {"attention_mask": mask, "do_sample": False, "max_new_tokens": 30, "eos_token_id": eos}
    expected = target.generate(ids, **kwargs)
    out = target.generate(
        ids, custom_generate=hsd_fast.generate, drafts=drafts, T=T, output_hsd_stats=True, **kwargs
    )
    assert out.sequences.tolist() == expected.tolist()
    assert (expected == 0).any(), "no row finished early and was padded"
    stats = out.hsd_stats
    for level in range(1, len(T) + 1):
        assert stats.bonus[level] > 0 and stats.corrections[level] > 0, stats.summary()
    if len(T) > 1:
        assert sum(stats.cascade_depth[1:]) > 0, stats.summary()


def test_a_row_alone_equals_the_row_in_a_batch() -> None:
    target = tiny_model("llama", lm_head_scale=2.0)
    drafts = derived_drafts(target, 2)
    ids, mask = left_padded(PROMPTS)
    seeds = [11, 22, 33, 44, 55]
    common = {"custom_generate": hsd_fast.generate, "drafts": drafts, "T": [2, 3], "do_sample": True}
    common |= {"max_new_tokens": 24, "eos_token_id": None}
    batch = target.generate(ids, attention_mask=mask, seed=seeds, **common)
    for r, prompt in enumerate(PROMPTS):
        alone = target.generate(torch.tensor([prompt]), seed=[seeds[r]], **common)
        assert alone[0].tolist() == batch[r, ids.shape[1] - len(prompt) :].tolist()


@pytest.mark.slow
def test_sampling_in_batch_matches_the_target_distribution() -> None:
    """40k rows sampled in batches of 10k, through `generate`, against the enumerated distribution
    (one batch of 40k peaked above 20 GB on transformers 5.24). Two layers and a key-value head per
    query head: at 10k rows, repeating grouped heads over the cache's 128 slots took half the time."""
    vocab, steps, samples, batch = 6, 3, 40_000, 10_000
    target = tiny_model("qwen2", vocab_size=vocab, lm_head_scale=4.0, layers=2, num_key_value_heads=4)
    drafts = [noisy_copy(target, 0.4, seed=1), noisy_copy(target, 0.2, seed=2)]
    prompt = torch.tensor([3, 4, 5, 1])
    torch.manual_seed(1)  # each call draws its seed from it: independent batches
    out = torch.cat([
        target.generate(
            prompt.expand(batch, -1), custom_generate=hsd_fast.generate, drafts=drafts, T=[2, 2],
            do_sample=True, temperature=0.8, top_k=5, max_new_tokens=steps, eos_token_id=None,
        )
        for _ in range(samples // batch)
    ])  # fmt: skip
    exact = exact_distribution(target, prompt, vocab, steps, temperature=0.8, top_k=5)
    assert sum(exact.values()) == pytest.approx(1.0)
    assert sum(p == 0 for p in exact.values()) == vocab**steps - 5**steps  # top-5 of 6: one cut per step
    result = pooled_chi_square([tuple(r) for r in out[:, len(prompt) :].tolist()], exact)
    assert result.p_value > 1e-3, result


def test_num_return_sequences_draws_distinct_rows() -> None:
    target = tiny_model("llama", lm_head_scale=1.0)
    out = target.generate(
        torch.tensor([PROMPTS[0]]), custom_generate=hsd_fast.generate, drafts=derived_drafts(target, 1),
        T=[2], do_sample=True, num_return_sequences=4, max_new_tokens=12, eos_token_id=None,
    )  # fmt: skip
    assert out.shape == (4, 9 + 12)
    assert len({tuple(r) for r in out.tolist()}) == 4
