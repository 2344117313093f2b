"""The hierarchy selector: its DP equals brute force under the decomposable form, its pick is never
predicted slower than autoregressive decoding or the best single draft, and its regret under the
exact recursion is bounded."""

import itertools
import random

import pytest

from hsd_fast.latency import AffineCost, DepthRates, LookupCost, expected_latency, fixed_block_latency
from hsd_fast.selector import fixed_block_candidates, select

MAX_T = 4


def _instance(seed: int, n: int = 4):
    rng = random.Random(seed)
    fixed = [*sorted(rng.uniform(0.005, 1.0) for _ in range(n - 1)), 1.0]
    costs = [AffineCost(f, rng.uniform(0.0, 0.1) * f) for f in fixed]
    alpha = [[1.0] * n for _ in range(n)]
    for i, j in itertools.combinations(range(n), 2):
        # closer in size, closer in distribution (plus noise), symmetric
        alpha[i][j] = alpha[j][i] = min(0.98, max(0.05, 1 - abs(fixed[i] - fixed[j]) * rng.uniform(0.3, 1.2)))
    return costs, alpha


def _all_chains(costs, alpha, form, lookup: bool = False):
    """(latency, drafts, T) of every chain under the selector's candidate rule: drafts cheaper than
    the target, stacked in cost order; ``lookup``: candidate 0 is a lookup level, at the bottom or
    absent."""
    target = len(costs) - 1
    first = 1 if lookup else 0
    drafts = sorted(
        (m for m in range(first, target) if costs[m](1) < costs[target](1)), key=lambda m: costs[m](1)
    )
    for bottom in ((), (0,)) if lookup else ((),):
        for r in range(len(drafts) + 1):
            for subset in itertools.combinations(drafts, r):
                chain = [*bottom, *subset, target]
                for T in itertools.product(range(1, MAX_T + 1), repeat=len(chain) - 1):
                    alphas = [alpha[a][b] for a, b in itertools.pairwise(chain)]
                    yield form([costs[m] for m in chain], alphas, list(T)), tuple(chain[:-1]), T


@pytest.mark.parametrize(
    ("seed", "lookup"), [*((s, False) for s in range(6)), *((s, True) for s in range(4))]
)
def test_dp_equals_brute_force_under_the_decomposable_form(seed: int, lookup: bool) -> None:
    costs, alpha = _with_lookup(seed) if lookup else _instance(seed)
    dp_best = fixed_block_candidates(costs, alpha, max_T=MAX_T, keep=1)[0][0]
    brute = min(lat for lat, _, _ in _all_chains(costs, alpha, fixed_block_latency, lookup))
    assert dp_best == pytest.approx(brute, rel=1e-12)


@pytest.mark.parametrize("seed", range(6))
def test_never_slower_than_ar_or_the_best_single_draft(seed: int) -> None:
    costs, alpha = _instance(seed)
    pick = select(costs, alpha, max_T=MAX_T)
    singles = [lat for lat, subset, _ in _all_chains(costs, alpha, expected_latency) if len(subset) <= 1]
    assert pick.predicted_latency <= min(singles) * (1 + 1e-12)
    assert pick.speedup_over_ar >= 1.0 and pick.speedup_over_best_single >= 1.0
    assert pick.chain[-1] == len(costs) - 1 and len(pick.T) == len(pick.chain) - 1


REGRET_BOUND = 0.005  # measured: worst 0.16 % over 300 random 4-candidate instances, 0 over 20 with 6


@pytest.mark.parametrize("seed", range(12))
def test_regret_under_the_exact_form_is_bounded(seed: int) -> None:
    costs, alpha = _instance(seed)
    pick = select(costs, alpha, max_T=MAX_T)
    best = min(lat for lat, _, _ in _all_chains(costs, alpha, expected_latency))
    assert pick.predicted_latency <= best * (1 + REGRET_BOUND)


def test_prefers_a_deeper_hierarchy_when_it_pays() -> None:
    """A tiny draft that agrees well with a mid-size one, and a mid-size one that agrees well with
    the target: stacking both beats either alone."""
    costs = [AffineCost(0.002), AffineCost(0.05), AffineCost(1.0)]
    alpha = [[1.0, 0.85, 0.5], [0.85, 1.0, 0.9], [0.5, 0.9, 1.0]]
    pick = select(costs, alpha, max_T=6)
    assert pick.chain == (0, 1, 2)
    assert pick.speedup_over_best_single > 1.0


def test_bad_alpha_matrix() -> None:
    with pytest.raises(ValueError, match="alpha"):
        select([AffineCost(0.1), AffineCost(1.0)], [[1.0]])


def test_ends_when_a_noisy_profile_predicts_negative_latencies() -> None:
    """A cost model that predicts negative latencies (least squares on a busy machine did) must not
    hang the T search (it once cycled forever: ``lat < best * (1 - eps)`` holds for equal negative
    latencies)."""
    import signal

    def too_slow(*_):
        raise TimeoutError("select did not end")

    previous = signal.signal(signal.SIGALRM, too_slow)
    signal.alarm(20)
    try:
        # AffineCost refuses negative parameters; a cost is any callable, so a bad one can still come in
        costs = [lambda n, f=f, p=p: f + p * n for f, p in ((0.01, -0.02), (0.02, -0.05), (1.0, -0.3))]
        pick = select(costs, [[1.0, 0.8, 0.6], [0.8, 1.0, 0.7], [0.6, 0.7, 1.0]], max_T=6)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert pick.chain[-1] == 2


# ----------------------------------------------------------------------------- a lookup candidate
def _with_lookup(seed: int, n: int = 4):
    """A random instance with a lookup level as candidate 0: host seconds far below any forward, a
    random distribution of offered lengths, per-position acceptance rates towards every model."""
    rng = random.Random(1000 + seed)
    costs, alpha = _instance(seed, n)
    weights = [rng.random() for _ in range(MAX_T + 2)]
    lookup = LookupCost(rng.uniform(1e-4, 2e-3), tuple(w / sum(weights) for w in weights))
    rates = [tuple(rng.uniform(0.2, 0.95) for _ in range(3)) for _ in range(n)]
    alpha = [[1.0, *rates], *([rates[i], *row] for i, row in enumerate(alpha))]
    return [lookup, *costs], alpha


@pytest.mark.parametrize("seed", range(4))
def test_a_lookup_candidate_is_only_ever_level_zero(seed: int) -> None:
    costs, alpha = _with_lookup(seed)
    pick = select(costs, alpha, max_T=MAX_T)
    best = min(lat for lat, _, _ in _all_chains(costs, alpha, expected_latency, lookup=True))
    assert pick.predicted_latency <= best * (1 + REGRET_BOUND)
    for selection in (pick, *pick.runner_ups):
        assert 0 not in selection.chain[1:], selection.chain


def test_picks_the_lookup_level_where_text_repeats_and_not_where_it_never_matches() -> None:
    """A lookup that offers 4+ tokens most of the time, accepted at 80 %, stacked under a cheap
    draft; and the same hierarchy where the lookup never matches: then it only costs host time."""
    costs = [AffineCost(0.02), AffineCost(1.0)]
    alpha = [[1.0, 0.7], [0.7, 1.0]]
    matching = LookupCost(1e-4, (0.2, 0.0, 0.0, 0.0, 0.8))
    rates = (0.8, 0.8)
    pick = select([matching, *costs], [[1.0, rates, rates], [rates, *alpha[0]], [rates, *alpha[1]]], max_T=6)
    assert pick.chain[0] == 0
    never = LookupCost(1e-3, (1.0,))
    pick = select([never, *costs], [[1.0, rates, rates], [rates, *alpha[0]], [rates, *alpha[1]]], max_T=6)
    assert pick.chain == (1, 2)


def test_a_batch_drops_a_lookup_level_whose_padding_costs_more_than_it_gains() -> None:
    """A lookup that offers 4 tokens 40 % of the time, nothing otherwise, under a target whose cost
    is mostly per fed token: one row verifies 5 tokens only when offered them, and the lookup pays;
    in a batch of 16 some row almost always is, every verification feeds 5, and plain decoding
    wins. The DP and the exact rescoring both see the padding (the pick is no worse than brute
    force)."""
    target = AffineCost(1.0, 1.0)
    rates = (0.9,)
    alpha = [[1.0, rates], [rates, 1.0]]
    for rows, drafts in ((1, 1), (16, 0)):
        costs = [LookupCost(1e-4, (0.6, 0.0, 0.0, 0.0, 0.4), rows=rows), target]
        pick = select(costs, alpha, max_T=MAX_T)
        assert len(pick.chain) - 1 == drafts, (rows, pick)
        best = min(lat for lat, _, _ in _all_chains(costs, alpha, expected_latency, lookup=True))
        assert pick.predicted_latency <= best * (1 + REGRET_BOUND)


def test_a_lookup_replayed_at_each_block_size_is_chosen_by_its_own_replays() -> None:
    """The lookup's replay at T = 4 prices T = 2 as its calls sit at 4 (taken at 0.5); its replay
    at 2 (``DepthRates``) takes them at 0.9: the pick follows the replay of each T."""
    lookup = LookupCost(1e-4, (0.5, 0.0, 0.0, 0.0, 0.5))
    rates = DepthRates((0.5, 0.5, 0.5, 0.5), {2: ((0.2, 0.0, 0.8), (0.9, 0.9))})
    costs = [lookup, AffineCost(1e-2, 1e-3)]
    assert select(costs, [[1.0, rates], [rates, 1.0]], max_T=4).T == (2,)
    one_replay = select(costs, [[1.0, tuple(rates)], [tuple(rates), 1.0]], max_T=4)
    assert one_replay.T != (2,)
