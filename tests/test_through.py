"""Tokens that came through (docs/design.md, "Tokens that came through"): in a chain proposal level >
m > v, v checks tokens the proposal level offered and m passed, which it accepts at a rate of their
own. The replay measures that rate on hand-worked text, the latency model mixes it with m's own
rate by the share of m's tokens that came through, the selector and the controller price chains
with it, and the controller learns it from the chains that run without touching the pair's rate,
and from probes of m on the request's text."""

from __future__ import annotations

import math
import warnings
from dataclasses import replace

import numpy as np
import pytest
import torch
from hf_models import noisy_copy, tiny_model
from test_controller import COSTS, alpha, seen
from test_profile import FakeClock

import hsd_fast
from hsd_fast.controller import LatencyController
from hsd_fast.latency import (
    AffineCost,
    LaterCalls,
    LookupCost,
    RatesThrough,
    chain_rates,
    expected_latency,
    shares_through,
)
from hsd_fast.lookup import LookupDraft
from hsd_fast.processors import LogitsTransform
from hsd_fast.profile import ProfileCache
from hsd_fast.proposal_scores import (
    Proposal,
    accepted_through,
    choices,
    corrected_through,
    own_trials,
    probabilities,
    replay,
    scorable,
)
from hsd_fast.run_estimates import PRIOR_TOKENS
from hsd_fast.selector import select
from hsd_fast.switching_types import Choice, Probe, ProposalsProbed

TEXT = torch.tensor([[5, 6, 7, 5, 6, 8]])  # [1, 6]: after [5 6 7 5] the lookup proposes 6 7 5
SPEC = LookupDraft(max_ngram=2, min_ngram=1)


def test_hand_worked_rate_on_what_the_model_under_passed() -> None:
    """Scored while the proposal is the text: 6 (after 4 tokens), then 7 (after [.. 5 6]), where the
    text leaves it. argmax[:, i] is the token after i + 1 tokens."""
    items = scorable(replay(SPEC, TEXT, max_T=3), TEXT)
    assert items.token.tolist() == [6, 7]

    def argmax(*tokens: int) -> np.ndarray:
        return probabilities(items, torch.tensor([[0, 0, 0, *tokens]]))

    # m passes both; v takes the 6, not the 7: two trials, one pass
    assert accepted_through(items, argmax(6, 7, 0), argmax(6, 9, 0)) == pytest.approx(0.5)
    # v would take the 7, but it rejected the 6: its trials end there
    assert accepted_through(items, argmax(6, 7, 0), argmax(2, 7, 0)) == pytest.approx(0.0)
    # m passes only the 6, v takes it: one trial, passed
    assert accepted_through(items, argmax(6, 2, 0), argmax(6, 7, 0)) == pytest.approx(1.0)
    assert accepted_through(items, argmax(2, 7, 0), argmax(6, 7, 0)) is None  # m passed nothing


def test_hand_worked_rate_on_the_corrections_of_the_model_under() -> None:
    """Where m rejects a proposed token its own argmax is its correction, which v takes iff its argmax
    is the same; a trial only while both took the proposal's tokens before it."""
    items = scorable(replay(SPEC, TEXT, max_T=3), TEXT)

    def rate(m: tuple, v: tuple) -> float | None:
        m_scores, v_scores = torch.tensor([[0, 0, 0, *m]]), torch.tensor([[0, 0, 0, *v]])
        below = probabilities(items, m_scores)
        return corrected_through(items, below, choices(items, m_scores), choices(items, v_scores))

    assert rate((4, 7, 0), (4, 7, 0)) == 1.0  # m corrects the 6 to 4, v agrees
    assert rate((4, 7, 0), (6, 7, 0)) == 0.0  # v sides with the proposal
    assert rate((6, 4, 0), (6, 4, 0)) == 1.0  # m keeps the 6 (both do), corrects the 7: agreed
    assert rate((6, 4, 0), (9, 4, 0)) is None  # v rejected the 6: the 7 is never its trial
    assert rate((6, 7, 0), (6, 7, 0)) is None  # m rejected nothing
    assert choices(items, torch.full((1, 6, 10), 0.1)) is None  # sampled: not measured


def test_hand_worked_trials_on_the_other_own_tokens_of_the_model_under() -> None:
    """m's token right after a proposal both it and v took whole (its bonus), or where nothing was
    offered (its draft), is a trial of v, passed where their choices agree; a proposal either
    rejected, or a choice unknown, makes none. choices[:, i]: the token after i + 1 tokens."""
    text_next = np.array([[6, 7, 5, 6, 8, -1]])  # v: the text's own next tokens (TEXT)
    whole, nothing, left = Proposal(0, 3, [5, 6]), Proposal(0, 2, []), Proposal(0, 2, [7, 9])

    def trials(m: list[int], proposals: list[Proposal]) -> tuple[float, float]:
        return own_trials(proposals, np.array([m]), text_next)

    agreeing = [6, 7, 5, 6, 8, -1]
    assert trials(agreeing, [whole, nothing]) == (2.0, 2.0)  # the bonus after 5 6 (8), the draft (7)
    assert trials([6, 7, 5, 6, 9, -1], [whole, nothing]) == (1.0, 2.0)  # its bonus is not the text's
    assert trials([6, 7, 5, 9, 8, -1], [whole]) == (0.0, 0.0)  # it rejected the 6: a correction
    assert trials([6, 7, 9, 6, 8, -1], [left]) == (0.0, 0.0)  # m took the 9, v did not: no bonus trial
    assert trials([6, 7, 5, 6, -1, -1], [whole]) == (0.0, 0.0)  # m's choice after it unknown


def test_sampled_the_model_above_keeps_what_the_one_under_kept_with_p_over_its_p() -> None:
    """m keeps a point mass x with p_m(x) and hands it up as its own sample; v keeps it with
    min(1, p_v(x) / p_m(x))."""
    proposals = [Proposal(0, 4, [6, 7])]
    items = scorable(proposals, TEXT)
    m, v = torch.full((1, 6, 10), 0.01), torch.full((1, 6, 10), 0.01)
    m[0, 3, 6], m[0, 4, 7] = 0.8, 0.5
    v[0, 3, 6], v[0, 4, 7] = 0.4, 1.0
    # token 6: a trial of weight 0.8, passed 0.8 * 0.4 / 0.8; token 7: weight 0.4 (both took the 6)
    # x 0.5, passed 0.4 * 0.5 * min(1, 1.0 / 0.5)
    expected = (0.4 + 0.2) / (0.8 + 0.2)
    rate = accepted_through(items, probabilities(items, m), probabilities(items, v))
    assert rate == pytest.approx(expected)


def test_the_chains_rate_takes_each_kind_of_token_in_its_place() -> None:
    lookup = LookupCost(1e-5, (0.0, 0.0, 1.0))  # always offers 2 tokens
    costs = [lookup, AffineCost(1e-3, 1e-4), AffineCost(2e-2, 1e-3)]
    alpha_ = [[1.0, (1.0, 1.0), (0.5,)], [(1.0, 1.0), 1.0, 0.6], [(0.5,), 0.6, 1.0]]
    # m keeps both offered tokens and adds its own (the bonus): 2 of its 3 tokens came through,
    # and its blocks run kept, kept, own, kept, kept (T = 2 + 3 positions at most)
    assert shares_through(lookup, alpha_[0][1], 2) == pytest.approx((2 / 3, 0.0, 1 / 3))
    rates = chain_rates(costs, alpha_, [0, 1, 2], [2, 3], {(0, 1, 2): RatesThrough(0.9, 0.2)})
    assert rates == [(1.0, 1.0), pytest.approx((0.9, 0.9, 0.6, 0.9, 0.9))]
    rates = chain_rates(costs, alpha_, [0, 1, 2], [2, 3], {(0, 1, 2): RatesThrough(0.9, 0.2, own=0.7)})
    assert rates[1] == pytest.approx((0.9, 0.9, 0.7, 0.9, 0.9))  # m's bonus at its own rate through
    # m keeps the first token half the time (then the second too): a correction alone, or two
    # kept and the bonus; token 1 is a correction or a kept one, token 2 ...
    half = (0.5, 1.0)
    assert shares_through(lookup, half, 2) == pytest.approx((0.5, 0.25, 0.25))
    alpha_[0][1] = alpha_[1][0] = half
    rates = chain_rates(costs, alpha_, [0, 1, 2], [2, 3], {(0, 1, 2): RatesThrough(0.9, 0.2)})
    first = 0.5 * 0.2 + 0.5 * 0.9
    second = 0.5 * 0.2 * first + 0.5 * 0.9 * 0.9  # after a correction a new run, else the 2nd kept
    assert rates[1][:2] == pytest.approx((first, second / first))
    assert rates[1] == pytest.approx(_simulated_rates(half, 0.9, 0.2, 0.6, 5), abs=0.01)
    unknown = chain_rates(costs, alpha_, [0, 1, 2], [2, 3], {(0, 1, 2): RatesThrough(0.9)})
    assert unknown[1] == pytest.approx(_simulated_rates(half, 0.9, 0.6, 0.6, 5), abs=0.01)  # m's own rate
    assert chain_rates(costs, alpha_, [0, 1, 2], [2, 3]) == [half, 0.6]  # none measured
    assert chain_rates(costs, alpha_, [1, 2], [3], {(0, 1, 2): RatesThrough(0.9)}) == [0.6]  # no level 0
    # a lookup that never offers: m's tokens are all its own
    never = LookupCost(1e-5, (1.0, 0.0, 0.0))
    assert shares_through(never, half, 2) == (0.0, 0.0, 1.0)
    assert chain_rates([never, *costs[1:]], alpha_, [0, 1, 2], [2, 3], {(0, 1, 2): RatesThrough(0.9)})[1] == (
        pytest.approx((0.6,) * 5)
    )


def test_rates_near_one_stay_rates_through_rounding() -> None:
    """Where the level above takes every token the model under it hands up (a table both repeat) its
    rate per position is a ratio of equal products, which rounding tipped past 1 (1.0000000000000002,
    in every one of these draws): the selector then raised (the zoo on the tables set, eager)."""
    rng = np.random.default_rng(0)
    for _ in range(20):
        weights = rng.random(9)
        lookup = LookupCost(1e-5, tuple(weights / weights.sum()))
        costs = [lookup, AffineCost(1e-3, 1e-4), AffineCost(2e-2, 1e-3)]
        alpha_ = [[1.0, (0.9,) + (1.0,) * 7, 1.0], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]
        rates = chain_rates(costs, alpha_, [0, 1, 2], [8, 8], {(0, 1, 2): RatesThrough(1.0)})
        assert all(0.0 <= r <= 1.0 for r in rates[1]), rates[1]
        assert expected_latency(costs, rates, [8, 8]) > 0  # the model takes them


def test_a_runs_later_calls_take_their_own_place_in_the_chains_rate() -> None:
    """Under the middle model the lookup's first call of a run offers 2 tokens at m's rate, the
    later ones (after m's own token) offer fewer and m takes fewer of them (``LaterCalls``): the
    rates past the first piece are theirs, and the shares weigh each call by how often a run
    makes it."""
    half, worse = (0.5, 1.0), (0.2, 0.5)
    later = LaterCalls((0.0, 0.5, 0.5), worse)  # offers 1 or 2 tokens, half the time each
    lookup = LookupCost(1e-5, (0.0, 0.0, 1.0), later=later)
    costs = [lookup, AffineCost(1e-3, 1e-4), AffineCost(2e-2, 1e-3)]
    alpha_ = [[1.0, half, (0.5,)], [half, 1.0, 0.6], [(0.5,), 0.6, 1.0]]
    known = {(0, 1, 2): RatesThrough(0.9, 0.2)}

    def rates_over(level_0: LookupCost) -> tuple[float, ...]:
        return chain_rates([level_0, *costs[1:]], alpha_, [0, 1, 2], [2, 3], known)[1]

    rates = rates_over(lookup)
    assert rates[0] == pytest.approx(0.5 * 0.2 + 0.5 * 0.9)  # the first piece as without later calls
    assert rates == pytest.approx(_simulated_rates(half, 0.9, 0.2, 0.6, 5, 50_000, later), abs=0.01)
    alike = replace(lookup, later=LaterCalls(lookup.lengths, half))  # later calls as the first
    assert rates_over(alike) == pytest.approx(rates_over(replace(lookup, later=None)))
    # shares over a run of T_1 = 3: the first call keeps 2 (gain 3, the run ends) or m corrects its
    # first token (gain 1), half the time each. A later call keeps 0.5 x 0.2 + 0.5 x (0.1 + 2 x 0.1)
    # = 0.25 tokens, corrects with 0.5 x 0.8 + 0.5 x 0.9 = 0.85, and gains 1 with 0.8; after a
    # first call that gained 1, a run makes 1 + 0.8 later calls: 0.9 per run
    assert shares_through(lookup, half, 2) == pytest.approx((0.5, 0.25, 0.25))  # T_1 not given: alike
    kept, corrections, calls = 1.0 + 0.9 * 0.25, 0.5 + 0.9 * 0.85, 1.9
    gain = kept + calls
    assert shares_through(lookup, half, 2, T_above=3) == pytest.approx(
        (kept / gain, corrections / gain, (calls - corrections) / gain)
    )
    assert shares_through(alike, half, 2, T_above=3) == pytest.approx((0.5, 0.25, 0.25))


def _simulated_rates(m_rate, passed, corrected, own, positions, blocks=100_000, later=None) -> list[float]:
    """Monte Carlo of v's rate per position of m's blocks over a lookup offering 2 tokens: m keeps
    token j at ``m_rate[j]`` while it keeps; each piece is the kept tokens, then m's own.
    ``later``: the calls after a block's first, ``LaterCalls`` (the tokens they offer drawn from its
    lengths, m keeping them at its rates)."""
    rng = np.random.default_rng(0)
    survive = np.zeros(positions + 1)  # summed over blocks: the product of the first j tokens' rates
    for _ in range(blocks):
        rates: list[float] = []
        while len(rates) < positions:
            if not rates or later is None:
                offered, taking = 2, m_rate
            else:
                offered, taking = rng.choice(len(later.lengths), p=later.lengths), later.rates
            kept = 0
            while kept < offered and rng.random() < taking[kept]:
                kept += 1
            rates += [passed] * kept + [corrected if kept < offered else own]
        survive += np.cumprod([1.0, *rates[:positions]])
    return list(survive[1:] / survive[:-1])


def test_the_selector_stacks_a_model_over_the_lookup_level_where_what_it_passes_holds() -> None:
    """A small draft the target agrees with at 0.6: over the lookup level it pays only if the tokens
    it passes of the lookup's are the ones the target takes. Its corrections matter less: each
    comes after the tokens it kept, which the target has taken by then."""
    lookup = LookupCost(2e-5, (0.3, 0.0, 0.0, 0.0, 0.7))
    costs = [lookup, AffineCost(1e-3, 1e-5), AffineCost(2e-2, 1e-4)]
    rates = (0.7, 0.9, 0.9, 0.9)
    alpha_ = [[1.0, rates, rates], [rates, 1.0, 0.6], [rates, 0.6, 1.0]]
    assert select(costs, alpha_, max_T=6, through={(0, 1, 2): RatesThrough(0.98, 0.6)}).chain == (0, 1, 2)
    assert select(costs, alpha_, max_T=6, through={(0, 1, 2): RatesThrough(0.98, 0.1)}).chain == (0, 1, 2)
    assert select(costs, alpha_, max_T=6, through={(0, 1, 2): RatesThrough(0.8, 0.1)}).chain == (0, 2)
    assert select(costs, alpha_, max_T=6).chain == (0, 2)


def test_the_controller_learns_the_rate_through_and_keeps_the_pairs_own() -> None:
    prior = {(0, 1, 3): RatesThrough(0.9, 0.5)}
    control = LatencyController(COSTS, alpha(0.8), every=1, through=prior)
    assert control.estimates.through(control.estimates.alpha()) == prior  # nothing ran: the profile's
    chain = Choice((0, 1), (4, 2))
    for r in range(1, 11):  # the target takes every token the small draft hands up
        control.learn(
            seen(r, chain, verified=[[4], [3]], accepted=[[4], [3]], sizes=[[], [], []], seconds=[[], [], []])
        )
    assert (1, 3) not in control.estimates.trials and control.estimates.alpha()[1][
        3
    ] == 0.8  # the pair's own rate stays
    learnt = control.estimates.through(control.estimates.alpha())[(0, 1, 3)]
    passed, tried, *shared = control.estimates.through_trials[(0, 1, 3)]
    kept, corrections, own = (x / tried for x in shared)
    rest = 0.5**corrections * 0.8**own
    mixed = (passed + PRIOR_TOKENS * 0.9**kept * rest) / (tried + PRIOR_TOKENS)
    # more taken than even every kept proposal taken explains: those at 1, the rest on the other two
    # kinds by one power, so that the three give the mix measured
    assert (mixed / rest) ** (1 / kept) > 1.0
    assert learnt.passed == 1.0 and 0.5 < learnt.corrected < 1.0 and 0.8 < learnt.own < 1.0
    assert learnt.corrected**corrections * learnt.own**own == pytest.approx(mixed)
    assert math.log(learnt.corrected) / math.log(0.5) == pytest.approx(math.log(learnt.own) / math.log(0.8))
    # the chain is priced with it: faster than with the pair's own rate alone
    costs, now = control.estimates.costs(), control.estimates.alpha()
    unmixed = expected_latency([COSTS[0], COSTS[1], COSTS[3]], [now[0][1], now[1][3]], [4, 2])
    assert control.modelled(chain, costs, now) < unmixed
    described = control.describe(["l", "a", "b", "t"])
    line = next(line for line in described if "t on what a passed of l: 0.90 -> 1.00" in line)
    assert f"on its other own tokens {learnt.own:.2f}" in line


def test_a_mix_below_the_prior_is_the_kept_proposals_rate_alone() -> None:
    """Where the target takes less of m's tokens than the prior's mix, the kept proposals' rate is
    solved for (the corrections' and m's own stay as they were: nothing apart tells them)."""
    prior = {(0, 1, 3): RatesThrough(0.9, 0.5)}
    control = LatencyController(COSTS, alpha(0.8), every=1, through=prior)
    chain = Choice((0, 1), (4, 2))
    for r in range(1, 11):  # the target rejects the first token of every block
        control.learn(
            seen(r, chain, verified=[[4], [3]], accepted=[[4], [0]], sizes=[[], [], []], seconds=[[], [], []])
        )
    learnt = control.estimates.through(control.estimates.alpha())[(0, 1, 3)]
    assert learnt.passed < 0.9 and learnt.corrected == 0.5 and learnt.own is None
    passed, tried, *shared = control.estimates.through_trials[(0, 1, 3)]
    kept, corrections, own = (x / tried for x in shared)
    rest = 0.5**corrections * 0.8**own
    mixed = (passed + PRIOR_TOKENS * 0.9**kept * rest) / (tried + PRIOR_TOKENS)
    assert learnt.passed**kept * rest == pytest.approx(mixed)


def test_probes_of_a_model_move_its_rates_over_the_lookup_level() -> None:
    """What a probe of model 1 found on the lookup's proposals (``ProposalsProbed``) counts as trials
    of the pair (lookup, 1) per block position and of the target's rates on what 1 kept, on its
    corrections and on its other own tokens (on top of the pair's rate), each on top of the prior
    as ``PRIOR_TOKENS`` trials (per position of a lookup level's, the pseudo-calls that reach it)."""
    prior = {(0, 1, 3): RatesThrough(0.9, 0.3)}
    control = LatencyController(COSTS, alpha(0.8), every=1, through=prior)
    chain = Choice((0, 1), (4, 2))
    before = control.modelled(chain, control.estimates.costs(), control.estimates.alpha())
    found = ProposalsProbed(
        0,
        np.array([10.0, 6.0]),
        np.array([12.0, 8.0]),
        kept=(16.0, 16.0),
        corrections=(9.0, 10.0),
        own=(7.0, 8.0),
    )
    control.learn(replace(seen(1, None), probes=(Probe(1, 40, 36, 1e-3, found),)))  # no round: no fade
    learnt = control.estimates.through(control.estimates.alpha())[(0, 1, 3)]
    assert learnt.passed == pytest.approx((16 + PRIOR_TOKENS * 0.9) / (16 + PRIOR_TOKENS))
    assert learnt.corrected == pytest.approx((9 + PRIOR_TOKENS * 0.3) / (10 + PRIOR_TOKENS))
    direct = (36 + PRIOR_TOKENS * 0.8) / (40 + PRIOR_TOKENS)  # the pair (1, t), probed too
    assert learnt.own == pytest.approx((7 + PRIOR_TOKENS * direct) / (8 + PRIOR_TOKENS))
    # the prior's (0.6, 0.8) per position, corrected; its calls reach position 1 in half of them
    # (lengths 0.5, 0.2, ...), position 2 in 0.3 x 0.6
    lookup_to_small, first, second = (
        control.estimates.alpha()[0][1],
        PRIOR_TOKENS * 0.5,
        PRIOR_TOKENS * 0.3 * 0.6,
    )
    assert lookup_to_small[0] == pytest.approx((10 + first * 0.6) / (12 + first))
    assert lookup_to_small[1] == pytest.approx((6 + second * 0.8) / (8 + second))
    assert control.estimates.alpha()[1][3] == pytest.approx((36 + PRIOR_TOKENS * 0.8) / (40 + PRIOR_TOKENS))
    assert (
        control.modelled(chain, control.estimates.costs(), control.estimates.alpha()) < before
    )  # the chain gained
    assert any(
        "(0 in the chain, 16 + 10 + 8 probed)" in line for line in control.describe(["l", "a", "b", "t"])
    )


def test_a_chain_without_a_measured_rate_counts_the_pair_as_before() -> None:
    control = LatencyController(COSTS, alpha(0.8), every=1)
    chain = Choice((0, 1), (4, 2))
    nothing = [[], [], []]
    control.learn(seen(1, chain, verified=[[4], [3]], accepted=[[4], [3]], sizes=nothing, seconds=nothing))
    assert control.estimates.trials[(1, 3)][1].sum() == 3 and not control.estimates.through_trials


def test_select_hierarchy_measures_the_rates_through_its_lookup_level(tmp_path) -> None:
    """The replay scores every model on the lookup's proposals once: the rates through it land in
    the profile (indices of the selection's candidates), and a second selection reads them back."""
    target = tiny_model("llama")
    draft = noisy_copy(target, 0.1, seed=1)
    clock = FakeClock()
    clock.attach(draft, scale=1)
    clock.attach(target, scale=6)
    prompts = torch.randint(3, 12, (4, 16), generator=torch.Generator().manual_seed(2))  # repeats
    cache = ProfileCache(tmp_path / "profiles.json")
    kwargs = {"cache": cache, "clock": clock, "progress": False, "max_T": 3, "min_gain": 0}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pick = hsd_fast.select_hierarchy(target, ["lookup", draft], prompts, **kwargs)
    through = dict(pick.profile.through)
    assert set(through) <= {(0, 1, 2), (0, 2, 1)} and (0, 1, 2) in through
    assert 0.0 <= through[(0, 1, 2)].passed <= 1.0
    assert through[(0, 1, 2)].corrected is None or 0.0 <= through[(0, 1, 2)].corrected <= 1.0
    stored = [k for k in cache.entries if k.startswith("lookup through ")]
    assert len(stored) == 2  # draft > target and target > draft
    again = ProfileCache(tmp_path / "profiles.json").proposal_through(
        LookupDraft(), [draft, target], prompts, LogitsTransform(), True, 3, progress=False, new_tokens=64
    )
    assert again[(0, 1)] == through[(0, 1, 2)]


def test_a_probe_is_worth_its_time_where_the_rates_through_could_make_a_chain_win() -> None:
    """The gate (``wants_probes``) raises by two standard errors the rates a probe of model 1 would
    measure: its acceptance by the target and the target's on what it passes of the lookup's
    proposals. Here only the second makes ``lookup > 1 > t`` worth trying against ``lookup > t``;
    once probes have shown those rates low, the gate stays shut."""
    costs = [LookupCost(1e-4, (0.3, 0.1, 0.1, 0.1, 0.4)), *COSTS[1:]]
    rates = alpha(0.5)
    rates[0][3] = rates[0][1] = (0.9, 0.9)
    control = LatencyController(costs, rates, through={(0, 1, 3): RatesThrough(0.9, 0.3)}, probe_every=1)
    control.current = lookup_only = Choice((0,), (4,))
    chain = Choice((0, 1), (4, 4))
    now = control.predicted(lookup_only, control.estimates.costs(), control.estimates.alpha())
    raised_pair = control.estimates.alpha()
    raised_pair[1][3] = 0.5 + 2 * (0.25 / PRIOR_TOKENS) ** 0.5
    assert (
        control.predicted(chain, control.estimates.costs(), raised_pair) > 0.95 * now
    )  # the pair alone: shut
    assert control.wants_probes(replace(seen(1, lookup_only), round=1)) == [1]
    low = ProposalsProbed(
        0, np.array([40.0]), np.array([40.0]), kept=(20.0, 40.0), corrections=(2.0, 40.0), own=(20.0, 40.0)
    )
    control.learn(replace(seen(1, None), probes=(Probe(1, 40, 20, 1e-3, low),)))
    control.looks += 64  # past any wait
    assert 1 not in control.wants_probes(replace(seen(1, lookup_only), round=2))
