"""The adaptive controller (docs/design.md, "The adaptive controller"): estimates that follow what
the run measures, decisions of the latency model with hysteresis, and the output still the
target's with it in charge."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hf_models import derived_drafts, tiny_model

import hsd_fast
import hsd_fast.run_estimates as estimates_module
from hsd_fast.controller import CORRECTION_PRIOR, LatencyController
from hsd_fast.engine import run_hsd
from hsd_fast.hierarchy_types import Profile, Selection
from hsd_fast.latency import AffineCost, DepthRates, LookupCost, expected_latency
from hsd_fast.row_spread import ProposalRows, row_rate, slowest_row_z
from hsd_fast.run_estimates import PRIOR_CALLS, PRIOR_TOKENS, Scaled
from hsd_fast.switching_types import Adaptive, Choice, Observation
from hsd_fast.testing.exactness import pooled_chi_square
from hsd_fast.testing.tables import TableRunner, table_family

# candidates: a lookup level, a small draft, a larger one; the target last
COSTS = [
    LookupCost(1e-4, (0.5, 0.2, 0.1, 0.1, 0.1)),
    AffineCost(1e-3, 1e-4),
    AffineCost(3e-3, 2e-4),
    AffineCost(1e-2, 1e-3),
]


def alpha(small_to_target: float = 0.8) -> list[list]:
    a = [[0.5] * 4 for _ in range(4)]
    for i in range(1, 4):
        a[0][i] = a[i][0] = (0.6, 0.8)
    a[1][3] = a[3][1] = small_to_target
    a[1][2] = a[2][1] = 0.85
    a[2][3] = a[3][2] = 0.9
    return a


def seen(
    round_: int, choice: Choice | None, verified=(), accepted=(), sizes=(), seconds=(), wall=0.01, tokens=4,
    look=0.0, rounds=1, opens=(),
) -> Observation:  # fmt: skip
    return Observation(
        round=round_, epoch=round_, choice=choice, num_candidates=3, lookup_first=True, trees=(),
        committed=np.array([100]), finished=np.array([False]), tokens=torch.zeros(1, 1, dtype=torch.int64),
        round_tokens=tokens, round_seconds=wall, look_seconds=look, verified=tuple(map(np.array, verified)),
        accepted=tuple(map(np.array, accepted)), step_sizes=tuple(map(np.array, sizes)),
        step_seconds=tuple(map(np.array, seconds)), rounds=rounds, opens=tuple(map(np.array, opens)),
    )  # fmt: skip


def test_acceptance_follows_the_verifications_of_the_pair_that_ran() -> None:
    control = LatencyController(COSTS, alpha(0.8), every=1)
    small = Choice((1,), (4,))
    for r in range(1, 21):  # the target rejects nearly every token of the small draft
        control.learn(
            seen(r, small, verified=[[4, 4, 4, 4]], accepted=[[0, 0, 1, 0]], sizes=[[], []], seconds=[[], []],
                 rounds=2)
        )  # fmt: skip
    rate = control.estimates.alpha()[1][3]
    assert rate < 0.6  # from 0.8: one success in five trials per look, twenty looks, move it most of the way
    assert control.estimates.alpha()[2][3] == 0.9  # a pair that did not run keeps its prior
    # the counts fade by 0.9 a round: a look that reports two rounds fades the older ones twice
    expected_trials = sum(5 * 0.9 ** (2 * k) for k in range(20))
    assert control.estimates.trials[(1, 3)][1].sum() == pytest.approx(expected_trials)
    assert rate == pytest.approx(
        (expected_trials / 5 + PRIOR_TOKENS * 0.8) / (expected_trials + PRIOR_TOKENS)
    )


def test_costs_scale_by_what_the_run_measured() -> None:
    control = LatencyController(COSTS, alpha())
    small = Choice((1,), (4,))
    # the small draft's steps and the target's run twice as slow as the profile says
    draft, verify = 2 * 4 * COSTS[1](1), 2 * COSTS[3](5)
    control.learn(
        seen(1, small, verified=[[4]], accepted=[[4]], sizes=[[4], [5]], seconds=[[draft], [verify]])
    )
    costs = control.estimates.costs()
    assert costs[1](1) == pytest.approx(2 * COSTS[1](1)) and costs[3](7) == pytest.approx(2 * COSTS[3](7))
    assert costs[2](3) == pytest.approx(2 * COSTS[2](3))  # not run: the overall scale

    # a lookup level's calls 10x their profile: host work, on its own scale; the models' 2x stays
    lookup = Choice((0, 1), (4, 4))
    calls = [10 * COSTS[0](1)] * 5
    control.learn(
        seen(2, lookup, verified=[[4], [4]], accepted=[[4], [4]], sizes=[[1] * 5, [5], [5]],
             seconds=[calls, [2 * COSTS[1](5)], [verify]])
    )  # fmt: skip
    costs = control.estimates.costs()
    assert costs[0].factor == pytest.approx(10.0)
    assert costs[2](3) == pytest.approx(2 * COSTS[2](3))  # not run: the models' scale, not the lookup's


def test_the_lookup_levels_proposal_lengths_follow_its_verifications() -> None:
    control = LatencyController(COSTS, alpha(), every=1)
    lookup = Choice((0,), (2,))
    # nothing matches in 6 of 8 calls; the other two are cut at T = 2 (at least 2 tokens)
    control.learn(
        seen(1, lookup, verified=[[0] * 6 + [2, 2]], accepted=[[0] * 8], sizes=[[], []], seconds=[[], []])
    )
    prior = COSTS[0].lengths  # (0.5, 0.2, 0.1, 0.1, 0.1)
    now = control.estimates.lengths(0)
    assert now[0] == pytest.approx((PRIOR_CALLS * 0.5 + 6) / (PRIOR_CALLS + 8))
    assert now[1] == pytest.approx(
        (1 - now[0]) * PRIOR_CALLS * 0.2 / (PRIOR_CALLS * 0.5 + 2)
    )  # cut calls reach 1
    # past the cut nothing was seen: the prior's hazards there (P(2 | >= 2) = 0.1 / 0.3, ...)
    assert now[2] / sum(now[2:]) == pytest.approx(prior[2] / sum(prior[2:]))
    assert now[3] / now[4] == pytest.approx(prior[3] / prior[4]) and sum(now) == pytest.approx(1.0)
    assert control.estimates.costs()[0].lengths == now  # what the decisions price
    assert any("nothing matched 0.50 -> " in line for line in control.describe(["l", "a", "b", "t"]))


def test_a_lookups_later_calls_under_a_middle_model_are_counted_apart() -> None:
    """With ``later_calls_apart``, in lookup > m > target the first call of each of m's runs (marked
    ``opens``) teaches the lookup's lengths and the pair's rates; the later ones, after m's own
    token, teach ``later_calls``, which start as the first calls' estimates and price the chain's
    runs."""
    chain = Choice((0, 2), (4, 4))
    marked, unmarked = (LatencyController(COSTS, alpha(), every=1, later_calls_apart=True) for _ in range(2))
    default = LatencyController(COSTS, alpha(), every=1)  # off by default: every call as a first one
    before = marked.estimates.later_calls(0, 2, marked.estimates.alpha())
    assert before.lengths == pytest.approx(marked.estimates.lengths(0)) and before.rates == pytest.approx(
        (0.6, 0.8)
    )
    # each round: a first call offers 4 tokens, m keeps 2 (a correction: gain 3); a later call
    # offers nothing (m's draft: gain 1), the run reaches 4; the target takes m's 4 tokens
    rounds = {"verified": [[4, 0] * 5, [4] * 5], "accepted": [[2, 0] * 5, [4] * 5], "sizes": [[], [], []]}
    marked.learn(seen(1, chain, **rounds, seconds=[[], [], []], opens=[[True, False] * 5, [True] * 5]))
    unmarked.learn(seen(1, chain, **rounds, seconds=[[], [], []]))
    default.learn(seen(1, chain, **rounds, seconds=[[], [], []], opens=[[True, False] * 5, [True] * 5]))
    assert (
        default.estimates.proposals[0].tolist() == unmarked.estimates.proposals[0].tolist()
        and not default.estimates.later_proposals
    )
    assert default.modelled(chain, default.estimates.costs(), default.estimates.alpha()) == pytest.approx(
        unmarked.modelled(chain, unmarked.estimates.costs(), unmarked.estimates.alpha())
    )
    assert marked.estimates.proposals[0][1].tolist() == [0, 0, 0, 0, 5]  # five first calls cut at T = 4
    assert marked.estimates.later_proposals[(0, 2)][0].tolist() == [5, 0, 0, 0, 0]  # five later ended at 0
    assert unmarked.estimates.proposals[0].sum() == 10 and not unmarked.estimates.later_proposals
    later = marked.estimates.later_calls(0, 2, marked.estimates.alpha())
    assert later.lengths[0] == pytest.approx(
        (PRIOR_CALLS * marked.estimates.lengths(0)[0] + 5) / (PRIOR_CALLS + 5)
    )
    assert later.rates == pytest.approx(
        marked.estimates.alpha()[0][2]
    )  # no later call offered a token: no trials
    assert marked.estimates.trials[(0, 2)].tolist() == [[5, 5, 0, 0], [5, 5, 5, 0]]  # the first calls' only
    # the first calls now look better than the pooled calls did, the later ones worse
    assert marked.estimates.lengths(0)[0] < unmarked.estimates.lengths(0)[0] < later.lengths[0]
    costs = marked.estimates.costs()
    assert marked.modelled(chain, costs, marked.estimates.alpha()) != pytest.approx(
        unmarked.modelled(chain, unmarked.estimates.costs(), unmarked.estimates.alpha()), rel=1e-3
    )
    costs_later = marked.estimates.chain_costs(costs, marked.estimates.alpha(), [0, 2, 3])
    assert costs_later[0].later == later and costs[0].later is None  # for this chain only
    assert marked.estimates.chain_costs(costs, marked.estimates.alpha(), [0, 3]) == costs  # no middle model
    assert any(
        "l's later calls under b: nothing matched" in line for line in marked.describe(["l", "a", "b", "t"])
    )


def test_a_lookup_levels_prior_counts_at_a_position_as_often_as_its_proposals_reach_it() -> None:
    control = LatencyController(COSTS, alpha(), every=1)
    lookup = Choice((0,), (4,))
    # ten calls offer 4 tokens each and the target takes them all: ten trials at every position
    control.learn(seen(1, lookup, verified=[[4] * 10], accepted=[[4] * 10], sizes=[[], []], seconds=[[], []]))
    # the prior's calls (lengths 0.5, 0.2, 0.1, 0.1, 0.1; rates 0.6, 0.8, 0.8, ...) reach
    # position 1 in half of them, 2 in 0.3 x 0.6, 3 in 0.2 x 0.6 x 0.8, 4 in 0.1 x 0.6 x 0.8 x 0.8
    reached = [0.5, 0.3 * 0.6, 0.2 * 0.6 * 0.8, 0.1 * 0.6 * 0.8 * 0.8]
    prior = [0.6, 0.8, 0.8, 0.8]
    expected = [
        (10 + PRIOR_TOKENS * w * a) / (10 + PRIOR_TOKENS * w) for w, a in zip(reached, prior, strict=True)
    ]
    assert control.estimates.alpha()[0][3] == pytest.approx(tuple(expected))
    # so the run's ten trials outweigh the prior more at the late positions, few proposals reach
    assert 1 - control.estimates.alpha()[0][3][3] < (1 - control.estimates.alpha()[0][3][1]) / 2


def test_a_chain_that_delivers_slower_than_modelled_is_priced_as_measured() -> None:
    control = LatencyController(COSTS, alpha(0.95), every=1, decide_share=math.inf)
    first = control(seen(0, None))
    assert first.drafts  # the model prefers drafting
    # every hierarchy with a draft delivers a token 10x as slowly as the model says (as a batch's rows
    # finishing apart would): after one measured look (a request's first holds its prefill and is not
    # measured) the controller decodes without a draft, every drafting chain priced as that one was
    choice = first
    for r in (1, 2):
        wall = 10.0 * control.modelled(choice, control.estimates.costs(), control.estimates.alpha()) * 4
        choice = control(seen(r, choice, wall=wall, tokens=4))
        assert choice == (first if r == 1 else Choice())
    measured, modelled, tokens = control.measured[(first.drafts, None)]
    assert measured / modelled == pytest.approx(10.0) and tokens == 4  # one look of 4 tokens
    # shrunk in logs: over the chains that ran towards 1, the chain's own towards that
    pooled = 10 ** (tokens / (tokens + CORRECTION_PRIOR))
    assert control.drafting == pytest.approx(pooled)
    assert control.correction(first) == pytest.approx(
        10 ** (tokens / (tokens + CORRECTION_PRIOR))
        * pooled ** (CORRECTION_PRIOR / (tokens + CORRECTION_PRIOR))
    )
    other_T = Choice(first.drafts, tuple(t + 1 for t in first.T))
    assert control.correction(other_T) == control.correction(first)  # per chain, whatever T
    never_ran = Choice((1,), (2,), hsd_fast.Tree.chain(2))
    assert control.correction(never_ran) == pytest.approx(pooled)
    assert control.correction(Choice()) == 1.0  # plain decoding has its own: not measured yet


def test_warm_up_rounds_and_the_looks_own_time_are_not_what_the_hierarchy_costs() -> None:
    """Rounds that ran steps eagerly while their shapes waited to compile (``warming``: a process's
    first requests) teach acceptance but neither the chain's measured seconds per token nor the
    cost scales; a look's own host time (its decision, probes, the reconfiguration) is not counted
    as the hierarchy's. A planted slow warm-up or a slow look would otherwise price the chain at
    several times the model and move the controller off it."""
    control = LatencyController(COSTS, alpha(0.95), every=1, decide_share=math.inf)
    first = control(seen(0, None))
    modelled = control.modelled(first, control.estimates.costs(), control.estimates.alpha())
    slow = [[10 * COSTS[m](5)] for m in (*first.drafts, 3)]
    sizes = [[5]] * len(slow)
    verified, accepted = [[first.T[0]]] * len(first.drafts), [[0]] * len(first.drafts)
    warm_up = replace(
        seen(2, first, verified, accepted, sizes=sizes, seconds=slow, wall=10 * modelled * 4), warming=True
    )
    before = control.estimates.alpha()
    assert control(warm_up) == first
    assert control.measured == {} and not any(control.estimates.ratios)  # no cost learnt from it
    assert control.estimates.alpha() != before  # its verifications are counted all the same
    # a look of 30x a round's modelled time before rounds delivered as modelled: the chain ran as modelled
    modelled = control.modelled(first, control.estimates.costs(), control.estimates.alpha())
    looked = seen(3, first, wall=31 * modelled * 4, look=30 * modelled * 4)
    control(looked)
    control(seen(4, first, wall=modelled * 4))  # the next decision folds it
    measured, modelled_sum, _ = control.measured[(first.drafts, None)]
    assert measured / modelled_sum == pytest.approx(1.0, rel=0.05)


def test_the_rounds_after_the_last_look_are_learnt_and_decide_nothing() -> None:
    """At the run's end (``finished``) the rounds after the last look count like a look's, with no
    decision; the rows they leave decoding (none) are not the next request's: a request of the same
    batch keeps the choice."""
    control = LatencyController(COSTS, alpha(0.95), every=2, decide_share=math.inf)
    two = {"committed": np.array([100, 100]), "finished": np.array([False, False])}
    first = control(replace(seen(0, None), **two))
    control(replace(seen(1, first, rounds=2), **two))
    decided, before = len(control.decisions), control.estimates.alpha()
    verified, accepted = [[first.T[0]] * 2] * len(first.drafts), [[0, 0]] * len(first.drafts)
    end = seen(2, first, verified, accepted, [[]] * 3, [[]] * 3, rounds=1)
    control.finished(replace(end, committed=two["committed"], finished=np.array([True, True])))
    assert len(control.decisions) == decided and control.estimates.alpha() != before
    assert control.estimates.rows == 2 and control(replace(seen(0, None), **two)) == first
    assert len(control.decisions) == decided  # the next request kept it without deciding


def test_it_switches_when_the_estimates_say_so_and_not_for_a_small_gain() -> None:
    control = LatencyController(COSTS, alpha(0.95), every=1, decide_share=math.inf)  # no time budget
    first = control(seen(0, None))
    assert 1 in first.drafts  # the small draft is accepted at 0.95 by the target: it is in the pick
    # the text changes: the target now rejects nearly everything the small draft proposes
    choice = first
    for r in range(1, 12):
        drafts = choice.drafts
        verified = [[choice.T[i]] * 2 for i in range(len(drafts))]
        accepted = [[0, 0] if drafts[i] == 1 else [choice.T[i], choice.T[i]] for i in range(len(drafts))]
        as_modelled = (
            control.modelled(choice, control.estimates.costs(), control.estimates.alpha()) * 4
        )  # 4 tokens a look
        none = [[]] * (len(drafts) + 1)
        choice = control(seen(r, choice, verified, accepted, none, none, wall=as_modelled))
    assert 1 not in choice.drafts
    # hysteresis: a decision within the margin keeps the current hierarchy
    stay = LatencyController(COSTS, alpha(0.95), every=1, margin=10.0, decide_share=math.inf)
    start = stay(seen(0, None))
    assert all(stay(seen(r, start)) == start for r in range(1, 5))


def intervals_while_holding(control: LatencyController, round_seconds: float, look: float = 1e-3) -> list:
    """The look intervals of a request whose hierarchy holds, looks of ``look`` seconds between rounds
    of ``round_seconds`` each: round 0's, then after each of five looks."""
    start = control(seen(0, None))
    intervals = [control.look_every]
    for r in range(1, 6):
        every = control.look_every
        control(seen(r, start, wall=look + every * round_seconds, look=look, rounds=every))
        intervals.append(control.look_every)
    return intervals


def test_looks_grow_sparse_while_the_hierarchy_holds_and_looks_cost() -> None:
    """Each look that keeps the hierarchy doubles the rounds to the next, up to the interval at which
    looks (1 ms here) take at most ``look_share`` of the time: with rounds of 5 ms, 16 rounds for
    2 % (at most ``max_every``); with rounds of 50 ms, every 2 rounds already. The first look of a
    request (its prefill) measures nothing. A new request (round 0) keeps the hierarchy without
    deciding and halves the interval; a switch brings it back to ``every``."""
    kwargs = {"every": 2, "margin": 10.0, "decide_share": math.inf}
    stay = LatencyController(COSTS, alpha(0.95), look_share=0.02, **kwargs)
    assert intervals_while_holding(stay, round_seconds=5e-3) == [2, 2, 8, 16, 16, 16]
    assert stay.look_every * 5e-3 > 1e-3 / 0.02 - 1e-3 > stay.look_every / 2 * 5e-3  # the smallest that fits
    decided, held = len(stay.decisions), stay.current
    assert stay(seen(0, None)) == held and len(stay.decisions) == decided  # the next request
    assert stay.look_every == 8
    stay(seen(0, None))  # a request with no look: halved again
    assert stay.look_every == 4
    capped = LatencyController(COSTS, alpha(0.95), look_share=0.02, max_every=8, **kwargs)
    assert intervals_while_holding(capped, round_seconds=5e-3)[-1] == 8
    slow_rounds = LatencyController(COSTS, alpha(0.95), look_share=0.02, **kwargs)
    assert intervals_while_holding(slow_rounds, round_seconds=50e-3) == [2] * 6
    regardless = LatencyController(COSTS, alpha(0.95), look_share=0.0, max_every=16, **kwargs)
    assert intervals_while_holding(regardless, round_seconds=50e-3) == [2, 2, 8, 16, 16, 16]

    switching = LatencyController(
        COSTS, alpha(0.95), every=2, margin=0.0, look_share=0.0, decide_share=math.inf
    )
    switching(seen(0, None))
    switching(seen(1, switching.current))
    switching(seen(2, switching.current, look=1e-3))
    assert switching.look_every == 8
    switching.current = Choice((2,), (1,))  # as if it had chosen a poor hierarchy: the next look leaves it
    assert (
        switching(seen(3, switching.current, look=1e-3)) != Choice((2,), (1,)) and switching.look_every == 2
    )


def test_the_run_asks_for_the_interval_after_every_look() -> None:
    """Through the engine: a controller that keeps its hierarchy looks at round ends 1, 2 (the first
    look measured nothing), 6, 14, then every 8 (``every=1, max_every=8``, looks allowed no share of
    the time), not at every round end."""
    target = tiny_model("llama")
    drafts = derived_drafts(target, 1)
    costs = [AffineCost(1e-3, 1e-4), AffineCost(4e-3, 4e-4)]
    # decide_share=inf: every look decides, however slow the machine (a capped look leaves no record)
    control = LatencyController(
        costs, [[1.0, 0.8], [0.8, 1.0]], every=1, max_every=8, look_share=0.0, margin=10.0,
        decide_share=math.inf,
    )  # fmt: skip
    control.current = Choice((0,), (2,))  # as if an earlier request had chosen it; the margin keeps it
    ids = torch.randint(3, target.config.vocab_size, (1, 8), generator=torch.Generator().manual_seed(2))
    out = target.generate(
        ids, custom_generate=hsd_fast.generate, drafts=drafts, adapt=control,
        do_sample=False, max_new_tokens=160, compile=False, output_hsd_stats=True,
    )  # fmt: skip
    assert [h.choice for h in out.hsd_stats.hierarchies] == [Choice((0,), (2,))]
    looks = [r for r, _, _ in control.decisions]  # none at round 0: the request kept the choice
    assert looks == list(range(1, len(looks) + 1)) and len(looks) >= 5
    rounds = out.hsd_stats.hierarchies[0].rounds  # every round end, the last look's stretch included
    assert len([r for r in [1, 2, 6, *range(14, rounds, 8)] if r < rounds]) == len(looks)


def test_decisions_keep_within_their_share_of_the_wall_time(monkeypatch) -> None:
    clock = itertools.count(step=1e-3)  # every reading of the controller's clock: 1 ms later
    monkeypatch.setattr("hsd_fast.controller.time", SimpleNamespace(perf_counter=lambda: next(clock)))
    control = LatencyController(COSTS, alpha(0.95), every=1, decide_share=0.02)
    control(seen(0, None))  # the first decision always runs: 1 ms
    for r in range(1, 200):  # looks of 10 ms each: a 1 ms decision fits every fifth
        control(seen(r, control.current))
    # after k more decisions, look r (whose wall is 10 ms * (r + 1)) may decide once 1 ms * k fits 2 %
    assert len(control.decisions) == 1 + 200 // 5
    assert control.decide_seconds == pytest.approx(0.001 * len(control.decisions))
    assert control.decide_seconds <= 0.02 * control.wall + 0.001


def test_probes_of_a_model_that_stays_out_grow_sparse(monkeypatch) -> None:
    """Each probe of a candidate that did not bring it into the hierarchy doubles the looks before
    the next (``_probe_wait``); in a new request, or once it has run, they start again at
    ``probe_every``."""
    monkeypatch.setattr(LatencyController, "_worth_probing", lambda *_: True)  # the gate always open
    control = LatencyController(COSTS, alpha(), probe_every=2)
    control.current, control.wall = Choice((0,), (4,)), 1e9  # probes within their share
    probed: dict[int, list[int]] = {1: [], 2: []}

    def looks(count: int) -> None:
        for _ in range(count):
            control.looks += 1
            for m in control.wants_probes(seen(control.looks, control.current)):
                probed[m].append(control.looks)

    looks(60)
    assert probed[1] == [1, 3, 7, 15, 31] and probed[2] == [2, 4, 8, 16, 32]  # waits 2, 4, 8, 16
    assert control(seen(0, None)) == control.current  # a new request (as many rows: no decision)
    looks(4)
    assert probed[1][5:] == [61, 63] and probed[2][5:] == [62, 64]
    control.current = Choice((0, 1), (4, 4))  # 1 joins ...
    looks(1)
    control.current = Choice((0, 2), (4, 4))  # ... and leaves (2 runs): its probes start afresh
    looks(4)
    assert probed[1][7:] == [66, 68]


def test_neighbours_and_the_shortlist_are_valid_hierarchies() -> None:
    control = LatencyController(COSTS, alpha())
    control(seen(0, None))
    for choice in [*control.shortlist, *control._neighbours(Choice((0, 1, 2), (4, 2, 2)))]:
        assert len(set(choice.drafts)) == len(choice.drafts) == len(choice.T)
        assert 0 not in choice.drafts[1:]  # a lookup level only first
        assert all(1 <= t <= control.max_T for t in choice.T)


# ------------------------------------------------------------------ the output, with the controller in charge

VOCAB, ORDER = 3, 2
FAMILY = table_family(VOCAB, ORDER, 3, spread=3.0, seed=1)
PROMPT = torch.arange(ORDER) % VOCAB


def test_sampled_with_the_controller_is_the_target_distribution() -> None:
    steps, rows = 6, 30_000
    costs = [AffineCost(1e-4, 1e-5), AffineCost(4e-4, 4e-5), AffineCost(1e-3, 1e-4)]
    prior = [[0.5, 0.6, 0.5], [0.6, 0.5, 0.7], [0.5, 0.7, 0.5]]
    control = LatencyController(costs, prior, max_T=3, every=2, margin=0.0, decide_share=math.inf)
    result = run_hsd(
        [TableRunner(m) for m in FAMILY], [PROMPT] * rows, max_new_tokens=steps, seeds=11,
        adapt=Adaptive(control, max_T=3),
    )  # fmt: skip
    samples = [tuple(s[ORDER:].tolist()) for s in result.sequences]
    exact = FAMILY[-1].continuation_probs(PROMPT.tolist(), steps)
    assert pooled_chi_square(samples, exact).p_value > 1e-3
    assert control.decisions and result.stats.hierarchies


@pytest.mark.hf
def test_greedy_with_the_controller_is_the_targets_own() -> None:
    target = tiny_model("llama")
    drafts = derived_drafts(target, 2)
    costs = [
        LookupCost(5e-5, (0.6, 0.2, 0.2)),
        AffineCost(1e-3, 1e-4),
        AffineCost(2e-3, 2e-4),
        AffineCost(4e-3, 4e-4),
    ]
    control = LatencyController(costs, alpha(0.7), every=2, decide_share=math.inf)  # decide often
    gen = torch.Generator().manual_seed(4)
    for _ in range(3):
        ids = torch.randint(3, target.config.vocab_size, (2, 8), generator=gen)
        expected = target.generate(ids, do_sample=False, max_new_tokens=48)
        out = target.generate(
            ids, custom_generate=hsd_fast.generate, drafts=["lookup", *drafts], adapt=control,
            do_sample=False, max_new_tokens=48, compile=False,
        )  # fmt: skip
        assert out.tolist() == expected.tolist()
    assert any(r for r in control.estimates.ratios)  # it measured, decided at every look, and switched
    assert len(control.decisions) > 6 and len({choice for _, choice, _ in control.decisions}) > 2


@pytest.mark.hf
def test_a_controller_that_served_a_request_starts_the_next_where_it_left_it() -> None:
    target = tiny_model("llama")
    drafts = derived_drafts(target, 2)
    costs = [AffineCost(1e-3, 1e-4), AffineCost(2e-3, 2e-4), AffineCost(4e-3, 4e-4)]
    prior = [[1.0, 0.85, 0.7], [0.85, 1.0, 0.8], [0.7, 0.8, 1.0]]
    control = LatencyController(costs, prior, every=2, decide_share=math.inf)
    pick = hsd_fast.Hierarchy(drafts=(drafts[1],), T=(3,), selection=Selection((1, 2), (3,), 1.0))
    ids = torch.randint(3, target.config.vocab_size, (1, 8), generator=torch.Generator().manual_seed(2))
    expected = target.generate(ids, do_sample=False, max_new_tokens=24)

    def run():
        return target.generate(
            ids, custom_generate=hsd_fast.generate, drafts=drafts, hierarchy=pick, adapt=control,
            do_sample=False, max_new_tokens=24, compile=False, output_hsd_stats=True,
        )  # fmt: skip

    first = run()
    assert first.hsd_stats.hierarchies[0].choice == Choice((1,), (3,))  # a fresh controller: the pick's
    decided, left = len(control.decisions), control.current
    second = run()
    assert second.sequences.tolist() == first.sequences.tolist() == expected.tolist()
    assert second.hsd_stats.hierarchies[0].choice == left  # no decision before its first round
    assert all(round_ > 0 for round_, _, _ in control.decisions[decided:])


@pytest.mark.hf
def test_adapt_true_chooses_up_to_the_block_size_the_pick_was_selected_from() -> None:
    """A pick selected with ``max_T=12`` (its profile says so) whose T is 11: ``adapt=True`` starts
    there and its controller chooses up to 12, not up to the default 8 (which refused the pick)."""
    target = tiny_model("llama")
    (draft,) = derived_drafts(target, 1)
    costs = [AffineCost(1e-3, 1e-5), AffineCost(4e-3, 4e-5)]
    prior = [[1.0, 0.95], [0.95, 1.0]]
    profile = Profile.of([draft, target], costs, prior, max_T=12)
    pick = hsd_fast.Hierarchy(
        drafts=(draft,), T=(11,), selection=Selection((0, 1), (11,), 1.0), profile=profile
    )
    ids = torch.randint(3, target.config.vocab_size, (1, 8), generator=torch.Generator().manual_seed(5))
    expected = target.generate(ids, do_sample=False, max_new_tokens=24)
    out = target.generate(
        ids, custom_generate=hsd_fast.generate, hierarchy=pick, adapt=True, do_sample=False,
        max_new_tokens=24, compile=False, output_hsd_stats=True,
    )  # fmt: skip
    assert out.sequences.tolist() == expected.tolist()
    assert out.hsd_stats.hierarchies[0].choice == Choice((0,), (11,))
    assert LatencyController.kept_for(pick, [draft], max_T=12).wall > 0  # the controller that ran
    # a controller from the pick's profile, given as the policy: up to the profile's max_T too
    deep = LatencyController.from_hierarchy(pick, [draft])
    again = target.generate(
        ids, custom_generate=hsd_fast.generate, hierarchy=pick, adapt=deep, do_sample=False,
        max_new_tokens=24, compile=False,
    )  # fmt: skip
    assert deep.max_T == 12 and deep.wall > 0 and again.tolist() == expected.tolist()


def test_a_request_with_other_rows_decides_before_its_first_round() -> None:
    """The batch changes what a lookup level's verification pads to and what each step costs:
    a request with another number of rows is decided afresh, and looks from ``every`` again."""
    control = LatencyController(COSTS, alpha(0.95), every=2, margin=10.0, decide_share=math.inf)
    intervals_while_holding(control, round_seconds=5e-3)
    decided = len(control.decisions)
    wider = replace(seen(0, None), committed=np.array([100, 100]), finished=np.array([False, False]))
    control(wider)
    assert len(control.decisions) == decided + 1 and control.estimates.rows == 2 and control.look_every == 2


def test_a_batch_is_priced_at_the_pace_of_its_slowest_row() -> None:
    """Rows that accept apart (``spread``): with one row, or rows alike, the draft the target accepts
    at 0.8 is chosen (under the lookup level); at 16 rows whose rates spread by 2 in log-odds the
    batch waits for a row that accepts far less, and the lookup level alone is chosen instead. The
    prediction is the recursion at the slowest row's rates."""

    def first_choice(rows: int, spread: list | None) -> tuple[Choice, LatencyController]:
        control = LatencyController(COSTS, alpha(0.8), every=1, decide_share=math.inf, spread=spread)
        look = replace(
            seen(0, None), committed=np.full(rows, 100), finished=np.zeros(rows, dtype=bool),
            tokens=torch.zeros(rows, 1, dtype=torch.int64),
        )  # fmt: skip
        return control(look), control

    apart = [[0.0 if i == j or 0 in (i, j) else 2.0 for j in range(4)] for i in range(4)]  # not the lookup
    assert 1 in first_choice(1, apart)[0].drafts
    assert 1 in first_choice(16, None)[0].drafts
    paced, control = first_choice(16, apart)
    assert paced.drafts == (0,), paced  # the lookup level alone
    draft = Choice((1,), (4,))
    slowest = row_rate(0.8, 2.0, slowest_row_z(16))
    assert slowest < 0.3
    expected = expected_latency([COSTS[1], COSTS[3]], [slowest], [4])
    assert control.modelled(draft, control.estimates.costs(), control.estimates.alpha()) == pytest.approx(
        expected
    )
    assert any("slowest of 16 rows" in line for line in control.describe(["l", "a", "b", "t"]))
    # the lookup level's rows (ProposalRows) as their log-odds spread
    rows = ProposalRows(((1.0, 0.0),), ((0.5,),), sigma=2.0)
    with_rows = [
        [rows if 0 in (i, j) and i != j else s for j, s in enumerate(line)] for i, line in enumerate(apart)
    ]
    assert LatencyController(COSTS, alpha(0.8), spread=with_rows).spread == [
        [2.0 * (i != j) for j in range(4)] for i in range(4)
    ]
    with pytest.raises(ValueError, match="spread matrix must be 4 x 4"):
        LatencyController(COSTS, alpha(), spread=[[0.0] * 3] * 3)


def test_the_slowest_of_many_rows_lies_further_out() -> None:
    zs = [slowest_row_z(rows) for rows in (1, 2, 4, 16, 64)]
    assert zs[0] == 0.0 and all(b < a for a, b in itertools.pairwise(zs))
    assert zs[3] == pytest.approx(-1.766, abs=0.01)  # the expected smallest of 16 standard normals


def test_a_lookups_replays_at_each_block_size_price_the_controllers_choices() -> None:
    """The prior's lookup rates at each T (``DepthRates``) price the controller's choices as they
    priced the selector's, the level's cost scaled or not."""
    rates = DepthRates((0.6, 0.8), {1: ((0.3, 0.7), (0.9,))})
    matrix = alpha()
    for i in range(1, 4):
        matrix[0][i] = matrix[i][0] = rates
    control = LatencyController(COSTS, matrix, every=1)
    assert all(control.estimates.alpha()[0][j].at == rates.at for j in (1, 2, 3))
    # a level's cost once its steps were timed (``costs``): scaled, and still replayed at each T
    scaled = [Scaled(COSTS[0], 3.0), COSTS[3]]
    own = [Scaled(replace(COSTS[0], lengths=(0.3, 0.7)), 3.0), COSTS[3]]
    assert expected_latency(scaled, [rates], [1]) == expected_latency(own, [(0.9,)], [1])


# a lookup replayed at T = 1, 2, 3 and at the largest, 4 (``COSTS[0]``'s lengths): a run at 2 whose
# counts are what the replay at 2 expects (its 4 calls cut at 2; 4 trials at position 1, 3 passed,
# 3 at position 2, 2 passed)
AT_EACH_T = {
    1: ((0.2, 0.8), (0.6,)),
    2: ((0.0, 0.0, 1.0), (0.75, 2 / 3)),
    3: ((0.2, 0.3, 0.1, 0.4), (0.95, 0.9, 0.85)),
}
RUN_AT_2 = dict(verified=[[2, 2, 2, 2]], accepted=[[0, 1, 2, 2]], sizes=[[], []], seconds=[[], []])


def lookup_replayed_at_each_T() -> LatencyController:
    matrix = alpha()
    for j in (1, 2, 3):
        matrix[0][j] = DepthRates((0.9, 0.9, 0.9, 0.9), AT_EACH_T)  # the largest T's: 0.9 each
    return LatencyController(COSTS, matrix, every=1)


def test_a_run_at_one_block_size_moves_the_others_by_its_surplus_over_its_own_replay() -> None:
    """The run's counts at T = 2 carried to every T's replay (``depth_counts``): counts that are
    what the replay at 2 expects leave every T as replayed (taking the run's rates for every T, as
    the replay at the largest T corrected by the counts did, priced a deep block from where a run
    at 2 calls); at T = 2 the estimate is the counts on top of that replay as a prior."""
    control = lookup_replayed_at_each_T()
    control.learn(seen(1, Choice((0,), (2,)), **RUN_AT_2))
    carried = control.estimates.alpha()[0][3]
    assert isinstance(carried, DepthRates)
    for T in (1, 2, 3):  # at 2: the counts are what its replay expects; at 3: not the run's 0.75, 0.67
        assert carried.at[T][0] == pytest.approx(AT_EACH_T[T][0])
        assert carried.at[T][1] == pytest.approx(AT_EACH_T[T][1])
    assert tuple(carried) == pytest.approx((0.9, 0.9, 0.9, 0.9))
    assert control.estimates.lengths(0) == pytest.approx(COSTS[0].lengths)
    assert control.estimates.alpha()[0][1].at[3][1] == pytest.approx(
        AT_EACH_T[3][1]
    )  # a pair that did not run

    # a run that accepts less than its replay expects: each T's rate at position 1 falls by the
    # surplus over its pseudo-trials; at T = 2 rates and lengths are the counts on its replay's
    worse = lookup_replayed_at_each_T()
    worse.learn(seen(1, Choice((0,), (2,)), **{**RUN_AT_2, "accepted": [[0, 0, 0, 0]]}))
    carried = worse.estimates.alpha()[0][3]
    for T, (lengths, rates) in {**AT_EACH_T, 4: (COSTS[0].lengths, (0.9,) * 4)}.items():
        weight = PRIOR_TOKENS * estimates_module._reached(rates, lengths)[0]
        own = carried.at[T][1] if T < 4 else carried
        assert own[0] == pytest.approx(max(rates[0] - 3 / (4 + weight), 0.0))
    lengths, rates = AT_EACH_T[2]
    counted = estimates_module._per_position(rates, lengths, np.array([0.0, 0.0]), np.array([4.0, 0.0]))
    assert carried.at[2][1] == pytest.approx(counted)  # at the T that ran: the counts on its replay
    calls = np.array([[0, 0, 0, 0, 0], [0, 0, 4, 0, 0.0]])
    assert carried.at[2][0] == pytest.approx(estimates_module._product_limit(lengths, calls[:, :3]))


def test_counts_at_the_largest_block_size_are_added_to_its_replay_as_before() -> None:
    """A run at the profile's largest T: its lengths and rates are the counts on that replay as a
    prior (the product-limit lengths, the pooled trials per position), as with one replay."""
    control = lookup_replayed_at_each_T()
    control.learn(
        seen(1, Choice((0,), (4,)), verified=[[0, 1, 4, 4, 3]], accepted=[[0, 1, 2, 4, 1]], sizes=[[], []],
             seconds=[[], []])
    )  # fmt: skip
    calls = np.array([[1, 1, 0, 1, 0], [0, 0, 0, 0, 2.0]])
    assert control.estimates.lengths(0) == pytest.approx(
        estimates_module._product_limit(COSTS[0].lengths, calls)
    )
    passed, tried = estimates_module._trials(np.array([0, 1, 4, 4, 3]), np.array([0, 1, 2, 4, 1]))
    one_replay = estimates_module._per_position((0.9,) * 4, COSTS[0].lengths, passed, tried)
    assert tuple(control.estimates.alpha()[0][3]) == pytest.approx(one_replay)


def test_the_first_look_holds_the_hierarchy_the_run_started_from() -> None:
    """A run started from a hierarchy (a pick) shows it at the first look: the controller holds it
    as a choice of its own, left only for one predicted faster by the margin, not for the model's
    best outright (the selector may have chosen it over one predicted a little faster)."""
    fresh = LatencyController(COSTS, alpha(), every=1)
    best = fresh(seen(0, None))  # nothing ran: the model's own best
    costs, rates = fresh.estimates.costs(), fresh.estimates.alpha()
    seconds = {c: fresh.predicted(c, costs, rates) for c in fresh._neighbours(best) if c != best}
    close = min(seconds, key=seconds.get)  # the next best, within the margin of the best
    far = max(seconds, key=seconds.get)
    assert (
        (1 - fresh.margin) * seconds[close]
        < fresh.predicted(best, costs, rates)
        < (1 - fresh.margin) * seconds[far]
    )
    for start, expected in ((close, close), (far, best)):
        control = LatencyController(COSTS, alpha(), every=1)
        assert control(seen(1, start)) == expected
