"""HF's repetition penalty, served exactly at every level (docs/design.md, "Sampling transforms").

The reference is HF's own unassisted ``generate``: greedy output token for token with one draft, two
drafts, a lookup level and a token tree, in a left-padded batch (HF 5.24 ignores the pads; a
processor without ``prompt_ignore_length`` counts them), and from a target whose
``generation_config`` carries the penalty; sampled output against the exact distribution with the
penalty, enumerated, for a chain, a token tree and a lookup level, with planted bugs (the verifier's
history without the block's drafts, a tree node's without its ancestors) that the same tests catch;
compiled steps equal to the eager ones.
"""

from __future__ import annotations

import copy

import pytest
import torch
from enumerated import processed_distribution
from hf_models import peaked_family
from planted_bugs import penalty_history_without_the_blocks_drafts, penalty_history_without_tree_ancestors
from transformers.generation.logits_process import LogitsProcessorList, RepetitionPenaltyLogitsProcessor

import hsd_fast
from hsd_fast.processors import LogitsTransform, ProcessorInputs, generation_sampling
from hsd_fast.testing.exactness import pooled_chi_square

pytestmark = pytest.mark.hf

PENALTY = 1.3
NEW = 32


def _prompts(target, count: int = 3, length: int = 9) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(5)
    return [torch.randint(3, target.config.vocab_size, (1, length), generator=gen) for _ in range(count)]


def _hsd(target, ids, **kwargs):
    kwargs = {"do_sample": False, "max_new_tokens": NEW, "compile": False, **kwargs}
    return target.generate(ids, custom_generate=hsd_fast.generate, **kwargs)


# ----------------------------------------------------------------------------- greedy
LEVELS = {
    "one draft": lambda d: {"drafts": d[1:], "T": [3]},
    "two drafts": lambda d: {"drafts": d, "T": [2, 2]},
    "lookup": lambda d: {"drafts": ["lookup", d[1]], "T": [3, 2]},
    "lookup alone": lambda d: {"drafts": ["lookup"], "T": [4]},
    "tree": lambda d: {"drafts": d, "T": [3, 2], "tree": hsd_fast.Tree.spine(3, 2)},
}


@pytest.mark.parametrize("levels", sorted(LEVELS))
def test_greedy_equals_hf(target, drafts, levels) -> None:
    """Token for token HF's greedy output with the penalty, which differs from the output without."""
    changed = 0
    runs = []
    for ids in _prompts(target):
        expected = target.generate(ids, do_sample=False, max_new_tokens=NEW, repetition_penalty=PENALTY)
        changed += expected.tolist() != target.generate(ids, do_sample=False, max_new_tokens=NEW).tolist()
        out = _hsd(target, ids, repetition_penalty=PENALTY, output_hsd_stats=True, **LEVELS[levels](drafts))
        assert out.sequences.tolist() == expected.tolist()
        runs.append(out.hsd_stats)
    assert changed, "the penalty changes nothing: the test cannot tell it is applied"
    stats = sum(runs[1:], runs[0])
    assert stats.corrections[1] > 0 and stats.bonus[1] > 0, stats.summary()  # level 1 accepts and rejects


def test_greedy_left_padded_batch_equals_hf(target, drafts) -> None:
    """Rows of different lengths, left padded, with different stop points (an EOS mid-way)."""
    ids = torch.tensor([[0, 0, 0, 5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16, 17, 18, 19]])
    mask = (torch.arange(9)[None] >= torch.tensor([[3], [0]])).long()
    kwargs = {"attention_mask": mask, "do_sample": False, "max_new_tokens": NEW}
    free = target.generate(ids, repetition_penalty=PENALTY, eos_token_id=None, **kwargs)
    eos = int(free[1, 9 + 12])  # row 1 stops at its 13th token, row 0 maybe elsewhere
    expected = target.generate(ids, repetition_penalty=PENALTY, eos_token_id=eos, **kwargs)
    assert expected.tolist() != target.generate(ids, eos_token_id=eos, **kwargs).tolist()
    for levels in ("two drafts", "lookup", "tree"):
        out = _hsd(
            target, ids, repetition_penalty=PENALTY, eos_token_id=eos, **kwargs, **LEVELS[levels](drafts)
        )
        assert out.tolist() == expected.tolist(), levels


def test_a_processor_that_counts_the_pads(target, drafts) -> None:
    """A processor built without ``prompt_ignore_length`` counts the pad ids of a left-padded row (HF's
    config-built one does up to transformers 5.23; 5.24 sets it to each row's padding, so none
    counts): a row's output then depends on its batch's padding (docs/design.md, "Sampling
    transforms"), in HF's unassisted generate and in hsd_fast alike."""
    prompt = [5, 6, 7, 8, 9, 10]
    mask = (torch.arange(9)[None] >= torch.tensor([[3], [0]])).long()
    kwargs = {"attention_mask": mask, "do_sample": False, "max_new_tokens": 12, "pad_token_id": 0}
    counts_pads = LogitsProcessorList([RepetitionPenaltyLogitsProcessor(PENALTY)])
    plain = target.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=12)[0, 6:].tolist()
    neutral = min(set(range(3, 96)) - set(plain) - set(prompt))  # a pad the row never emits

    def padded(pad: int) -> torch.Tensor:
        return torch.tensor([[pad, pad, pad, *prompt], [11, 12, 13, 14, 15, 16, 17, 18, 19]])

    for pad in plain:  # pad with a token the row emits: counting it then changes the output
        counting = target.generate(padded(pad), logits_processor=counts_pads, **kwargs)
        if (
            counting[0, 9:].tolist()
            != target.generate(padded(neutral), logits_processor=counts_pads, **kwargs)[0, 9:].tolist()
        ):
            break
    else:
        pytest.fail("the pads' penalty changes nothing: the test cannot tell they are counted")
    counted = _hsd(target, padded(pad), logits_processor=counts_pads, drafts=drafts, T=[2, 2], **kwargs)
    assert counted.tolist() == counting.tolist()
    hf = target.generate(padded(pad), repetition_penalty=PENALTY, **kwargs)  # as this transformers does
    assert _hsd(
        target, padded(pad), repetition_penalty=PENALTY, drafts=drafts, T=[2, 2], **kwargs
    ).tolist() == (hf.tolist())


def test_a_checkpoint_whose_generation_config_carries_the_penalty(target, drafts) -> None:
    """Served with no argument at the call (Qwen2.5-Instruct ships repetition_penalty=1.05)."""
    model = copy.deepcopy(target)
    model.generation_config.repetition_penalty = PENALTY
    for ids in _prompts(target, 2):
        expected = model.generate(ids, do_sample=False, max_new_tokens=NEW)
        assert (
            expected.tolist()
            == target.generate(ids, do_sample=False, max_new_tokens=NEW, repetition_penalty=PENALTY).tolist()
        )
        out = model.generate(
            ids, custom_generate=hsd_fast.generate, drafts=drafts, T=[2, 2], do_sample=False,
            max_new_tokens=NEW, compile=False,
        )  # fmt: skip
        assert out.tolist() == expected.tolist()


def test_a_direct_call_takes_generation_options_as_keywords(target, drafts) -> None:
    """``hsd_fast.generate(model, ids, repetition_penalty=..., max_new_tokens=...)`` decodes as
    ``model.generate`` with those keywords: they go into the config, as HF moves them."""
    for ids in _prompts(target, 2):
        expected = target.generate(ids, do_sample=False, max_new_tokens=NEW, repetition_penalty=PENALTY)
        out = hsd_fast.generate(
            target, ids, drafts=drafts, T=[2, 2], do_sample=False, max_new_tokens=NEW,
            repetition_penalty=PENALTY, compile=False,
        )  # fmt: skip
        assert out.tolist() == expected.tolist()


# ----------------------------------------------------------------------------- the transform
def test_the_transform_is_hfs_processor() -> None:
    """``prompt_history`` plus the row's unpadded tokens give HF's processor's scores, bit for bit,
    with the pads counted or dropped (``prompt_ignore_length``: none, an int, HF's per-row tensor)."""
    gen = torch.Generator().manual_seed(0)
    vocab = 11
    ids = torch.randint(0, vocab, (3, 7), generator=gen)
    mask = (torch.arange(7)[None] >= torch.tensor([[2], [0], [4]])).long()
    scores = torch.randn(3, vocab, generator=gen) * 3
    for ignore in (None, 3, (mask == 0).int().argmax(1), torch.tensor([0, 1, 5])):
        try:
            processor = RepetitionPenaltyLogitsProcessor(1.7, prompt_ignore_length=ignore)
        except ValueError:  # transformers before 5.24 take an int only
            assert isinstance(ignore, torch.Tensor)
            continue
        expected = copy.deepcopy(processor)(ids, scores.clone())
        transform = LogitsTransform([processor], input_ids=ids, attention_mask=mask)
        ((padding, first),) = transform.prompt_history(3, vocab, torch.device("cpu"))
        history = torch.full((3, 7), vocab)
        for r in range(3):
            real = ids[r][mask[r].bool()][first[r] :]
            history[r, : len(real)] = real
        history = torch.cat([padding, history], 1)
        inputs = ProcessorInputs([history], None, None, [None])
        assert torch.equal(transform(scores, inputs), expected), ignore


def test_the_penalty_is_in_the_transform_key() -> None:
    """Profiles and compiled steps are keyed by it: a penalty run shares neither with a plain one."""
    plain = LogitsTransform([])
    penalized = LogitsTransform([RepetitionPenaltyLogitsProcessor(1.3)])
    other = LogitsTransform([RepetitionPenaltyLogitsProcessor(1.05)])
    assert len({plain.key, penalized.key, other.key}) == 3
    assert penalized.needs_history and not plain.needs_history


def test_the_transform_hf_prepares_for_profiling_serves_any_batch(target) -> None:
    """``generation_sampling`` captures HF's processor with the per-row padding of a one-row dummy
    prompt; runs on unpadded prompts of any batch (profiling) count every prompt token."""
    transform, greedy = generation_sampling(target, repetition_penalty=PENALTY, do_sample=True)
    assert transform.needs_history and not greedy
    ((padding, first),) = transform.prompt_history(3, 96, torch.device("cpu"))
    assert padding.shape == (3, 0) and first.tolist() == [0, 0, 0]


# ----------------------------------------------------------------------------- sampled
V, STEPS, SAMPLES, SAMPLED_PENALTY = 6, 3, 5000, 2.0
PROMPT = torch.tensor([3, 4, 5, 1])


@pytest.fixture(scope="module")
def small() -> list[torch.nn.Module]:
    """Two drafts and a peaked target over a vocabulary of 6 (tests/test_hf_sampling.py's)."""
    return peaked_family(V)


def exact_with_penalty(target, prompt: torch.Tensor, penalty: float) -> dict[tuple[int, ...], float]:
    """P(continuation) of every continuation of STEPS tokens with the repetition penalty (computed
    here, not by HF's processor) applied at each position over the prompt and the continuation before
    it."""

    def penalize(ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        seen = torch.zeros_like(scores, dtype=torch.bool).scatter_(1, ids, True)
        return torch.where(seen, torch.where(scores < 0, scores * penalty, scores / penalty), scores)

    return processed_distribution(target, prompt, penalize, V, STEPS)


@pytest.fixture(scope="module")
def exact(small) -> dict[tuple[int, ...], float]:
    return exact_with_penalty(small[-1], PROMPT, SAMPLED_PENALTY)


def _samples(target, **levels) -> list[tuple[int, ...]]:
    out = target.generate(
        PROMPT.expand(SAMPLES, -1), custom_generate=hsd_fast.generate, do_sample=True, top_k=None,
        max_new_tokens=STEPS, eos_token_id=None, seed=0, compile=False,
        repetition_penalty=SAMPLED_PENALTY, **levels,
    )  # fmt: skip
    return [tuple(row) for row in out[:, len(PROMPT) :].tolist()]


def test_the_penalty_bites_in_the_sampled_test(small) -> None:
    without = exact_with_penalty(small[-1], PROMPT, 1.0)
    with_ = exact_with_penalty(small[-1], PROMPT, SAMPLED_PENALTY)
    assert sum(abs(without[k] - with_[k]) for k in with_) > 0.3  # total variation * 2


@pytest.mark.slow
def test_sampled_chain_is_exact_and_the_planted_bug_is_caught(small, exact) -> None:
    *drafts, target = small
    result = pooled_chi_square(_samples(target, drafts=drafts, T=[2, 2]), exact)
    assert result.p_value > 1e-3, result
    with penalty_history_without_the_blocks_drafts():
        buggy = _samples(target, drafts=drafts, T=[2, 2])
    assert pooled_chi_square(buggy, exact).p_value < 1e-6


@pytest.mark.slow
def test_sampled_tree_is_exact_and_the_planted_bug_is_caught(small, exact) -> None:
    *drafts, target = small
    levels = {"drafts": drafts[1:], "T": [3], "tree": hsd_fast.Tree.spine(3, 2)}
    result = pooled_chi_square(_samples(target, **levels), exact)
    assert result.p_value > 1e-3, result
    with penalty_history_without_tree_ancestors():
        buggy = _samples(target, **levels)
    assert pooled_chi_square(buggy, exact).p_value < 1e-6


LOOKUP_PROMPT = torch.tensor([3, 4, 5, 3, 4])  # the lookup level proposes 5, 3, 4 after it


def test_sampled_lookup_is_exact_and_the_planted_bug_is_caught(small) -> None:
    """A lookup level's proposals are point masses: the target verifies each with the penalty over
    the history that holds the proposals before it."""
    target = small[-1]
    exact = exact_with_penalty(target, LOOKUP_PROMPT, SAMPLED_PENALTY)

    def samples():
        out = target.generate(
            LOOKUP_PROMPT.expand(SAMPLES, -1), custom_generate=hsd_fast.generate, drafts=["lookup"], T=[3],
            do_sample=True, top_k=None, max_new_tokens=STEPS, eos_token_id=None, seed=0, compile=False,
            repetition_penalty=SAMPLED_PENALTY, output_hsd_stats=True,
        )  # fmt: skip
        return [tuple(row) for row in out.sequences[:, len(LOOKUP_PROMPT) :].tolist()], out.hsd_stats

    drawn, stats = samples()
    assert pooled_chi_square(drawn, exact).p_value > 1e-3
    assert 0 < stats.acceptance_rate(1) < 1, stats.summary()
    with penalty_history_without_the_blocks_drafts():
        buggy, _ = samples()
    assert pooled_chi_square(buggy, exact).p_value < 1e-6


# ----------------------------------------------------------------------------- compiled
@pytest.mark.slow
def test_compiled_equals_eager(target, drafts) -> None:
    torch._dynamo.reset()
    ids = torch.tensor([[0, 0, 5, 6, 7, 8, 9], [11, 12, 13, 14, 15, 16, 17]])
    mask = (torch.arange(7)[None] >= torch.tensor([[2], [0]])).long()
    for do_sample in (False, True):
        kwargs = {
            "attention_mask": mask, "do_sample": do_sample, "max_new_tokens": 16, "seed": 3,
            "repetition_penalty": PENALTY, "drafts": drafts, "T": [2, 2],
        }  # fmt: skip
        eager = _hsd(target, ids, **kwargs)
        compiled = _hsd(target, ids, **{**kwargs, "compile": True})
        assert compiled.tolist() == eager.tolist(), do_sample
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > 0, "nothing was compiled"
