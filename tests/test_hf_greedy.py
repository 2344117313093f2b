"""Greedy HSD through `model.generate(custom_generate=hsd_fast.generate)` equals the target's own
greedy output token for token (fp32), for K = 0..3 drafts, and exercises every path of the loop."""

import pytest
import torch
from hf_models import derived_drafts, tiny_model

import hsd_fast

pytestmark = pytest.mark.hf

CASES = [[], [1], [3], [2, 2], [1, 3], [3, 2, 2]]  # T per draft level; K = len(T)


@pytest.fixture(scope="module", params=[(a, m) for a in ("llama", "qwen2") for m in ("sdpa", "eager")])
def target(request) -> torch.nn.Module:
    arch, attn = request.param
    return tiny_model(arch, attn=attn)


@pytest.mark.parametrize("T", CASES, ids=lambda t: f"T={t}")
def test_greedy_equals_hf(target: torch.nn.Module, T: list[int]) -> None:
    drafts = derived_drafts(target, len(T))
    gen = torch.Generator().manual_seed(5)
    runs = []
    for _ in range(4):  # several prompts: greedy tiny models fall into loops that repeat one pattern
        ids = torch.randint(3, target.config.vocab_size, (1, 9), generator=gen)
        expected = target.generate(ids, do_sample=False, max_new_tokens=40)
        out = target.generate(
            ids,
            custom_generate=hsd_fast.generate,
            drafts=drafts,
            T=T,
            do_sample=False,
            max_new_tokens=40,
            output_hsd_stats=True,
        )
        assert out.sequences.tolist() == expected.tolist()
        runs.append(out.hsd_stats)
    stats = sum(runs[1:], runs[0])
    for level in range(1, len(T) + 1):  # full accepts with bonus and rejections at every level
        assert stats.bonus[level] > 0, stats.summary()
        assert stats.corrections[level] > 0, stats.summary()
        if level >= 2 or T[0] > 1:
            assert sum(stats.rejected_at[level][1:]) > 0, "no rejection inside a block"
    if T and T != [1]:
        assert sum(stats.cascade_depth[1:]) > 0, "no rollback cascaded into a lower cache"


def test_eos_stops_like_hf() -> None:
    """With an EOS the target emits mid-way, HSD stops where HF stops."""
    target = tiny_model("llama")
    drafts = derived_drafts(target, 2)
    torch.manual_seed(5)
    ids = torch.randint(3, target.config.vocab_size, (1, 9))
    free = target.generate(ids, do_sample=False, max_new_tokens=40, eos_token_id=None)
    eos = int(free[0, 9 + 17])  # the 18th generated token becomes the EOS
    expected = target.generate(ids, do_sample=False, max_new_tokens=40, eos_token_id=eos)
    out = target.generate(
        ids,
        custom_generate=hsd_fast.generate,
        drafts=drafts,
        T=[2, 2],
        do_sample=False,
        max_new_tokens=40,
        eos_token_id=eos,
    )
    assert out.tolist() == expected.tolist()
    assert out.shape[1] <= 9 + 18
