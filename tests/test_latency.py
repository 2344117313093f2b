"""The latency model: the exact recursion against Monte Carlo of the same control flow, Leviathan
et al.'s closed form at K = 1, and the a -> 1 limits."""

import copy
import pickle
import random
from dataclasses import replace

import pytest

from hsd_fast.latency import (
    AffineCost,
    DepthRates,
    LaterCalls,
    LookupCost,
    at_block_size,
    expected_gain,
    expected_latency,
    fixed_block_latency,
    gain_probs,
    simulate,
)


@pytest.mark.parametrize("a", [0.0, 0.3, 0.8, 0.99])
@pytest.mark.parametrize("gamma", [1, 3, 6])
def test_k1_is_leviathans_formula(a: float, gamma: int) -> None:
    c = 0.07  # draft cost relative to the target's
    costs = [AffineCost(c), AffineCost(1.0)]
    speedup = 1.0 / expected_latency(costs, [a], [gamma])
    assert speedup == pytest.approx((1 - a ** (gamma + 1)) / ((1 - a) * (gamma * c + 1)), rel=1e-12)
    assert fixed_block_latency(costs, [a], [gamma]) == pytest.approx(1.0 / speedup, rel=1e-12)


def _random_instance(rng: random.Random, k: int):
    fixed = sorted(rng.uniform(0.01, 1.0) for _ in range(k + 1))
    costs = [AffineCost(f, rng.uniform(0.0, 0.2) * f) for f in fixed]
    alphas = [rng.uniform(0.3, 0.95) for _ in range(k)]
    T = [rng.randint(1, 4) for _ in range(k)]
    return costs, alphas, T


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_exact_latency_matches_monte_carlo(k: int) -> None:
    rng = random.Random(k)
    for trial in range(3):
        costs, alphas, T = _random_instance(rng, k)
        exact = expected_latency(costs, alphas, T)
        mc, stderr = simulate(costs, alphas, T, rounds=20_000, seed=trial)
        assert abs(exact - mc) < 4 * stderr, (costs, alphas, T, exact, mc, stderr)


def test_fixed_block_form_differs_from_exact_beyond_k1() -> None:
    """The decomposable form is an approximation once a level returns a random block."""
    costs, alphas, T = _random_instance(random.Random(7), 2)
    assert fixed_block_latency(costs, alphas, T) != pytest.approx(
        expected_latency(costs, alphas, T), rel=1e-6
    )


def test_acceptance_one_is_the_limit() -> None:
    assert expected_gain(1.0, 5) == 6.0
    assert expected_gain(1 - 1e-9, 5) == pytest.approx(6.0, rel=1e-6)
    costs = [AffineCost(0.01), AffineCost(0.1, 0.01), AffineCost(1.0, 0.02)]
    at_one = expected_latency(costs, [1.0, 1.0], [3, 4])
    assert at_one == pytest.approx(expected_latency(costs, [1 - 1e-9, 1 - 1e-9], [3, 4]), rel=1e-6)
    # a = 1: level 1 verifies 3 drafts and gains 4 per call, returns 4 after one call; the target gains 5
    expected = (3 * 0.01 + costs[1](4) + costs[2](5)) / 5
    assert at_one == pytest.approx(expected, rel=1e-12)


def test_autoregressive_is_one_forward_per_token() -> None:
    assert expected_latency([AffineCost(0.5, 0.1)], [], []) == pytest.approx(0.6)


@pytest.mark.parametrize(
    ("alphas", "T", "match"), [([0.5], [], "block sizes"), ([1.5], [2], r"\[0, 1\]"), ([0.5], [0], ">= 1")]
)
def test_bad_inputs(alphas, T, match) -> None:
    with pytest.raises(ValueError, match=match):
        expected_latency([AffineCost(0.1), AffineCost(1.0)], alphas, T)


# ----------------------------------------------------------------------------- a lookup level
def _lookup(rng: random.Random, max_len: int = 6) -> LookupCost:
    weights = [rng.random() for _ in range(max_len + 1)]
    return LookupCost(rng.uniform(1e-4, 1e-3), tuple(w / sum(weights) for w in weights))


def _rates(rng: random.Random) -> tuple[float, ...]:
    return tuple(rng.uniform(0.3, 0.95) for _ in range(rng.randint(1, 4)))


def test_per_position_rates_give_the_gain_of_their_product() -> None:
    rates = (0.9, 0.5, 0.2)
    # P(A >= 1) = .9, P(A >= 2) = .45, P(A >= 3) = .09, then .2 per further position
    assert expected_gain(rates, 4) == pytest.approx(1 + 0.9 + 0.45 + 0.09 + 0.018)
    assert expected_gain((0.7, 0.7), 5) == pytest.approx(expected_gain(0.7, 5))
    assert sum(g * p for g, p in enumerate(gain_probs(rates, 4), start=1)) == pytest.approx(
        expected_gain(rates, 4)
    )


def test_a_lookup_block_is_its_lengths_cut_at_T() -> None:
    lookup = LookupCost(1e-4, (0.5, 0.1, 0.1, 0.3))  # 30 %: 3 or more tokens offered
    assert lookup.block(2) == pytest.approx({0: 0.5, 1: 0.1, 2: 0.4})
    assert lookup.block(5) == pytest.approx({0: 0.5, 1: 0.1, 2: 0.1, 3: 0.3})


@pytest.mark.parametrize("k", [1, 2, 3])
def test_exact_latency_with_a_lookup_level_matches_monte_carlo(k: int) -> None:
    rng = random.Random(100 + k)
    for trial in range(3):
        costs, alphas, T = _random_instance(rng, k)
        costs = [_lookup(rng), *costs[1:]]
        alphas = [_rates(rng), *alphas[1:]]
        exact = expected_latency(costs, alphas, T)
        mc, stderr = simulate(costs, alphas, T, rounds=20_000, seed=trial)
        assert abs(exact - mc) < 4 * stderr, (costs, alphas, T, exact, mc, stderr)


@pytest.mark.parametrize("k", [2, 3])
def test_a_lookups_later_calls_under_a_middle_model_match_monte_carlo(k: int) -> None:
    """Level 1's first call of a run draws the lookup's own lengths and rate, the later ones
    ``LaterCalls``' (docs/design.md, "Tokens that came through", *First and later calls*)."""
    rng = random.Random(200 + k)
    for trial in range(3):
        costs, alphas, T = _random_instance(rng, k)
        lookup = _lookup(rng)
        later = LaterCalls(_lookup(rng).lengths, _rates(rng))
        costs = [replace(lookup, later=later, rows=1 + trial), *costs[1:]]
        alphas = [_rates(rng), *alphas[1:]]
        T[1] = rng.randint(3, 6)  # runs of several calls
        exact = expected_latency(costs, alphas, T)
        mc, stderr = simulate(costs, alphas, T, rounds=20_000, seed=trial)
        assert abs(exact - mc) < 4 * stderr, (costs, alphas, T, exact, mc, stderr)
        alike = expected_latency([replace(lookup, rows=1 + trial), *costs[1:]], alphas, T)
        assert exact != pytest.approx(alike, rel=1e-3)  # the later calls count
        same = LaterCalls(lookup.lengths, alphas[0])  # later calls like the first: the model as before
        assert expected_latency([replace(costs[0], later=same), *costs[1:]], alphas, T) == pytest.approx(
            alike
        )


def test_later_calls_that_offer_nothing_leave_the_middle_model_drafting() -> None:
    """A run's first call offers 2 tokens, both kept; the later ones offer nothing: the middle model
    verifies one token of its own on each (its draft), until its run gains T_1 = 5: the first gains
    3, then two later calls gain 1 each."""
    costs = [
        LookupCost(1e-4, (0.0, 0.0, 1.0), later=LaterCalls((1.0, 0.0, 0.0), (0.5,))),
        AffineCost(0.01, 0.001),
        AffineCost(1.0, 0.01),
    ]
    latency = expected_latency(costs, [(1.0,), 1.0], [2, 5])
    middle = 3 * 1e-4 + costs[1](3) + 2 * costs[1](1)  # three calls: one verification of 2, two of 0
    assert latency == pytest.approx((middle + costs[2](6)) / 6)


def test_a_lookup_that_never_matches_is_decoding_by_the_level_above() -> None:
    """Nothing proposed: every call costs the host's seconds and level 1 emits one token per
    verification of nothing, an ordinary decoding step."""
    never = LookupCost(1e-4, (1.0,))
    target = AffineCost(0.5, 0.1)
    assert expected_latency([never, target], [(0.9,)], [4]) == pytest.approx(1e-4 + target(1))
    assert fixed_block_latency([never, target], [(0.9,)], [4]) == pytest.approx(1e-4 + target(1))


def test_a_lookup_level_only_at_the_bottom() -> None:
    lookup = LookupCost(1e-4, (0.5, 0.5))
    with pytest.raises(ValueError, match="level 0"):
        expected_latency([AffineCost(0.01), lookup, AffineCost(1.0)], [0.5, 0.5], [2, 2])
    with pytest.raises(ValueError, match="cannot decode"):
        expected_latency([lookup], [], [])
    with pytest.raises(ValueError, match="sum to 1"):
        LookupCost(1e-4, (0.5, 0.2))
    with pytest.raises(ValueError, match="one row"):
        LookupCost(1e-4, (0.5, 0.5), rows=0)


# ----------------------------------------------------------------------------- a batch of rows
def test_a_batch_pads_a_lookup_verification_to_its_widest_row() -> None:
    """Two rows, each offered 0 or 1 token with even odds: the widest is 0 only if both are."""
    lookup = LookupCost(1e-4, (0.5, 0.5), rows=2)
    assert lookup.block(4) == pytest.approx({0: 0.5, 1: 0.5})  # a row's own block is unchanged
    assert lookup.padded_block(4) == pytest.approx({0: 0.25, 1: 0.75})
    spread = LookupCost(1e-4, (0.5, 0.1, 0.1, 0.3), rows=3)
    widest = spread.padded_block(2)
    assert sum(widest.values()) == pytest.approx(1.0) and widest[0] == pytest.approx(0.5**3)
    assert LookupCost(1e-4, (0.5, 0.1, 0.1, 0.3)).padded_block(2) == pytest.approx({0: 0.5, 1: 0.1, 2: 0.4})


@pytest.mark.parametrize("k", [1, 2])
def test_exact_latency_of_a_padded_batch_matches_monte_carlo(k: int) -> None:
    """The Monte Carlo draws the other rows' blocks and pads the verification to the widest."""
    rng = random.Random(200 + k)
    for trial in range(3):
        costs, alphas, T = _random_instance(rng, k)
        one_row = _lookup(rng)
        padded = LookupCost(one_row.seconds, one_row.lengths, rows=4)
        alphas = [_rates(rng), *alphas[1:]]
        exact = expected_latency([padded, *costs[1:]], alphas, T)
        mc, stderr = simulate([padded, *costs[1:]], alphas, T, rounds=20_000, seed=trial)
        assert abs(exact - mc) < 4 * stderr, (costs, alphas, T, exact, mc, stderr)
        # padding costs only where a fed token does
        assert exact > expected_latency([one_row, *costs[1:]], alphas, T)
        flat = [AffineCost(c.fixed) for c in costs[1:]]
        assert expected_latency([padded, *flat], alphas, T) == pytest.approx(
            expected_latency([one_row, *flat], alphas, T), rel=1e-12
        )


def _replayed_at_each_T() -> tuple[LookupCost, DepthRates]:
    """A lookup level replayed at T = 4 (the tuple: matches of 4 taken at 0.5 a position) and at
    T = 2, where its calls sit elsewhere (more matches, taken at 0.9)."""
    lookup = LookupCost(1e-4, (0.5, 0.0, 0.0, 0.0, 0.5))
    return lookup, DepthRates((0.5, 0.5, 0.5, 0.5), {2: ((0.2, 0.0, 0.8), (0.9, 0.9))})


def test_a_lookup_replayed_at_each_block_size_is_priced_from_its_own_replay() -> None:
    """``DepthRates``: at a T it was replayed at, the model (exact recursion, decomposable form, Monte
    Carlo) prices that replay's lengths and rates; elsewhere the tuple's; copies keep the replays."""
    lookup, rates = _replayed_at_each_T()
    target = AffineCost(1e-2, 1e-3)
    own = [replace(lookup, lengths=(0.2, 0.0, 0.8)), target], [(0.9, 0.9)]
    for latency in (expected_latency, fixed_block_latency):
        assert latency([lookup, target], [rates], [2]) == pytest.approx(latency(*own, [2]), rel=1e-12)
        assert latency([lookup, target], [rates], [3]) == latency([lookup, target], [tuple(rates)], [3])
    assert expected_latency([lookup, target], [rates], [2]) < expected_latency(
        [lookup, target], [tuple(rates)], [2]
    )
    assert simulate([lookup, target], [rates], [2], rounds=4000) == simulate(*own, [2], rounds=4000)
    for copied in (copy.deepcopy(rates), pickle.loads(pickle.dumps(rates))):
        assert copied == rates and copied.at == rates.at
    costs, alphas = at_block_size([lookup, target], [rates], [2])
    assert costs[0].lengths == (0.2, 0.0, 0.8) and alphas == [(0.9, 0.9)] and type(alphas[0]) is tuple
