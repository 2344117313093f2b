"""The lookup level (hsd_fast/lookup.py): proposals from a row's own context, verified by the models
above. Sampled runs on table models match the target's exact distribution, and drawing a rejection's
correction from p (without removing the proposed token) fails the same test; greedy runs on tiny HF
models equal the target's own greedy output, alone, under one and two drafts, in a padded batch with
an EOS, with and without matches."""

from __future__ import annotations

import pytest
import torch
from enumerated import exact_distribution, hsd_samples
from hf_models import derived_drafts, noisy_copy, tiny_model
from planted_bugs import correction_drawn_from_p

import hsd_fast
from hsd_fast import LookupDraft, engine, run_hsd
from hsd_fast.testing.exactness import pooled_chi_square
from hsd_fast.testing.tables import TableRunner, table_family

VOCAB, ORDER, STEPS = 3, 2, 4
# Repeats: every suffix of it occurred before, so the lookup proposes at almost every call, and the
# target's own next token is often not what followed last time (proposals are right and wrong).
TABLE_PROMPT = [0, 1, 2, 0, 1, 2, 1, 0, 1]


def _table_run(num_models: int, samples: int):
    """``samples`` continuations under [lookup, models...] table levels, and the exact distribution."""
    family = table_family(VOCAB, ORDER, num_models, spread=1.5, seed=3)
    prompt = torch.tensor(TABLE_PROMPT)
    result = run_hsd(
        [LookupDraft(max_ngram=2), *(TableRunner(m) for m in family)],
        [prompt] * samples,
        block_sizes=[3] + [2] * (num_models - 1),
        max_new_tokens=STEPS,
        seeds=7,
    )
    got = [tuple(s[len(prompt) :].tolist()) for s in result.sequences]
    return got, family[-1].continuation_probs(TABLE_PROMPT, STEPS), result.stats


@pytest.mark.parametrize("num_models", [1, 2])
def test_sampling_under_a_lookup_level_is_exact(num_models: int) -> None:
    samples, exact, stats = _table_run(num_models, 20_000)
    assert pooled_chi_square(samples, exact).p_value > 1e-3
    assert stats.drafted[0] > 0 and stats.accepted[1] > 0 and stats.corrections[1] > 0, stats.summary()


def test_a_correction_drawn_from_p_fails_the_same_test() -> None:
    torch.manual_seed(0)
    with correction_drawn_from_p():
        samples, exact, _ = _table_run(1, 20_000)
    assert pooled_chi_square(samples, exact).p_value < 1e-6


@pytest.mark.triton
def test_the_verification_kernel_takes_point_masses() -> None:
    """The Triton verification (interpreted on CPU) against the lookup's one-hot q: the same tokens
    as the torch reference (keyed randomness), with proposals accepted and rejected."""
    family = table_family(VOCAB, ORDER, 2, spread=1.5, seed=3)
    prompts = [torch.tensor(TABLE_PROMPT), torch.tensor(TABLE_PROMPT[3:])]
    kwargs = {"block_sizes": [3, 2], "max_new_tokens": 12, "seeds": 5}
    levels = [LookupDraft(max_ngram=2), *(TableRunner(m) for m in family)]
    ref = run_hsd(levels, prompts, use_kernel=False, **kwargs)
    levels = [LookupDraft(max_ngram=2), *(TableRunner(m) for m in family)]
    out = run_hsd(levels, prompts, use_kernel=True, **kwargs)
    assert [s.tolist() for s in out.sequences] == [s.tolist() for s in ref.sequences]
    assert ref.stats.accepted[1] > 0 and ref.stats.corrections[1] > 0, ref.stats.summary()


# ------------------------------------------------------------------------------ tiny HF models
PASSAGE = [5, 9, 11, 40, 3, 7, 12, 60, 33, 21]


@pytest.fixture(scope="module")
def target() -> torch.nn.Module:
    return tiny_model("llama", lm_head_scale=2.0)


def _greedy(model, ids, drafts=None, **kwargs):
    hsd = {} if drafts is None else {"custom_generate": hsd_fast.generate, "drafts": drafts}
    return model.generate(ids, do_sample=False, max_new_tokens=20, **hsd, **kwargs)


@pytest.mark.hf
@pytest.mark.parametrize("num_drafts", [0, 1, 2])
def test_greedy_equals_the_target_with_a_repeating_prompt(target, num_drafts: int) -> None:
    """A prompt that repeats a passage: the lookup proposes it and level 1 accepts some."""
    ids = torch.tensor([PASSAGE + PASSAGE[:4] + [70] + PASSAGE + PASSAGE[:3]])
    expected = _greedy(target, ids, eos_token_id=None)
    drafts = ["lookup", *derived_drafts(target, num_drafts)]
    out = _greedy(target, ids, drafts, T=[4] + [2] * num_drafts, eos_token_id=None, output_hsd_stats=True)
    assert out.sequences.tolist() == expected.tolist()
    assert out.hsd_stats.drafted[0] > 0 and out.hsd_stats.accepted[1] > 0, out.hsd_stats.summary()


@pytest.mark.hf
def test_greedy_padded_batch_with_an_eos(target) -> None:
    prompts = [PASSAGE * 2, PASSAGE[:4], [70, 71, 3, 4, 5, 6] * 2]
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    free = _greedy(target, ids, attention_mask=mask, eos_token_id=None)
    eos = int(free[1, width + 6])  # row 1 stops there (or earlier)
    expected = _greedy(target, ids, attention_mask=mask, eos_token_id=eos, pad_token_id=0)
    drafts = [LookupDraft(max_ngram=4, min_ngram=2), *derived_drafts(target, 1)]
    out = _greedy(target, ids, drafts, T=[3, 3], attention_mask=mask, eos_token_id=eos, pad_token_id=0)
    assert out.tolist() == expected.tolist()
    assert (expected[:, width:] == 0).any(), "no row stopped early"


@pytest.mark.hf
def test_a_lookup_that_never_matches_decodes_as_level_one_alone(target) -> None:
    """No 6-gram recurs: nothing is proposed, and every level-1 round is a plain decoding step."""
    ids = torch.tensor([[5, 9, 11, 40, 3, 7, 12, 60]])
    expected = _greedy(target, ids, eos_token_id=None)
    out = _greedy(
        target, ids, [LookupDraft(max_ngram=6, min_ngram=6)], T=[4], eos_token_id=None, output_hsd_stats=True
    )
    assert out.sequences.tolist() == expected.tolist()
    stats = out.hsd_stats
    assert stats.drafted[0] == 0 and stats.verified[1] == 0 and stats.bonus[1] == 20, stats.summary()


@pytest.mark.slow
@pytest.mark.hf
def test_sampling_on_a_tiny_hf_model_is_exact() -> None:
    vocab, steps = 6, 3
    target = tiny_model("llama", vocab_size=vocab, lm_head_scale=4.0)
    prompt = torch.tensor([3, 4, 5, 1, 3, 4, 5])  # its suffixes recur: proposals from the start
    exact = exact_distribution(target, prompt, vocab, steps)
    samples, stats = hsd_samples(target, ["lookup", noisy_copy(target, 0.3, seed=1)], prompt, 5000, steps)
    assert pooled_chi_square(samples, exact).p_value > 1e-3
    assert stats.accepted[1] > 0 and stats.corrections[1] > 0, stats.summary()


@pytest.mark.hf
def test_a_lookup_level_anywhere_but_first_is_refused(target) -> None:
    ids = torch.tensor([PASSAGE])
    with pytest.raises(ValueError, match=r"drafts\[1\] is a lookup level"):
        _greedy(target, ids, [*derived_drafts(target, 1), "lookup"])
    with pytest.raises(TypeError, match=r"drafts\[0\] must be a model"):
        _greedy(target, ids, ["lookahead"])
    with pytest.raises(ValueError, match="min_ngram <= max_ngram"):
        LookupDraft(max_ngram=2, min_ngram=3)
    with pytest.raises(ValueError, match="min_ngram <= max_ngram"):
        LookupDraft(min_ngram=0)
    with pytest.raises(ValueError, match="first level, under at least one model"):
        run_hsd([LookupDraft()], [torch.tensor([1, 2])], block_sizes=[], max_new_tokens=2)


def test_compile_auto_knows_a_lookup_hierarchy_across_requests(monkeypatch, compile_decisions) -> None:
    """``drafts=["lookup"]`` builds a new LookupDraft per request: the rent-or-buy record of
    ``compile="auto"`` keys it by value, so one request's eager seconds count for the next with an
    equal lookup level, and not for another one."""
    target = TableRunner(table_family(VOCAB, ORDER, 1)[0])
    target.compilable = True  # its steps are built eagerly below: only the decision is recorded
    monkeypatch.setattr(engine, "AUTO_COMPILE_AFTER_SECONDS", 1e-9)  # one eager request buys a compile

    def compiles(lookup: LookupDraft) -> bool:
        compile_decisions.clear()
        run_hsd([lookup, target], [torch.tensor(TABLE_PROMPT)], block_sizes=[3], max_new_tokens=6)
        return any(compile_decisions)

    assert not compiles(LookupDraft())  # nothing decoded yet: eager
    assert compiles(LookupDraft())  # an equal lookup level, built anew: the first request counts
    assert not compiles(LookupDraft(max_ngram=2))  # another lookup level: a record of its own
