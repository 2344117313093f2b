"""The latency-optimal hierarchy: which drafts to stack and each level's block size T
(docs/design.md, "The latency model and the selector"). Pure arithmetic over candidate indices:
the models themselves are bound to a selection in the API layer (``hsd_fast.hierarchy``). Its answer,
a ``Selection``, is plain data in ``hsd_fast.hierarchy_types``.

Under the fixed-block (decomposable) form, producing T tokens at model m on top of (m', T') costs

    V(m, T) = T / g(alpha(m', m), T') * (c_m(T' + 1) + V(m', T')),      V(m, T) = d_m(T) at level 0

with c_m(n) a verification step over n tokens and d_m(T) a step that drafts T tokens: a
generalized shortest path over nodes (model, T) with models in cost order. A lookup level (its cost
a ``LookupCost``) can only be level 0: its block is random, so g and c_m(T' + 1) above it are
averaged over its block sizes. A k-best DP keeps the
``keep`` cheapest chains (of different models) per node; the best few at the target, autoregressive
decoding and every single-draft configuration get their T's polished by coordinate descent on the
exact recursion (``latency.expected_latency``) and are ranked by it, so the pick is never predicted
slower than AR or the best single draft.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from hsd_fast.hierarchy_types import DEFAULT_MAX_T, Selection
from hsd_fast.latency import (
    Acceptance,
    Cost,
    Through,
    at_block_size,
    block_sizes,
    chain_rates,
    decode_seconds,
    draft_seconds,
    expected_gain,
    expected_latency,
    first_verify_seconds,
    mean_gain,
    verifying_costs,
)


def select(
    costs: Sequence[Cost],
    alpha: Sequence[Sequence[Acceptance]],
    max_T: int = DEFAULT_MAX_T,
    keep: int = 4,
    rescore: int = 16,
    through: Through | None = None,
) -> Selection:
    """Best hierarchy over candidates 0..n-1 (the last is the target) given per-model costs and the
    symmetric pairwise acceptance matrix ``alpha`` (a lookup candidate's entries per position, see
    ``latency.Acceptance``; ``through``: the rates at which a model takes the proposals the model under
    it passed, ``latency.chain_rates``). Candidates are taken in cost order c(1), a lookup level
    first."""
    n = len(costs)
    if n < 1 or len(alpha) != n or any(len(row) != n for row in alpha):
        raise ValueError(f"need n >= 1 costs and an n x n alpha matrix, got {n} costs")
    target = n - 1
    drafts = _drafts_in_cost_order(costs)
    finals = fixed_block_candidates(costs, alpha, max_T, keep, through)
    shortlisted = {chain for _, chain in finals[:rescore]}
    shortlisted |= {((m, t),) for m in drafts for t in _block_sizes_of(costs[m], max_T)} | {()}  # + AR

    # The decomposable form ranks T's a little differently from the exact recursion: polish each
    # shortlisted chain's T by coordinate descent on the exact latency.
    refined = {_refine_T(costs, alpha, chain, target, max_T, through) for chain in shortlisted}
    scored = sorted((_exact(costs, alpha, chain, target, through), chain) for chain in refined)
    ar = decode_seconds(costs[target])
    best_single = min(lat for lat, chain in scored if len(chain) == 1) if drafts else ar
    hierarchies = [
        Selection(
            chain=(*(m for m, _ in chain), target),
            T=tuple(t for _, t in chain),
            predicted_latency=lat,
            speedup_over_ar=ar / lat,
            speedup_over_best_single=best_single / lat,
        )
        for lat, chain in scored
    ]
    first, runner_ups = hierarchies[0], hierarchies[1:6]
    # AR and the best single draft are the baselines every report compares with: always listed.
    baselines = [next((h for h in hierarchies if len(h.chain) == k), None) for k in (1, 2)]
    runner_ups += [h for h in baselines if h is not None and h is not first and h not in runner_ups]
    return Selection(
        first.chain,
        first.T,
        first.predicted_latency,
        first.speedup_over_ar,
        first.speedup_over_best_single,
        runner_ups=tuple(runner_ups),
    )


def fixed_block_candidates(
    costs: Sequence[Cost],
    alpha: Sequence[Sequence[Acceptance]],
    max_T: int = DEFAULT_MAX_T,
    keep: int = 4,
    through: Through | None = None,
) -> list[tuple[float, tuple[tuple[int, int], ...]]]:
    """The k-best DP: (decomposable latency, chain of (draft, T) smallest first), best first, one
    entry per model chain. The empty chain is autoregressive decoding."""
    target = len(costs) - 1
    drafts = _drafts_in_cost_order(costs)
    # best[(m, T)]: up to `keep` (cost of producing T tokens at m, chain of (model, T) up to m)
    best: dict[tuple[int, int], list[tuple[float, tuple[tuple[int, int], ...]]]] = {}
    for pos, m in enumerate(drafts):
        for t in _block_sizes_of(costs[m], max_T):
            options = [(draft_seconds(costs[m], t), ((m, t),))]
            for below in drafts[:pos] if not level_zero_only(costs[m]) else ():
                for t_below in _block_sizes_of(costs[below], max_T):
                    for value, chain in best[(below, t_below)]:
                        verify, gain = _verify_and_gain(costs, alpha, chain, m, through)
                        options.append((t / gain * (verify + value), (*chain, (m, t))))
            best[(m, t)] = _best_per_model_chain(options, keep)
    finals = [(decode_seconds(costs[target]), ())]
    for entries in best.values():
        for value, chain in entries:
            verify, gain = _verify_and_gain(costs, alpha, chain, target, through)
            finals.append(((verify + value) / gain, chain))
    return _best_per_model_chain(finals, len(finals))


def _verify_and_gain(costs, alpha, chain, m: int, through: Through | None) -> tuple[float, float]:
    """Expected seconds of m's verification of the block ``chain`` returns, and expected gain: the
    block is T' for a chain of models, random for a lookup level alone."""
    below, t_below = chain[-1]
    above = verifying_costs([costs[below], costs[m]])[1]  # from an exit's hidden states, if it is one
    if len(chain) > 2:
        return above(t_below + 1), expected_gain(alpha[below][m], t_below)
    if len(chain) == 2:  # over a level 0: its rate as chain_rates has it (tokens that came through)
        (first, t_first), _ = chain
        rate = chain_rates(costs, alpha, [first, below, m], [t_first, t_below], through)[-1]
        return above(t_below + 1), expected_gain(rate, t_below)
    (level,), (rate,) = at_block_size([costs[below]], [alpha[below][m]], [t_below])
    return first_verify_seconds(above, level, t_below), mean_gain(rate, block_sizes(level, t_below))


def _block_sizes_of(cost: Cost, max_T: int) -> range:
    """The T's worth trying for a candidate: 1..max_T, or only 1 for a token tree (its block is the
    tree, whatever T: every T would score the same)."""
    return range(1, 2) if hasattr(cost, "fed") else range(1, max_T + 1)


def level_zero_only(cost: Cost) -> bool:
    """A level-0-only candidate: a lookup level, or a model drafting a token tree (a cost with its
    own ``block``)."""
    return hasattr(cost, "block")


def _best_per_model_chain(options, keep: int):
    """The ``keep`` best options whose model chains differ (their T's may be tuned later): keeping
    several T-variants of one chain would crowd out other chains the exact form may prefer."""
    by_models: dict[tuple[int, ...], tuple] = {}
    for option in sorted(options):
        by_models.setdefault(tuple(m for m, _ in option[1]), option)
    return sorted(by_models.values())[:keep]


def _drafts_in_cost_order(costs: Sequence[Cost]) -> list[int]:
    """Candidates cheaper than the target, cheapest first (a draft must be cheaper than its
    verifier), a lookup level before every model (it can only be level 0)."""
    target = len(costs) - 1
    cheaper = (m for m in range(target) if costs[m](1) < costs[target](1))
    return sorted(cheaper, key=lambda m: (not level_zero_only(costs[m]), costs[m](1)))


def _refine_T(costs, alpha, chain, target: int, max_T: int, through) -> tuple[tuple[int, int], ...]:
    best, best_lat = chain, _exact(costs, alpha, chain, target, through)
    improved = True
    while improved:
        improved = False
        for level in range(len(best)):
            for t in range(1, max_T + 1):
                trial = tuple((m, t if i == level else old) for i, (m, old) in enumerate(best))
                lat = _exact(costs, alpha, trial, target, through)
                if lat < best_lat - 1e-12 * abs(best_lat):  # strictly better, whatever the sign
                    best, best_lat, improved = trial, lat, True
    return best


def _exact(
    costs: Sequence[Cost], alpha: Sequence[Sequence[Acceptance]], chain, target: int, through: Through | None
) -> float:
    models, T = [m for m, _ in chain] + [target], [t for _, t in chain]
    return expected_latency([costs[m] for m in models], chain_rates(costs, alpha, models, T, through), T)


def prefer_fewer_drafts(selection: Selection, margin: float) -> tuple[Selection, str | None]:
    """``selection`` with the hierarchy of the fewest drafts (one at least) among it and its runner-ups
    whose predicted latency is within ``margin`` of the pick's made the pick, and why (None when the
    pick is kept).

    ``margin`` is the advantage the step costs' noise can resolve: a pick predicted 2 % ahead of a
    chain with one draft fewer, on costs each a few percent uncertain, ranks the two by chance, and
    the chain with fewer drafts holds fewer models, caches and compiled steps (on data tables
    ``lookup > xxs > s`` was predicted 1.03x ahead of ``lookup > s`` within a margin of 9 % and ran
    0.90x it: docs/design.md, "Where the latency model errs"). No-draft decoding is
    ``prefer_no_draft``'s to choose."""
    if len(selection.chain) <= 2 or margin <= 0:
        return selection, None
    within = [
        s
        for s in selection.runner_ups
        if 2 <= len(s.chain) < len(selection.chain)
        and s.predicted_latency <= (1 + margin) * selection.predicted_latency
    ]
    if not within:
        return selection, None
    fewer = min(within, key=lambda s: (len(s.chain), s.predicted_latency))
    drafts = len(fewer.chain) - 1
    reason = (
        f"the best hierarchy's predicted speed-up over one with {drafts} draft{'s' * (drafts > 1)} "
        f"({fewer.predicted_latency / selection.predicted_latency:.3f}x) is within the noise of the measured "
        f"step costs (+-{margin:.1%}): the one with fewer drafts chosen"
    )
    return _promoted(selection, fewer), reason


def prefer_no_draft(selection: Selection, min_gain: float) -> tuple[Selection, str | None]:
    """``selection`` with no-draft decoding (always among its runner-ups) made the pick when the
    pick's predicted speed-up over it is below ``1 + min_gain``, and why (None when it is kept).

    ``min_gain`` is the latency model's own error: a pick predicted 10 % faster than no draft by a
    model that errs by 15 % may well be slower, and a static pick must never lose to plain decoding
    by more than noise (docs/design.md, "Where the latency model errs")."""
    if len(selection.chain) == 1 or selection.speedup_over_ar >= 1 + min_gain:
        return selection, None
    ar = next(s for s in selection.runner_ups if len(s.chain) == 1)
    reason = (
        f"the best hierarchy is predicted {selection.speedup_over_ar:.2f}x no-draft decoding, within the "
        f"latency model's error (+-{min_gain:.0%}): no draft chosen"
    )
    return _promoted(selection, ar), reason


def _promoted(selection: Selection, runner_up: Selection) -> Selection:
    """``runner_up`` (one of ``selection``'s) made the pick: the old pick first among its runner-ups,
    then the others, nothing lost from the list."""
    others = (s for s in selection.runner_ups if s is not runner_up)
    return replace(runner_up, runner_ups=(replace(selection, runner_ups=()), *others))
