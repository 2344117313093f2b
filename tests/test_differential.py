"""Greedy HSD against HF's own greedy ``generate`` on requests drawn at random: a hierarchy (the lookup
level, derived drafts, an early exit of the target, a token tree, or all of them as the candidates of
an adaptive run), block sizes, a left-padded batch, EOS ids, length budgets and HF's logits
processors, together. The enumerated tests cover each feature on its own and in the pairs someone
thought of, and ``test_request_validation.py::test_random_valid_requests`` draws lengths up to the
position table over plain chains; this one looks for the combinations of features nobody listed. Every
request must give HF's tokens exactly (fp32, eager); sampled, each row of a request must draw alone
what it draws in the batch."""

import functools
import warnings

import planted_bugs
import pytest
import torch
from hf_models import derived_drafts, left_padded, tiny_model
from hypothesis import HealthCheck, Phase, given, reject, settings
from hypothesis import strategies as st
from transformers.generation.logits_process import ExponentialDecayLengthPenalty

import hsd_fast

pytestmark = pytest.mark.hf

VOCAB, PAD = 96, 0


def _target_and_drafts(arch: str) -> tuple[torch.nn.Module, list[torch.nn.Module]]:
    target = tiny_model(arch, vocab_size=VOCAB, layers=4)
    return target, derived_drafts(target, 3)


@pytest.fixture(scope="module", params=["llama", "gpt2", "gpt_neox"])
def models(request) -> tuple[torch.nn.Module, list[torch.nn.Module]]:
    """A target (rotary, learned and partial rotary positions by architecture) and three drafts."""
    return _target_and_drafts(request.param)


@st.composite
def hierarchies(draw, drafts: list[torch.nn.Module], target: torch.nn.Module, adaptive: bool = True) -> dict:
    """``drafts=``, ``T=`` and maybe ``tree=``, or ``adapt=True``: levels smallest first, at least one."""
    levels: list = [d for d in drafts if draw(st.booleans())]
    if draw(st.booleans()):
        levels.append(hsd_fast.EarlyExit(target, draw(st.integers(1, 3))))
    lookup = draw(st.booleans()) or not levels
    if lookup:
        levels.insert(0, "lookup")
    T = [draw(st.integers(1, 4)) for _ in levels]
    request = {"drafts": levels, "T": T}
    shape = draw(st.sampled_from(["chain", "tree", "adaptive"] if adaptive else ["chain", "tree"]))
    if shape == "tree" and not lookup:  # a tree needs a draft model at level 0
        request["tree"] = hsd_fast.Tree.spine(T[0], 2)
    elif shape == "adaptive":  # the levels are candidates: every round runs a sub-chain of them
        request = {"drafts": levels, "adapt": True}
    return request


@st.composite
def batches(draw) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask)``: 1-3 rows of 1-8 tokens, left padded."""
    rows = draw(st.lists(st.lists(st.integers(3, VOCAB - 1), min_size=1, max_size=8), min_size=1, max_size=3))
    return left_padded(rows, PAD)


@functools.cache
def _decay_keeps_a_ban() -> bool:
    """Whether HF's exponential decay length penalty leaves a banned EOS banned. transformers 5.17
    adds ``abs(-inf) * x`` to it, a NaN that greedy's argmax then picks: HF emits the banned EOS,
    where hsd_fast (and HF 5.24) keep the ban (docs/design.md, "Other facts")."""
    penalty = ExponentialDecayLengthPenalty((0, 2.0), 0, 0)
    scores = penalty(torch.zeros(1, 1, dtype=torch.long), torch.tensor([[-torch.inf, 0.0]]))
    return bool(torch.isneginf(scores[0, 0]))


@st.composite
def options(draw, seen: list[int]) -> dict:
    """HF's stopping and processor options, each present or not. Their token ids are mostly drawn
    from ``seen`` (what the target says to the prompt unconstrained): a ban, a bias or an EOS on a
    token that is never the argmax changes nothing and would test nothing."""
    token = st.one_of(st.sampled_from(seen), st.integers(3, VOCAB - 1)) if seen else st.integers(3, VOCAB - 1)
    # EOS: none, a few ids, or everything the target said (a row then stops as soon as it may)
    every_seen = [st.just(seen)] if seen else []
    eos = draw(st.one_of(st.none(), token, st.lists(token, min_size=1, max_size=3), *every_seen))
    out = {"max_new_tokens": draw(st.integers(1, 20)), "eos_token_id": eos, "pad_token_id": PAD}
    maybe = {
        "repetition_penalty": st.sampled_from([1.3, 0.8]),
        "no_repeat_ngram_size": st.integers(1, 3),
        "bad_words_ids": st.lists(st.lists(token, min_size=1, max_size=2), min_size=1, max_size=2),
        "suppress_tokens": st.lists(token, min_size=1, max_size=3),
        "begin_suppress_tokens": st.lists(token, min_size=1, max_size=2),
        "sequence_bias": st.dictionaries(
            st.tuples(token), st.sampled_from([-4.0, 3.0]), min_size=1, max_size=2
        ),
        "min_new_tokens": st.integers(1, 6),
        "forced_eos_token_id": token,
    }
    if _decay_keeps_a_ban():
        maybe["exponential_decay_length_penalty"] = st.tuples(st.integers(0, 8), st.sampled_from([1.5, 3.0]))
    for name, values in maybe.items():
        if draw(st.integers(0, 2)) == 0:
            out[name] = draw(values)
    return out


def _draw_request(target: torch.nn.Module, drafts: list[torch.nn.Module], data, adaptive: bool = True):
    """``(levels, input_ids, attention_mask, options)``; the options' ids drawn from what the target
    says to the prompt."""
    levels = data.draw(hierarchies(drafts, target, adaptive), label="levels")
    ids, mask = data.draw(batches(), label="batch")
    plain = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=20, eos_token_id=None)
    seen = sorted(set(plain[:, ids.shape[1] :].flatten().tolist()))
    return levels, ids, mask, data.draw(options(seen), label="options")


def _hsd_gives_hfs_tokens(target: torch.nn.Module, drafts: list[torch.nn.Module], data) -> None:
    levels, ids, mask, opts = _draw_request(target, drafts, data)
    with warnings.catch_warnings():
        # HF's "unfeasible length constraints" (min_new_tokens beyond the budget: both stop at the
        # budget); an early exit above a larger draft: DraftOrderWarning
        warnings.simplefilter("ignore")
        hsd = {"custom_generate": hsd_fast.generate, "compile": False, **levels}
        try:
            expected = target.generate(ids, attention_mask=mask, do_sample=False, **opts)
        except Exception as refused:  # options HF refuses together: a drop-in refuses them too
            with pytest.raises(type(refused)):
                target.generate(ids, attention_mask=mask, do_sample=False, **hsd, **opts)
            return
        out = target.generate(ids, attention_mask=mask, do_sample=False, **hsd, **opts)
    assert out.tolist() == expected.tolist()


def _search_fails_under(bug, check) -> None:
    """``check`` fails on one of 40 requests drawn for the Llama target while ``bug`` is planted
    (derandomized: the same requests each run; stopping at the first failure, without shrinking)."""
    models = _target_and_drafts("llama")

    @settings(max_examples=40, deadline=None, derandomize=True, database=None, phases=[Phase.generate])
    @given(data=st.data())
    def search(data) -> None:
        check(*models, data)

    with bug(), pytest.raises(AssertionError):
        search()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_requests_give_hfs_greedy_tokens(models, data) -> None:
    _hsd_gives_hfs_tokens(*models, data)


@pytest.mark.parametrize(
    "bug",
    [
        planted_bugs.penalty_history_without_the_blocks_drafts,
        planted_bugs.lengths_one_token_late,
        planted_bugs.exit_not_caught_up,
    ],
    ids=lambda bug: bug.__name__,
)
def test_the_random_requests_catch_planted_bugs(bug) -> None:
    """The same draws find each planted bug. Llama: its early exits hand their hidden states up, which
    the last bug breaks (GPT-2's recompute them)."""
    _search_fails_under(bug, _hsd_gives_hfs_tokens)


def _a_row_samples_alone_what_it_samples_in_the_batch(
    target: torch.nn.Module, drafts: list[torch.nn.Module], data
) -> None:
    # Not adaptive: an adaptive run's policy looks at the batch's timing, and the levels below the
    # target key by the epoch its looks start (docs/design.md, "Switching hierarchies")
    levels, ids, mask, opts = _draw_request(target, drafts, data, adaptive=False)
    sampling = {"do_sample": True, "temperature": data.draw(st.sampled_from([0.7, 1.0, 1.5]), label="temp")}
    sampling |= data.draw(st.sampled_from([{}, {"top_k": 5}, {"top_p": 0.8}]), label="filter")
    seeds = data.draw(st.lists(st.integers(0, 2**31), min_size=len(ids), max_size=len(ids)), label="seeds")
    hsd = {"custom_generate": hsd_fast.generate, "compile": False, **levels, **sampling, **opts}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            batch = target.generate(ids, attention_mask=mask, seed=seeds, **hsd)
        except (ValueError, RuntimeError):  # options HF refuses together (the greedy test checks those)
            reject()
        for r in range(len(ids)):
            # alone with the padding it has in the batch: HF's history processors see the pad ids
            # (a repetition penalty, an n-gram ban of token 0), and so do ours
            alone = target.generate(ids[r : r + 1], attention_mask=mask[r : r + 1], seed=[seeds[r]], **hsd)
            row = batch[r].tolist()  # a row that stopped early is padded
            assert row[: alone.shape[1]] == alone[0].tolist() and set(row[alone.shape[1] :]) <= {PAD}, r


@pytest.mark.slow
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_row_samples_alone_what_it_samples_in_a_random_batch(models, data) -> None:
    """Sampled: each row of a random request, with its seed, draws the same tokens alone as in the
    batch (keyed randomness: docs/design.md, "Keyed randomness")."""
    _a_row_samples_alone_what_it_samples_in_the_batch(*models, data)


@pytest.mark.slow
def test_the_sampled_batches_catch_a_planted_bug() -> None:
    _search_fails_under(
        planted_bugs.draft_seeds_by_batch_index, _a_row_samples_alone_what_it_samples_in_the_batch
    )
