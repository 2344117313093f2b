"""A hierarchy inside a draft with another tokenizer (hsd_fast/other_tokenizer_chain.py): models in
the draft's tokenizer draft its greedy ids for it. The chain decodes exactly the ids the draft alone
would (checked step by step against ``DraftSteps``, with rows whose ids change between calls), so a
run's proposals, stats and output are those of the draft alone; ``draft_tokenizers`` with a boundary
above level 0 builds it on both API paths; sampled runs stay exact (point masses; a planted bug
fails the same test); the selector prices a chained draft as one level; bad chains are refused."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from hf_models import noisy_copy, tiny_model
from planted_bugs import proposals_verified_as_drafts
from test_other_tokenizer import _greedy, _sampled, four_letters, padded_batch, selection_inputs, tokenizers  # noqa: F401 (fixtures)
from test_profile import FakeClock

import hsd_fast
from hsd_fast.latency import BridgedCost
from hsd_fast.other_tokenizer_chain import ChainSteps, chain_steps
from hsd_fast.other_tokenizer_steps import DraftSteps
from hsd_fast.profile import ProfileCache, ProfileNoiseWarning
from hsd_fast.testing.exactness import pooled_chi_square

pytestmark = pytest.mark.hf

VOCAB = 104  # the draft tokenizer of the ``tokenizers`` fixture


def _draft_pair(seed: int = 3, noise: float = 0.3):
    """A draft model and a smaller, noisy one under it (agreeing often, not always)."""
    top = tiny_model("llama", vocab_size=VOCAB, layers=2, seed=seed)
    below = noisy_copy(top, noise, seed=11)
    return top, below


def _calls_as_the_bridge_makes_them(alone: DraftSteps, chain: ChainSteps) -> None:
    """Three rows: spans that start where a row's cache is still right, contexts that change (a
    verification replaced a row's last ids), counts that differ; every call's ids must equal the
    top's own (``DraftSteps.advance``)."""
    for steps in (alone, chain):
        steps.reserve(96)
    gen = torch.Generator().manual_seed(0)
    known = [torch.randint(0, VOCAB, (n,), generator=gen).tolist() for n in (5, 9, 2)]
    fed = [0, 0, 0]
    for call, count in enumerate([4, 6, 1, 5, 3]):
        spans = {}
        for r in range(3):
            if call % 2 == 1 and r != 1:
                known[r][-2:] = torch.randint(0, VOCAB, (2,), generator=gen).tolist()
                fed[r] = min(fed[r], len(known[r]) - 2)
            spans[r] = (fed[r], known[r][fed[r] :])
        expected = alone.advance(spans, count).ids
        assert chain.advance(spans, count).ids == expected, f"call {call}"
        for r in range(3):
            known[r] += expected[r]
            fed[r] = len(known[r]) - 1


def test_the_chain_decodes_the_ids_the_top_model_decodes_alone() -> None:
    top, below = _draft_pair()
    chain = chain_steps([below, top], [3], VOCAB, 3, compile=False)
    assert isinstance(chain, ChainSteps)
    _calls_as_the_bridge_makes_them(DraftSteps(copy.deepcopy(top), VOCAB, 3, compile=False), chain)
    assert 0 < chain.accepted < chain.drafted  # the lower model's proposals were partly kept


def test_a_lower_model_equal_to_the_top_has_every_proposal_kept() -> None:
    """Its cache must follow every row's ids (a stale slot would change its proposals)."""
    top, _ = _draft_pair()
    chain = chain_steps([copy.deepcopy(top), top], [3], VOCAB, 3, compile=False)
    _calls_as_the_bridge_makes_them(DraftSteps(copy.deepcopy(top), VOCAB, 3, compile=False), chain)
    assert chain.accepted == chain.drafted > 0


def test_the_lookup_level_under_the_top_keeps_its_ids() -> None:
    """The lookup level at the bottom of a chain: 0..k proposals per row from the row's own ids."""
    top, _ = _draft_pair()
    chain = chain_steps([hsd_fast.LookupDraft(2, 1), top], [3], VOCAB, 3, compile=False, eos_ids=[0])
    _calls_as_the_bridge_makes_them(DraftSteps(copy.deepcopy(top), VOCAB, 3, compile=False), chain)
    assert chain.drafted > 0


def test_a_chain_of_three_decodes_as_its_top() -> None:
    top, middle = _draft_pair()
    bottom = noisy_copy(middle, 0.3, seed=12)
    alone = DraftSteps(copy.deepcopy(top), VOCAB, 1, compile=False)
    chain = chain_steps([bottom, middle, top], [2, 3], VOCAB, 1, compile=False)
    for steps in (alone, chain):
        steps.reserve(64)
    ids = torch.randint(0, VOCAB, (7,), generator=torch.Generator().manual_seed(1)).tolist()
    first = alone.advance({0: (0, ids)}, 9).ids[0]
    assert chain.advance({0: (0, ids)}, 9).ids[0] == first
    ids += first
    assert (
        chain.advance({0: (len(ids) - 1, ids[-1:])}, 5).ids
        == alone.advance({0: (len(ids) - 1, ids[-1:])}, 5).ids
    )


def test_a_boundary_above_level_0_gives_the_targets_greedy_on_both_paths(tokenizers) -> None:  # noqa: F811
    """``drafts=[d0, d1]``, ``draft_tokenizers=[None, tok_d]``: d1 crosses to the target's tokenizer,
    d0 drafts for it in tok_d. The proposals are d1's own: stats equal a run with d1 alone."""
    target_tok, draft_tok = tokenizers
    target = tiny_model("llama", vocab_size=len(target_tok), lm_head_scale=2.0)
    top, below = _draft_pair()
    ids = torch.tensor([target_tok("the cat sat on the mat").input_ids])
    expected = _greedy(target, ids)
    run = {"custom_generate": hsd_fast.generate, "target_tokenizer": target_tok, "output_hsd_stats": True}
    alone = _greedy(target, ids, drafts=[top], T=[4], draft_tokenizers=[draft_tok], **run)
    chained = _greedy(target, ids, drafts=[below, top], T=[3, 4], draft_tokenizers=[None, draft_tok], **run)
    assert chained.sequences.tolist() == expected.tolist() == alone.sequences.tolist()
    assert chained.hsd_stats.drafted == alone.hsd_stats.drafted  # the same proposals, round by round
    assert chained.hsd_stats.accepted == alone.hsd_stats.accepted
    assert 0 < chained.hsd_stats.chain_accepted < chained.hsd_stats.chain_drafted
    assert "models under the bridged draft" in chained.hsd_stats.summary()
    looked_up = _greedy(target, ids, drafts=["lookup", top], draft_tokenizers=[None, draft_tok], **run)
    assert looked_up.sequences.tolist() == expected.tolist()
    assert (
        looked_up.hsd_stats.accepted
        == _greedy(target, ids, drafts=[top], draft_tokenizers=[draft_tok], **run).hsd_stats.accepted
    )  # T=4 for both: the same proposals
    wrapped = hsd_fast.wrap(
        target, [below, top], T=[3, 4], tokenizer=target_tok, draft_tokenizers=[draft_tok, draft_tok]
    )
    (level,) = wrapped.drafts
    assert level.below == (below,) and level.block_sizes == (3,) and level.model is top
    assert _greedy(wrapped, ids).tolist() == expected.tolist()


def test_a_chained_draft_under_a_middle_level_in_a_padded_batch(tokenizers) -> None:  # noqa: F811
    target_tok, draft_tok = tokenizers
    target = tiny_model("llama", vocab_size=len(target_tok), lm_head_scale=2.0)
    middle = tiny_model("llama", vocab_size=len(target_tok), layers=2, seed=5)
    top, below = _draft_pair()
    ids, mask = padded_batch(target_tok, ["the cat sat on the mat", "in there", "at the end of it"])
    expected = _greedy(target, ids, attention_mask=mask)
    out = _greedy(
        target, ids, attention_mask=mask, custom_generate=hsd_fast.generate, drafts=[below, top, middle],
        target_tokenizer=target_tok, draft_tokenizers=[None, draft_tok, None],
    )  # fmt: skip
    assert out.tolist() == expected.tolist()


def _chained_four_letters(four_letters):  # noqa: F811
    target, draft, middle, target_tok, draft_tok = four_letters
    below = noisy_copy(draft, 0.3, seed=13)
    spec = hsd_fast.OtherTokenizerDraft(draft, draft_tok, target_tok, below=[below], block_sizes=[2])
    return target, spec, middle, target_tok, draft_tok


def test_sampling_over_a_chained_draft_is_exact(four_letters) -> None:  # noqa: F811
    """A sampled run: the chained draft proposes its greedy ids as point masses (never q)."""
    target, spec, middle, target_tok, draft_tok = _chained_four_letters(four_letters)
    assert not spec.draws_q(greedy=False)
    samples, exact, stats = _sampled(target, spec, middle, target_tok, draft_tok, 4000, shared=False)
    assert pooled_chi_square(samples, exact).p_value > 1e-3
    assert stats.drafted[0] > 0 and stats.accepted[1] > 0 and stats.corrections[1] > 0, stats.summary()


def test_a_planted_bug_fails_the_sampled_test(four_letters) -> None:  # noqa: F811
    target, spec, middle, target_tok, draft_tok = _chained_four_letters(four_letters)
    with proposals_verified_as_drafts():
        samples, exact, _ = _sampled(target, spec, middle, target_tok, draft_tok, 4000, shared=False)
    assert pooled_chi_square(samples, exact).p_value < 1e-6


def test_bad_chains_are_refused(tokenizers) -> None:  # noqa: F811
    target_tok, draft_tok = tokenizers
    target = tiny_model("llama", vocab_size=len(target_tok))
    top, below = _draft_pair()
    ids = torch.tensor([target_tok("the cat").input_ids])
    call = {"custom_generate": hsd_fast.generate, "max_new_tokens": 4, "do_sample": False}
    call |= {"target_tokenizer": target_tok}
    with pytest.raises(ValueError, match="one tokenizer boundary at most"):
        target.generate(ids, drafts=[below, top], draft_tokenizers=[target_tok, draft_tok], **call)
    with pytest.raises(TypeError, match=r"drafts\[1\], which is not a model"):
        target.generate(ids, drafts=[below, "lookup", top], draft_tokenizers=[None, None, draft_tok], **call)
    with pytest.raises(TypeError, match=r"below\[1\] must be a torch.nn.Module"):
        hsd_fast.OtherTokenizerDraft(top, draft_tok, target_tok, below=[below, "lookup"], block_sizes=[2, 2])
    with pytest.raises(ValueError, match="one block size per draft"):
        target.generate(ids, drafts=[below, top], T=[2], draft_tokenizers=[None, draft_tok], **call)
    with pytest.raises(ValueError, match="block_sizes needs one int"):
        hsd_fast.OtherTokenizerDraft(top, draft_tok, target_tok, below=[below])
    with pytest.raises(ValueError, match="appears twice"):
        hsd_fast.OtherTokenizerDraft(top, draft_tok, target_tok, below=[top], block_sizes=[2])
    with pytest.raises(ValueError, match="shared_sampling=True"):
        hsd_fast.OtherTokenizerDraft(top, draft_tok, target_tok, True, below=[below], block_sizes=[2])


def test_select_hierarchy_prices_a_chained_draft_as_one_level(tokenizers) -> None:  # noqa: F811
    """A chained draft is one candidate, profiled as any draft with another tokenizer: its rates are
    its top model's (the same proposals), its calls are timed with the chain inside. On a fake clock
    where the model under the top costs a tenth of it and always agrees, a call drafting 4 ids costs
    less than the top's alone."""
    target_tok, draft_tok = tokenizers
    target = tiny_model("llama", vocab_size=len(target_tok), lm_head_scale=2.0)
    top, _ = _draft_pair()
    below = copy.deepcopy(top)
    clock = FakeClock()
    for model, scale in ((top, 1), (below, 0.1), (target, 40)):
        clock.attach(model, scale=scale)
    common = selection_inputs(target_tok, clock)
    alone = hsd_fast.OtherTokenizerDraft(top, draft_tok, target_tok)
    chained = hsd_fast.OtherTokenizerDraft(top, draft_tok, target_tok, below=[below], block_sizes=[3])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ProfileNoiseWarning)
        picks = [
            hsd_fast.select_hierarchy(target, [spec], cache=ProfileCache(), **common)
            for spec in (alone, chained)
        ]
    (alone_cost, chained_cost), (alone_rates, chained_rates) = zip(
        *((p.profile.costs[0], p.profile.alpha[0][1]) for p in picks), strict=True
    )
    assert chained_rates == alone_rates
    assert isinstance(chained_cost, BridgedCost) and chained_cost.draft(4) < alone_cost.draft(4)
