"""The lookup level's profile: its replay proposes what the index proposes, the lengths it offers and
the per-position acceptance on hand-worked text, its host cost, and ``select_hierarchy`` with a
lookup candidate end to end (cached, generating the target's own greedy output)."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from hf_models import noisy_copy, tiny_model
from test_lookup_index import propose_brute_force
from test_profile import FakeClock

import hsd_fast
from hsd_fast import LookupDraft
from hsd_fast.latency import DepthRates, at_block_size, mean_gain
from hsd_fast.processors import LogitsTransform
from hsd_fast.profile import ProfileCache, ProfileNoiseWarning
from hsd_fast.profile.cache import model_identity
from hsd_fast.profile.proposal_replay import (
    host_seconds,
    offered_lengths,
    row_lengths,
    row_rates,
    rows_of,
)
from hsd_fast.profile.run_text import continued
from hsd_fast.proposal_scores import Proposal, acceptance_by_position, replay
from hsd_fast.row_spread import ProposalRows

TEXT = torch.tensor([[5, 6, 7, 5, 6, 8]])  # [1, 6]
SPEC = LookupDraft(max_ngram=2, min_ngram=1)


def test_replay_calls_as_a_run_under_the_target_does() -> None:
    """Each call proposes what brute force does from the text so far; the next call comes after the
    proposed tokens that equal the text and one more (the target's own token)."""
    ids = torch.randint(0, 4, (3, 40), generator=torch.Generator().manual_seed(0))
    for start in (1, 20):
        calls = replay(LookupDraft(3, 1), ids, max_T=5, start=start)
        for (n, t, proposal, _), following in zip(calls, [*calls[1:], None], strict=True):
            row = ids[n].tolist()
            assert proposal == propose_brute_force(row[:t], 5, 3, 1), (n, t)
            matched = 0
            while (
                matched < len(proposal) and t + matched < len(row) and proposal[matched] == row[t + matched]
            ):
                matched += 1
            if t + matched + 1 <= len(row):
                assert following[:2] == (n, t + matched + 1)
            else:  # the row's last call
                assert following is None or following[0] == n + 1
        assert {c.row for c in calls} == {0, 1, 2} and all(c.t >= start for c in calls)
        assert any(len(c.tokens) > 1 for c in calls)  # a 4-token alphabet repeats: long matches
        assert all(c.q is None for c in calls)  # point masses


def test_hand_worked_replay_and_lengths() -> None:
    # after [5, 6, 7, 5] the 1-gram (5) occurred at 0: propose 6 7 5, of which 6 is the text: the
    # next call is after [5 6 7 5 6 8]; no other context has a suffix that occurred before
    proposals = replay(SPEC, TEXT, max_T=3)
    assert [(c.t, c.tokens) for c in proposals] == [(1, []), (2, []), (3, []), (4, [6, 7, 5]), (6, [])]
    assert offered_lengths(proposals, 3) == pytest.approx((0.8, 0.0, 0.0, 0.2))
    assert offered_lengths(replay(SPEC, TEXT, max_T=2), 2) == pytest.approx((0.8, 0.0, 0.2))


def test_hand_worked_acceptance_by_position() -> None:
    """Scored while the proposal is the text: (t=4) 6 matches the text, then 7 is scored and the text
    (8) leaves it. scores[:, i] is the token after i + 1 tokens."""
    proposals = replay(SPEC, TEXT, max_T=3)
    argmax = torch.tensor([[0, 0, 0, 6, 9, 0]])  # accepts the 6 after [5 6 7 5], not a 7 after [.. 6]
    assert acceptance_by_position(proposals, TEXT, argmax, 3) == pytest.approx((1.0, 0.0, 0.0))
    argmax[0, 4] = 7
    assert acceptance_by_position(proposals, TEXT, argmax, 3) == pytest.approx((1.0, 1.0, 1.0))
    argmax[0, 3] = 2  # token 1 rejected: token 2 is never verified, its position takes a_1
    assert acceptance_by_position(proposals, TEXT, argmax, 3) == pytest.approx((0.0, 0.0, 0.0))

    probs = torch.full((1, 6, 10), 0.01)
    probs[0, 3, 6], probs[0, 4, 7] = 0.8, 0.5
    # a_1 = 0.8; a_2 = 0.8 * 0.5 / 0.8 (weighted by the chance token 1 was accepted)
    assert acceptance_by_position(proposals, TEXT, probs, 3) == pytest.approx((0.8, 0.5, 0.5))


def test_a_drawn_proposal_passes_with_p_over_q() -> None:
    """A token drawn from a q the level hands up (``draws_q``) passes with min(1, p(x) / q(x))."""
    probs = torch.full((1, 6, 10), 0.01)
    probs[0, 3, 6], probs[0, 4, 7] = 0.4, 0.5
    proposals = [Proposal(0, 4, [6, 7], q=[0.5, 0.25])]
    # a_1 = 0.4 / 0.5; a_2 = min(1, 0.5 / 0.25), weighted by a_1
    assert acceptance_by_position(proposals, TEXT, probs, 2) == pytest.approx((0.8, 1.0))


def test_a_lookup_that_never_matches_has_nothing_offered_and_no_rates() -> None:
    ids = torch.arange(20)[None]  # no token repeats
    proposals = replay(SPEC, ids, max_T=4)
    assert offered_lengths(proposals, 4) == pytest.approx((1.0, 0.0, 0.0, 0.0, 0.0))
    assert acceptance_by_position(proposals, ids, ids, 4) == (0.0,) * 4


def test_host_seconds_is_a_positive_time_per_call() -> None:
    ids = torch.tensor([[1, 2, 3, 4] * 12])
    seconds, noise = host_seconds(SPEC, ids, max_T=4, repeats=3)
    assert 0 < seconds < 0.05 and noise >= 0
    batch, _ = host_seconds(SPEC, ids, max_T=4, repeats=3, batch=3)  # the one row, three times
    assert 0 < batch < 0.15
    fake, _ = host_seconds(SPEC, ids, max_T=4, repeats=3, clock=FakeClock())
    assert fake == 0.0  # only the fake clock's forwards advance it: the clock is the one given


def _family():
    target = tiny_model("llama", lm_head_scale=2.0)
    return target, [noisy_copy(target, 0.1, seed=1)]


def test_select_hierarchy_with_a_lookup_candidate(tmp_path) -> None:
    """On text that repeats and the target agrees with (its own greedy output: a tiny random model
    falls into loops), a free lookup level (fake time: only forwards cost) is picked at the bottom;
    its Hierarchy generates the target's own greedy output; a second selection is answered from the
    cache."""
    target, drafts = _family()
    clock = FakeClock()
    clock.attach(drafts[0], scale=1)
    clock.attach(target, scale=6)
    start = torch.randint(3, 96, (2, 4), generator=torch.Generator().manual_seed(2))
    prompts = target.generate(start, do_sample=False, max_new_tokens=28)  # [2, 32]
    cache = ProfileCache(tmp_path / "profiles.json")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ProfileNoiseWarning)
        pick = hsd_fast.select_hierarchy(
            target, [drafts[0], "lookup"], prompts, cache=cache, clock=clock, progress=False, max_T=4
        )
    assert pick.chain[0] == 1 and isinstance(pick.drafts[0], LookupDraft), pick.chain
    for h in (pick, *pick.runner_ups):
        assert 1 not in h.chain[1:]  # the lookup (candidate 1) only ever at the bottom
    expected = target.generate(prompts[:1], do_sample=False, max_new_tokens=12)
    out = target.generate(prompts[:1], custom_generate=hsd_fast.generate, hierarchy=pick, max_new_tokens=12)
    assert out.tolist() == expected.tolist()

    entries = json.loads((tmp_path / "profiles.json").read_text())["entries"]
    assert sum(k.startswith("lookup rates ") for k in entries) == 2 * 4  # draft and target, T = 1..4
    assert sum(k.startswith("lookup lengths ") for k in entries) == 4
    lengths = entries[next(k for k in entries if k.startswith("lookup lengths ") and " T4 " in k)]
    assert lengths[0] < 0.5  # the loops match most of the time
    again = hsd_fast.select_hierarchy(
        target, [drafts[0], LookupDraft()], prompts, cache=ProfileCache(tmp_path / "profiles.json"),
        clock=clock, progress=False, max_T=4,
    )  # fmt: skip
    assert (again.chain, again.T) == (pick.chain, pick.T)
    assert json.loads((tmp_path / "profiles.json").read_text())["entries"] == entries


def test_select_hierarchy_refuses_two_lookup_candidates_and_other_names() -> None:
    target, _ = _family()
    ids = torch.ones(1, 8, dtype=torch.long)
    with pytest.raises(ValueError, match="at most one lookup"):
        hsd_fast.select_hierarchy(target, ["lookup", LookupDraft(2, 1)], ids)
    with pytest.raises(ValueError, match="'lookup' or a LookupDraft; got \\['ngram'\\]"):
        hsd_fast.select_hierarchy(target, ["ngram"], ids)


def test_the_replayed_text_is_the_targets_own_continuation() -> None:
    target, _ = _family()
    ids = torch.randint(3, 96, (2, 12), generator=torch.Generator().manual_seed(4))
    text = continued(target, ids, do_sample=False)
    assert text.shape == ids.shape and torch.equal(text[:, :6], ids[:, :6])
    assert torch.equal(text, target.generate(ids[:, :6], do_sample=False, max_new_tokens=6))
    state = torch.random.get_rng_state()
    sampled = continued(target, ids, do_sample=True)
    assert torch.equal(torch.random.get_rng_state(), state)  # seeded on a fork: the caller's draws unchanged
    assert torch.equal(sampled, continued(target, ids, do_sample=True))


def test_the_cache_keys_the_profile_by_sampling() -> None:
    target, drafts = _family()
    ids = torch.randint(3, 96, (2, 16), generator=torch.Generator().manual_seed(3))
    cache = ProfileCache()
    models = [drafts[0], target]
    greedy = cache.proposal_level(SPEC, models, ids, LogitsTransform(), True, 4, False, {"do_sample": False})
    sampled = cache.proposal_level(SPEC, models, ids, LogitsTransform(), False, 4, False, {"do_sample": True})
    assert greedy[1] != sampled[1]
    # the replay at T = 4, and at each smaller T (``DepthRates``): per T, a text per sampling
    assert sum(k.startswith("lookup rates ") for k in cache.entries) == 4 * 4
    assert sum(k.startswith("lookup lengths ") for k in cache.entries) == 2 * 4
    assert sum(k.startswith("lookup cost ") for k in cache.entries) == 1  # host work: the same


def test_the_replays_at_each_block_size_are_those_a_profile_at_that_size_makes() -> None:
    """``proposal_level`` at ``max_T`` = 5 carries, for each smaller T, the lengths and rates a
    profile at ``max_T`` = T measures (under its keys: read back, not replayed again); the model
    prices T from them (``at_block_size``), and on a tiny model's loops they differ from the replay
    at 5's."""
    target, drafts = _family()
    ids = torch.randint(3, 96, (4, 16), generator=torch.Generator().manual_seed(7))
    models, sampling = [drafts[0], target], (LogitsTransform(), True)
    cache = ProfileCache()
    cost, rates = cache.proposal_level(SPEC, models, ids, *sampling, 5, False, {"do_sample": False})
    assert all(isinstance(r, DepthRates) and sorted(r.at) == [1, 2, 3, 4] for r in rates)
    replayed = set(cache.entries)
    for T in (1, 2, 4):
        own_cost, own_rates = ProfileCache().proposal_level(
            SPEC, models, ids, *sampling, T, False, {"do_sample": False}
        )
        assert [r.at[T] for r in rates] == [(own_cost.lengths, tuple(own)) for own in own_rates]
        assert (
            cache.proposal_level(SPEC, models, ids, *sampling, T, False, {"do_sample": False})[1] == own_rates
        )
        (level, _), (rate, _) = at_block_size([cost, cost], [rates[-1], 1.0], [T, 1])
        assert level.lengths == own_cost.lengths and rate == own_rates[-1]
    added = set(cache.entries) - replayed  # the smaller T's were there: only their calls timed
    assert len(added) == 3 and all(k.startswith("lookup cost ") for k in added)
    assert any(r.at[T][1] != tuple(r)[:T] for r in rates for T in r.at)


def test_the_replay_predicts_the_gain_a_run_measures() -> None:
    """lookup > target, greedy, on a tiny model's own loops: the latency model's expected tokens per
    target forward from the replayed profile is within 10 % of what the engine does on the same
    prompts (the replay walks the calls as the run makes them; weighting every position alike
    over-predicted by 14 and 31 % here)."""
    target, _ = _family()
    prompts = torch.randint(3, 96, (8, 24), generator=torch.Generator().manual_seed(5))
    for T in (2, 4):
        cost, rates = ProfileCache().proposal_level(
            SPEC, [target], prompts, LogitsTransform(), True, T, False, {"do_sample": False}
        )
        predicted = mean_gain(rates[-1], cost.block(T))
        out = target.generate(
            prompts[:, :12], custom_generate=hsd_fast.generate, drafts=[SPEC], T=[T], max_new_tokens=12,
            eos_token_id=None, pad_token_id=0, do_sample=False, output_hsd_stats=True,
        )  # fmt: skip
        rounds = int(out.hsd_stats.row_forwards[-1]) - len(prompts)  # the prefills excluded
        measured = len(prompts) * 12 / rounds
        assert predicted > 1.4 and abs(predicted / measured - 1) < 0.1, (T, predicted, measured)


def test_each_rows_profile_is_the_pooled_one_over_its_own_calls() -> None:
    ids = torch.tensor([[5, 6, 7, 5, 6, 8], [1, 2, 1, 2, 1, 2]])
    scores = torch.tensor([[6, 7, 5, 6, 8, 0], [2, 1, 2, 1, 2, 1]])  # greedy: the text is the argmax
    calls = [Proposal(1, 2, [1, 2, 1]), Proposal(0, 2, []), Proposal(0, 4, [6, 7]), Proposal(1, 5, [2])]
    assert rows_of(calls) == [[calls[1], calls[2]], [calls[0], calls[3]]]
    counts, lengths = row_lengths(calls, 3)
    rates = row_rates(calls, ids, scores, 3)
    assert counts == [2, 2]
    assert lengths == [offered_lengths(calls[1:3], 3), offered_lengths(calls[::3], 3)]
    assert rates == [acceptance_by_position(c, ids, scores, 3) for c in (calls[1:3], calls[::3])]
    assert lengths[0] == (0.5, 0.0, 0.5, 0.0) and rates[1] == (1.0, 1.0, 1.0)


def test_the_cache_keeps_each_rows_profile_and_replays_only_for_what_is_missing(monkeypatch) -> None:
    """``proposal_rows``: each calibration row's lengths and rates, from the replay that measured the
    pooled ones (a row's are the same functions over its own calls), each shrunk towards the pooled;
    read back without a replay; a cache that holds the pooled profile only (written before rows
    were kept) still serves ``proposal_level`` as it is, and replays for the rows; a model whose
    rates are there is not run again."""
    import hsd_fast.profile.cache as cache_module

    target, drafts = _family()
    ids = torch.randint(3, 96, (4, 16), generator=torch.Generator().manual_seed(6))
    cache, models, greedy = ProfileCache(), [drafts[0], target], {"do_sample": False}
    args = (SPEC, models, ids, LogitsTransform(), True, 4, False, greedy)
    _, pooled_rates = cache.proposal_level(*args)
    replays, scored = [], []
    monkeypatch.setattr(
        cache_module.proposal_scores, "replay", lambda *a, **k: replays.append(a) or replay(*a, **k)
    )
    scoring = cache_module.teacher_forced_scores
    monkeypatch.setattr(
        cache_module, "teacher_forced_scores", lambda m, *a: scored.append(m) or scoring(m, *a)
    )
    rows = cache.proposal_rows(*args)
    assert not replays and len(rows) == len(models)  # the first replay kept the rows too
    (calls,) = [v for k, v in cache.entries.items() if k.startswith("lookup row calls ")]
    (lengths,) = [v for k, v in cache.entries.items() if k.startswith("lookup row lengths ")]
    target_rates = next(
        v
        for k, v in cache.entries.items()
        if k.startswith("lookup row rates ") and f"{model_identity(target)} on" in k
    )
    assert len(calls) == len(lengths) == len(target_rates) == len(ids)
    assert rows[1] == ProposalRows.shrunk(
        calls, lengths, target_rates, cache.proposal_level(*args)[0].lengths, pooled_rates[1]
    )
    for key in [k for k in cache.entries if k.startswith("lookup row ")]:
        del cache.entries[key]  # as a cache from before rows were kept
    cache.proposal_level(*args)
    assert not replays and not scored
    assert cache.proposal_rows(*args) == rows and len(replays) == 1 and scored == models
    del cache.entries[
        next(
            k for k in cache.entries if k.startswith("lookup rates ") and f"{model_identity(target)} on" in k
        )
    ]
    assert cache.proposal_level(*args)[1] == pooled_rates and scored[2:] == [target]  # the target alone
