"""What a running request teaches about its hierarchy's costs and rates (docs/design.md, "The adaptive
controller"): a profile's prior, corrected by the run's own counts, for the latency controller
(``controller``) to re-solve the latency model on.

Terms. The *candidates* are an adaptive run's levels under the target; index ``n`` (their count) is
the target. A *pair* (i, j) is candidate i verified by j. The *prior* is a profile: step costs per
candidate (``latency.Cost``, from ``select_hierarchy``'s profile cache) and the pairwise acceptance
matrix, measured on calibration text in another process. The run corrects both as it decodes:

- **Costs**: every step the run times (``Observation.step_seconds``) against what the prior predicts
  for it (a draft step of k tokens, a verification over n fed tokens, a lookup call): the median
  ratio over the recent steps of a candidate scales all its costs (``Scaled``). The machine, the
  process and the batch change a cost's scale most; what its shape misses shows in the chain's
  delivered seconds (the controller's corrections).
- **A lookup level's proposals**: how many tokens a call proposes (``LookupCost.lengths``, the
  share of calls that match nothing above all) depends on the text more than anything: every
  verification of its proposals tells a row's proposal length (censored at the block size: a
  proposal of T tokens says only "at least T"), counted on top of the prior's lengths as
  ``PRIOR_CALLS`` pseudo-calls and faded like the trials; the lengths are the product-limit
  estimate over them. The prior replays the lookup at each block size (``latency.DepthRates``):
  what the run counts at the T it runs is carried to every T as its surplus over the replay at
  that T (``depth_counts``), so a T that does not run keeps where its own replay places the calls
  and the counts move it as much as the text differs from the calibration. At batch B the
  verification is padded to the widest of B proposals (``rows``), so a text where few rows match
  makes the lookup level cost more than it gains. Under a middle model m (lookup > m > ...) the
  later calls of m's runs, after m's own token, offer less and are taken less than the first
  (``Observation.opens``): with ``later_calls_apart`` only the first calls count there, the later
  ones apart, on top of the first calls' estimates (``later_calls``, ``latency.LaterCalls``; off by
  default, see ``controller.LatencyController``).
- **Acceptance**: every verification of the active pairs (``Observation.verified / accepted``),
  counted as Bernoulli trials up to the first rejection, per block position, on top of the prior
  as ``PRIOR_TOKENS`` pseudo-trials (a lookup level's: as many pseudo-calls, each reaching a block
  position as often as the prior's lengths and rates carry it, ``_reached``); older rounds fade
  (``FADE`` per round), so the estimate follows the text. The counts of pairs that do not run
  fade too (their estimates drift back to the prior), except as probes add to them (a probe's
  agreement with the target counts as trials of the pair (candidate, target); over a lookup
  level's proposals, as trials of (lookup, candidate) and of ``through``'s rates).
- **Tokens that came through** (``through``): in a chain lookup > m > v, v's trials on m's tokens
  mix its rate on the proposals m kept, on m's corrections and on m's own drafts (the profile's
  ``latency.RatesThrough``): they are counted apart from the pair (m, v), and the mix is solved for
  the kept proposals' rate (where that would pass 1, for the other two kinds as well).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from hsd_fast.depth_counts import (
    carried_lengths,
    carried_rates,
    expected_ends,
    expected_passes,
    from_hazards,
    reaching_calls,
)
from hsd_fast.latency import (
    Acceptance,
    Cost,
    DepthRates,
    LaterCalls,
    LookupCost,
    RatesThrough,
    Through,
    decode_seconds,
    draft_seconds,
    rate_at,
    shares_through,
)
from hsd_fast.selector import level_zero_only
from hsd_fast.switching_types import Observation, ProposalsProbed

PRIOR_TOKENS = 32.0
"""Pseudo-trials the prior acceptance rate counts as: a pair's own rate outweighs it after a few
dozen verified drafts."""
PRIOR_CALLS = 32.0
"""Pseudo-calls the prior proposal lengths of a lookup level count as (``PRIOR_TOKENS``'s
counterpart)."""
FADE = 0.9
"""What a pair's counted trials keep per round: about the last ten rounds dominate."""
RECENT_STEPS = 48
"""Steps per candidate whose measured / predicted ratio the cost scale is the median of."""


@dataclass(frozen=True)
class Scaled:
    """A cost ``base`` times ``factor``: its calls, draft steps and decoding alike."""

    base: Cost
    factor: float

    def __call__(self, n: int) -> float:
        return self.factor * self.base(n)

    def draft(self, k: int) -> float:
        return self.factor * draft_seconds(self.base, k)

    def decode(self) -> float:
        return self.factor * decode_seconds(self.base)

    @property
    def crowded(self) -> None:  # the measured scale already holds the cache the chain ran with
        return None

    def with_lengths(self, lengths: tuple[float, ...]) -> Scaled:  # a lookup level's, at another T
        return Scaled(self.base.with_lengths(lengths), self.factor)  # type: ignore[attr-defined]

    def __getattr__(self, name: str):  # a lookup level's block distribution, a tree's fed count
        if name == "base":  # not set yet (copy, pickle): no recursion
            raise AttributeError(name)
        return getattr(self.base, name)


class RunEstimates:
    """The prior's costs and rates with the running request's counts on top (module doc).

    ``costs``: the prior step costs of the candidates and the target (the target last);
    ``alpha``: the prior acceptance matrix over them; ``through``: the rates at which a model
    accepts the proposals the model under it passed (``latency.chain_rates``);
    ``later_calls_apart``: under a middle model, count a lookup level's calls after the first of
    the middle model's run apart (``later_calls``)."""

    def __init__(
        self,
        costs: Sequence[Cost],
        alpha: Sequence[Sequence[Acceptance]],
        through: Through | None = None,
        later_calls_apart: bool = False,
    ) -> None:
        n = len(costs)
        if n < 1 or len(alpha) != n or any(len(row) != n for row in alpha):
            raise ValueError(f"need costs for the candidates and the target and an {n} x {n} alpha matrix")
        # an adaptive run recomputes an exit's layers in its verifier (the layers' K/V below the exit
        # are not kept across hierarchies): every verification at its full cost
        self.prior_costs = [_without_reuse(c) for c in costs]
        self.prior_alpha = [list(row) for row in alpha]
        self.prior_through = dict(through or {})
        self.later_calls_apart = later_calls_apart
        self.rows = 1  # rows of the run last seen: a lookup level's verification pads to their widest
        self.ratios: list[list[float]] = [[] for _ in costs]  # measured / predicted, per candidate
        self.trials: dict[tuple[int, int], np.ndarray] = {}  # per pair, per block position: [2, P]
        # per (p, m, v) of ``prior_through``: level 2's trials on level 1's tokens in chains p > m > v,
        # [passed, tried, tried x each share of shares_through: kept, corrections, own]
        self.through_trials: dict[tuple[int, int, int], np.ndarray] = {}
        # per (p, m, v) of ``prior_through`` with v the target: what probes of m found on p's
        # proposals (``ProposalsProbed``): passed and tried on the kept proposals, the corrections
        # and m's other own tokens, [6]
        self.through_probed: dict[tuple[int, int, int], np.ndarray] = {}
        # per lookup candidate, per proposal length (the prior's lengths): [2, L], calls whose
        # proposal ended there, and calls cut there by the block size (at least that long)
        self.proposals: dict[int, np.ndarray] = {}
        # per (lookup candidate p, middle model m): the calls after the first of m's run, as
        # ``proposals``, and m's trials on them per block position, [2, P] (``later_calls``)
        self.later_proposals: dict[tuple[int, int], np.ndarray] = {}
        self.later_trials: dict[tuple[int, int], np.ndarray] = {}
        # a lookup level replayed at each block size (``DepthRates``): what the replay at the T of
        # each count expected of it, the passes per pair, [1, P], and the calls ending at each
        # length per lookup candidate, [L] (``depth_counts``)
        self.expected_passes: dict[tuple[int, int], np.ndarray] = {}
        self.expected_ends: dict[int, np.ndarray] = {}

    @property
    def target(self) -> int:
        return len(self.prior_costs) - 1

    def costs(self) -> list[Cost]:
        """The prior costs, each scaled by the median measured / predicted ratio of its recent steps;
        a candidate that has not run yet by the median over the model levels' recent steps (what
        moved every model's cost, the machine or the process, most likely moved its too; a lookup
        level's calls are host work, whose ratio is its own: 9.6 against the target's 0.99 on
        the cost twin, which priced the idle drafts at 3.3x). A lookup level's with the proposal
        lengths of ``lengths`` and the run's rows."""
        bases = [
            replace(c, lengths=self.lengths(m), rows=self.rows) if isinstance(c, LookupCost) else c
            for m, c in enumerate(self.prior_costs)
        ]
        if not any(self.ratios):
            return bases
        models = [
            x
            for r, c in zip(self.ratios, self.prior_costs, strict=True)
            if not level_zero_only(c)
            for x in r[-RECENT_STEPS:]
        ]
        overall = statistics.median(models) if models else 1.0
        return [
            Scaled(c, statistics.median(r[-RECENT_STEPS:]) if r else overall)
            for c, r in zip(bases, self.ratios, strict=True)
        ]

    def lengths(self, m: int) -> tuple[float, ...]:
        """Lookup candidate ``m``'s proposal lengths (``LookupCost.lengths``): the calls its
        verifications showed (the first of a middle model's runs: ``later_calls``) on top of the
        prior's lengths (``_product_limit``); replayed at each block size, the run's surplus over
        those replays carried to the largest T's (``depth_counts``)."""
        prior = self.prior_costs[m].lengths  # type: ignore[attr-defined]  # the largest T's replay
        if self._length_replays(m) is None:
            return _product_limit(prior, self.proposals.get(m))
        return self._carried_lengths(m, prior)

    def alpha(self) -> list[list[Acceptance]]:
        """The prior acceptance matrix, every pair that ran corrected by what it accepted. A lookup
        level replayed at each block size (``DepthRates``): every T's lengths and rates with the
        run's surplus over the replays at the T's it ran carried to them (``_carried``), so each T
        keeps its own replay's place of the calls."""
        out = [list(row) for row in self.prior_alpha]
        for i, row in enumerate(self.prior_alpha):
            lengths_at = None  # lookup i's carried lengths at each T, once for all its pairs
            for j, prior in enumerate(row):
                if isinstance(prior, DepthRates) and (i in self.proposals or (i, j) in self.trials):
                    if lengths_at is None:
                        replays = self._length_replays(i)
                        assert replays is not None  # pair (i, j) is replayed at each T
                        lengths_at = {T: self._carried_lengths(i, L) for T, L in replays.items()}
                    out[i][j] = self._carried(i, j, lengths_at)
        for (i, j), (passed, tried) in self.trials.items():
            prior = self.prior_alpha[i][j]
            if isinstance(prior, DepthRates):
                continue
            if isinstance(prior, tuple):  # per block position (a lookup level's)
                lengths = getattr(self.prior_costs[i], "lengths", None)
                out[i][j] = _per_position(prior, lengths, passed, tried)
            else:
                out[i][j] = _pooled(passed, tried, prior)
        return out

    def _replays(self, i: int, j: int) -> dict[int, tuple[tuple[float, ...], tuple[float, ...]]] | None:
        """Lookup candidate ``i``'s replays towards ``j``: T -> (lengths, rates), the profile's
        largest T among them (the prior's tuple and lengths); None: one replay for every T."""
        prior = self.prior_alpha[i][j]
        if not isinstance(prior, DepthRates):
            return None
        lengths = self.prior_costs[i].lengths  # type: ignore[attr-defined]
        return {**prior.at, len(lengths) - 1: (lengths, tuple(prior))}

    def _length_replays(self, m: int) -> dict[int, tuple[float, ...]] | None:
        """Lookup candidate ``m``'s lengths at each block size (one replay serves all its pairs)."""
        for j in range(len(self.prior_alpha)):
            if (replays := self._replays(m, j)) is not None:
                return {T: lengths for T, (lengths, _) in replays.items()}
        return None

    def _carried_lengths(self, m: int, lengths: Sequence[float]) -> tuple[float, ...]:
        """The replay ``lengths`` of lookup candidate ``m`` with the run's surplus of calls carried."""
        calls = self.proposals.get(m, self._no_calls(m))
        expected = self.expected_ends.get(m, np.zeros(calls.shape[1]))
        return carried_lengths(lengths, calls, expected, PRIOR_CALLS)

    def _carried(self, i: int, j: int, lengths_at: dict[int, tuple[float, ...]]) -> DepthRates:
        """Pair (lookup i, j)'s rates at each block size, with lookup i's carried ``lengths_at``
        each: each T's replay with the run's surplus over the replays at the T's it ran carried to
        it (``depth_counts``; docs/design.md, "Rates at each block size", *Carried to the other
        block sizes*)."""
        replays = self._replays(i, j)
        assert replays is not None
        passed, tried = self.trials.get((i, j), np.zeros((2, 0)))
        expected = self.expected_passes.get((i, j), np.zeros((1, len(tried))))[0]
        carried = {}
        for T, (lengths, rates) in replays.items():
            weights = PRIOR_TOKENS * _reached(rates, lengths)
            carried[T] = (lengths_at[T], carried_rates(rates, passed, tried, expected, weights))
        _, largest = carried.pop(max(replays))
        return DepthRates(largest, carried)

    def later_calls(self, p: int, m: int, alpha) -> LaterCalls:
        """Lookup candidate ``p``'s calls under model ``m`` after the first of m's run
        (``latency.LaterCalls``): the lengths and m's rates its chains showed, counted on top of
        the first calls' estimates (``lengths(p)``, ``alpha[p][m]``) as the prior: until such a
        chain runs, the later calls are taken as the first."""
        first = alpha[p][m] if isinstance(alpha[p][m], tuple) else (alpha[p][m],)
        return self._later_calls_over(p, m, self.lengths(p), first)

    def _later_calls_over(
        self, p: int, m: int, lengths: Sequence[float], rates: Sequence[float]
    ) -> LaterCalls:
        """``later_calls`` with the prior ``lengths`` and m's per-position ``rates`` given."""
        counts = self.later_trials.get((p, m), np.zeros((2, 0)))
        passed, tried = np.pad(counts, ((0, 0), (0, max(len(rates) - counts.shape[1], 0))))  # [P] each
        return LaterCalls(
            _product_limit(lengths, self.later_proposals.get((p, m))),
            _per_position(tuple(rates), lengths, passed, tried),
        )

    def through(self, alpha) -> dict[tuple[int, int, int], RatesThrough]:
        """How a model v takes what model m passes of lookup level p's proposals
        (``latency.chain_rates``): the prior's, corrected by what probes of m found (the kept
        proposals', the corrections' and m's other own tokens' trials, each on top of the prior's
        rate as ``PRIOR_TOKENS`` trials), then by the chains p > m > v that ran. Their v took m's
        tokens at a rate that mixes the rate on the kept proposals, on m's corrections and on m's
        own (``alpha[m][v]``) by their shares; counted on top of the mix so far as ``PRIOR_TOKENS``
        trials, the mix is solved for the first (the others stay as they were), and where that
        asks more than 1 of it (on a text both repeat, v takes m's corrections and its bonus after
        a whole passage far more often than their prior rates say), for the other two
        (``_solved_mix``; docs/design.md, "Tokens that came through", *Past the kept proposals*)."""
        out = dict(self.prior_through)
        for chain, probed in self.through_probed.items():
            prior, direct = out[chain], mean_rate(alpha[chain[1]][chain[2]])
            priors = (
                prior.passed,
                direct if prior.corrected is None else prior.corrected,
                direct if prior.own is None else prior.own,
            )
            out[chain] = RatesThrough(
                *(
                    _pooled(passed, tried, rate)
                    for rate, (passed, tried) in zip(priors, probed.reshape(3, 2), strict=True)
                )
            )
        for chain, (passed, tried, *shared) in self.through_trials.items():
            prior, direct = out[chain], mean_rate(alpha[chain[1]][chain[2]])
            kept, corrections, own = (x / tried for x in shared) if tried > 0 else (0.0, 0.0, 0.0)
            if kept <= 0:
                continue
            corrected = direct if prior.corrected is None else prior.corrected
            own_rate = direct if prior.own is None else prior.own
            rest = corrected**corrections * own_rate**own  # the part this leaves as the prior's
            mixed = (passed + PRIOR_TOKENS * prior.passed**kept * rest) / (tried + PRIOR_TOKENS)
            out[chain] = _solved_mix(prior, mixed, kept, (corrected, corrections), (own_rate, own))
        return out

    def chain_costs(self, costs: Sequence[Cost], alpha, levels: Sequence[int]) -> list[Cost]:
        """``costs``, with a lookup level under a middle model given its later calls there
        (``later_calls``)."""
        out = list(costs)
        if (
            self.later_calls_apart
            and len(levels) >= 3
            and isinstance(self.prior_costs[levels[0]], LookupCost)
        ):
            out[levels[0]] = _with_later(costs[levels[0]], self.later_calls(levels[0], levels[1], alpha))
        return out

    def learn(self, seen: Observation) -> None:
        """Count what the round ``seen`` reports: its rows, what its probes found, its steps' seconds
        against the prior's, and its verifications (older counts faded per round)."""
        if not seen.finished.all():  # the run's end (``finished``) leaves the rows it last decoded
            self.rows = _rows(seen)
        for found in seen.probes:
            if found.positions:
                pair = (found.candidate, self.target)
                self._count(pair, np.array([found.agreed]), np.array([found.positions]), T=1)
            if found.proposals is not None:
                self._count_probed_proposals(found.candidate, found.proposals)
        if seen.choice is None:
            return
        levels = [*seen.choice.drafts, self.target]
        timed = zip(seen.step_sizes, seen.step_seconds, strict=True) if not seen.warming else ()
        for level, (sizes, seconds) in enumerate(timed):
            model = levels[level]
            for size, s in zip(sizes.tolist(), seconds.tolist(), strict=True):
                predicted = _predicted(self.prior_costs[model], level, size)
                if predicted > 0 and s > 0:
                    self.ratios[model].append(s / predicted)
            del self.ratios[model][:-RECENT_STEPS]
        for counts in (
            *self.trials.values(),
            *self.proposals.values(),
            *self.later_proposals.values(),
            *self.later_trials.values(),
            *self.through_trials.values(),
            *self.through_probed.values(),
            *self.expected_passes.values(),
            *self.expected_ends.values(),
        ):
            counts *= FADE**seen.rounds  # per round, however far apart the looks
        # a lookup under a middle model: the first call of each of the middle's runs apart from the
        # later ones (``later_calls``); without the marks or ``later_calls_apart``, all as first ones
        lookup_first, later = isinstance(self.prior_costs[levels[0]], LookupCost), np.zeros(0, dtype=bool)
        if self.later_calls_apart and lookup_first and len(levels) >= 3 and seen.opens:
            later = ~seen.opens[0]  # [N] per verification of the lookup's calls
        if seen.verified and lookup_first:
            first = ~later if later.size else slice(None)
            self._count_proposals(levels[0], seen.verified[0][first], seen.choice.T[0])
            if later.size:
                counts = self.later_proposals.setdefault(tuple(levels[:2]), self._no_calls(levels[0]))
                self._count_calls(counts, seen.verified[0][later], seen.choice.T[0])
        for level, (drafts, accepted) in enumerate(zip(seen.verified, seen.accepted, strict=True), start=1):
            pair = (levels[level - 1], levels[level])
            if int(drafts.max(initial=0)) == 0:
                continue
            passed, tried = _trials(drafts, accepted)
            if level == 2 and (chain := tuple(levels[:3])) in self.prior_through:  # a mix: ``through``
                alpha = self.alpha()
                lookup = replace(self.prior_costs[levels[0]], lengths=self.lengths(levels[0]))
                if self.later_calls_apart:  # the shares need its blocks only, not its seconds
                    lookup = _with_later(lookup, self.later_calls(levels[0], levels[1], alpha))
                shares = shares_through(
                    lookup,
                    alpha[levels[0]][levels[1]],
                    seen.choice.T[0],
                    seen.choice.T[1],
                )
                counts = self.through_trials.setdefault(chain, np.zeros(5))
                counts += (passed.sum(), tried.sum(), *(share * tried.sum() for share in shares))
            elif level == 1 and later.size:
                self._count(pair, *_trials(drafts[~later], accepted[~later]), T=seen.choice.T[0])
                later_passed, later_tried = _trials(drafts[later], accepted[later])
                self.later_trials[pair] = _grown(self.later_trials.get(pair), later_passed, later_tried)
            else:
                self._count(pair, passed, tried, T=seen.choice.T[level - 1])

    def _count(self, pair: tuple[int, int], passed: np.ndarray, tried: np.ndarray, T: int) -> None:
        """Add trials of ``pair``, per block position (``[P]`` each; a probe's are position 0's),
        verified at block size ``T`` (a lookup level replayed at each: what T's replay expected)."""
        self.trials[pair] = _grown(self.trials.get(pair), passed, tried)
        if (replays := self._replays(*pair)) is not None:
            _, rates = replays.get(T, replays[max(replays)])
            self.expected_passes[pair] = _grown(self.expected_passes.get(pair), expected_passes(tried, rates))

    def _count_probed_proposals(self, m: int, found: ProposalsProbed) -> None:
        """Add what a probe of model ``m`` found on the lookup level's proposals: trials of the
        pair (lookup, m) per block position, and of the target on m's kept proposals, on its
        corrections and on its other own tokens (``through``)."""
        if found.tried.sum() > 0:  # replayed at the run's largest block size
            self._count((found.lookup, m), found.passed, found.tried, T=len(found.tried))
        chain = (found.lookup, m, self.target)
        if chain in self.prior_through:
            counts = self.through_probed.setdefault(chain, np.zeros(6))
            counts += (*found.kept, *found.corrections, *found.own)

    def _count_proposals(self, m: int, blocks: np.ndarray, T: int) -> None:
        """Add the calls of lookup candidate ``m`` whose verifications checked ``blocks`` ``[N]``
        tokens, proposed at block size ``T`` (``_count_calls``)."""
        calls = self._no_calls(m)
        self._count_calls(calls, blocks, T)
        self.proposals[m] = self.proposals.get(m, 0.0) + calls
        if (replays := self._length_replays(m)) is not None:
            expected = expected_ends(calls, replays.get(T, replays[max(replays)]))
            self.expected_ends[m] = self.expected_ends.get(m, 0.0) + expected

    def _no_calls(self, m: int) -> np.ndarray:
        """[2, L] no calls of lookup candidate ``m`` yet, per proposal length: ended there, cut there."""
        return np.zeros((2, len(self.prior_costs[m].lengths)))  # type: ignore[attr-defined]

    @staticmethod
    def _count_calls(counts: np.ndarray, blocks: np.ndarray, T: int) -> None:
        """Add to ``counts`` (``_no_calls``') the calls of a lookup candidate whose verifications
        checked ``blocks`` ``[N]`` tokens, proposed at block size ``T``: a block of T
        (or of the prior's longest length) was cut there, a shorter one ended there. (A row near
        its length budget wants fewer than T: its last call counts as ended, a small bias towards
        shorter proposals.)"""
        longest = counts.shape[1] - 1
        blocks = np.minimum(blocks, longest)
        was_cut = blocks >= min(T, longest)
        np.add.at(counts[0], blocks[~was_cut], 1.0)
        np.add.at(counts[1], blocks[was_cut], 1.0)

    def describe(self, names: Sequence[str], costs: Sequence[Cost], alpha) -> list[str]:
        """The estimates in lines of text: each candidate's cost scale (measured / predicted), each
        pair's acceptance, prior and now (``costs``, ``alpha``), with the trials behind it, the
        rates through a lookup level, and a lookup level's proposals. ``names``: the candidates',
        then the target's."""
        lines = ["cost scale (measured / profiled), per level:"]
        for m, name in enumerate(names):
            scale = costs[m].factor if isinstance(costs[m], Scaled) else 1.0
            lines.append(f"  {name}: {scale:.2f} ({len(self.ratios[m])} recent steps)")
        lines.append("acceptance, per pair that ran or was probed: prior -> now (trials, faded)")
        for (i, j), counts in sorted(self.trials.items()):
            lines.append(
                f"  {names[i]} > {names[j]}: {mean_rate(self.prior_alpha[i][j]):.2f} -> "
                f"{mean_rate(alpha[i][j]):.2f} ({counts[1].sum():.0f})"
            )
        through = self.through(alpha)
        for (p, m, v), rates in sorted(through.items()):
            counts, prior = self.through_trials.get((p, m, v), np.zeros(5)), self.prior_through[(p, m, v)]
            probed = self.through_probed.get((p, m, v), np.zeros(6))
            corrected = "" if rates.corrected is None else f", on its corrections {rates.corrected:.2f}"
            corrected += "" if rates.own is None else f", on its other own tokens {rates.own:.2f}"
            lines.append(
                f"  {names[v]} on what {names[m]} passed of {names[p]}: {prior.passed:.2f} -> "
                f"{rates.passed:.2f} ({counts[1]:.0f} in the chain, {probed[1]:.0f} + {probed[3]:.0f} + "
                f"{probed[5]:.0f} probed){corrected}"
            )
        for m, counts in sorted(self.proposals.items()):
            prior, now = self.prior_costs[m].lengths, self.lengths(m)  # type: ignore[attr-defined]
            lines.append(
                f"  {names[m]}'s proposals: nothing matched {prior[0]:.2f} -> {now[0]:.2f}, mean length "
                f"{_mean_length(prior):.1f} -> {_mean_length(now):.1f} ({counts.sum():.0f} calls, faded)"
            )
        for (p, m), counts in sorted(self.later_proposals.items()):
            later = self.later_calls(p, m, alpha)
            lines.append(
                f"  {names[p]}'s later calls under {names[m]}: nothing matched {later.lengths[0]:.2f}, mean "
                f"length {_mean_length(later.lengths):.1f}, {names[m]} takes their first token "
                f"{later.rates[0]:.2f} ({counts.sum():.0f} calls, faded)"
            )
        return lines


def _rows(seen: Observation) -> int:
    """The rows still decoding (at least 1)."""
    return max(1, int((~seen.finished).sum()))


def mean_rate(rate: Acceptance) -> float:
    """One number for a pair's acceptance: a lookup level's per-position rates averaged."""
    return float(np.mean(rate)) if isinstance(rate, tuple) else float(rate)


def _mean_length(lengths: Sequence[float]) -> float:
    return float(np.dot(np.arange(len(lengths)), lengths))


def _reached(rates: Sequence[float], lengths: Sequence[float] | None) -> np.ndarray:
    """[P] the share of a proposal level's calls whose proposal reaches block position p (tried:
    the level offered p + 1 tokens or more and the first p were accepted) under the prior's
    ``lengths`` and per-position ``rates``: its pseudo-trials there, per pseudo-call. Counting the
    prior as ``PRIOR_TOKENS`` trials at every position made it outweigh the run's trials at the
    late positions, which few proposals reach (the zoo's prior, 0.97-0.99 at positions 5-7, held
    the replayed tokens per round of ``lookup > s`` up to 20 % above the run's on prose:
    bench_model_error.py, docs/design.md, "Tokens that came through", *Counted alike*).
    Without ``lengths`` (a level that always offers the block), every call reaches position 0."""
    offered = np.ones(len(rates))
    if lengths is not None:
        at_least = np.cumsum(np.asarray(lengths, dtype=float)[::-1])[::-1]  # [len] P(offers >= b)
        offered = at_least[np.minimum(np.arange(1, len(rates) + 1), len(at_least) - 1)]
    accepted_before = np.cumprod([1.0, *rates[:-1]])  # P(the first p accepted)
    return offered * accepted_before


def _product_limit(prior: Sequence[float], counts: np.ndarray | None) -> tuple[float, ...]:
    """Proposal lengths (``LookupCost.lengths``): the product-limit estimate over ``counts`` (``[2,
    L]``: calls whose proposal ended at each length, and calls cut there by the block size) and
    the ``prior`` lengths as ``PRIOR_CALLS`` pseudo-calls. A length's hazard (the share of
    proposals at least that long that end there) counts the calls that ended there over those
    that reached it uncut; a call cut by the block size says nothing past it, so lengths beyond
    every block size run keep the prior's hazards."""
    prior = np.asarray(prior, dtype=float)
    ended, cut = PRIOR_CALLS * prior, np.zeros_like(prior)
    if counts is not None:
        ended, cut = ended + counts[0], counts[1]
    reached = reaching_calls(np.stack([ended, cut]))[:-1]
    return from_hazards(np.divide(ended[:-1], reached, out=np.zeros(len(reached)), where=reached > 0))


def _per_position(
    prior: Acceptance,
    lengths: Sequence[float] | None,
    passed: np.ndarray,
    tried: np.ndarray,
) -> tuple[float, ...]:
    """A proposal level's pair rates per block position: ``passed`` / ``tried`` ``[P]`` on top of
    the ``prior`` rates as ``PRIOR_TOKENS`` pseudo-calls, each reaching a
    position as often as the prior's ``lengths`` and rates carry it (``_reached``)."""
    rates = [rate_at(prior, p + 1) for p in range(max(len(passed), 1))]
    passed, tried = (np.pad(x, (0, len(rates) - len(x))) for x in (passed, tried))
    weights = PRIOR_TOKENS * _reached(rates, lengths)
    return tuple(
        float((s + w * a) / (t + w)) if t + w > 0 else a
        for s, t, w, a in zip(passed, tried, weights, rates, strict=True)
    )


def _trials(drafts: np.ndarray, accepted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Verifications of ``drafts`` ``[N]`` tokens that accepted ``accepted`` ``[N]`` of them as
    Bernoulli trials up to the first rejection, per block position p (the (p + 1)-th draft):
    passed and tried, ``[P]`` each."""
    positions = np.arange(int(drafts.max(initial=0)))
    tried = (positions[None, :] < np.minimum(drafts, accepted + 1)[:, None]).sum(0)
    passed = (positions[None, :] < accepted[:, None]).sum(0)
    return passed, tried


def _grown(counts: np.ndarray | None, *rows: np.ndarray) -> np.ndarray:
    """``counts`` ``[R, P]`` (None: none yet) plus ``rows`` (R of them, e.g. passed and tried),
    widened to fit."""
    old = np.zeros((len(rows), 0)) if counts is None else counts
    width = max(len(row) for row in rows)
    out = np.zeros((len(rows), max(width, old.shape[1])))
    out[:, : old.shape[1]] += old
    for k, row in enumerate(rows):
        out[k, : len(row)] += row
    return out


def _with_later(cost: Cost, later: LaterCalls) -> Cost:
    """A lookup level's ``cost`` (or its ``Scaled``) with ``later`` calls under a middle model."""
    if isinstance(cost, Scaled):
        return Scaled(_with_later(cost.base, later), cost.factor)
    return replace(cost, later=later)


def _pooled(passed: np.ndarray, tried: np.ndarray, prior: float) -> float:
    return float((passed.sum() + PRIOR_TOKENS * prior) / (tried.sum() + PRIOR_TOKENS))


def _solved_mix(
    prior: RatesThrough,
    mixed: float,
    kept: float,
    corrected: tuple[float, float],
    own: tuple[float, float],
) -> RatesThrough:
    """``prior`` with rates whose mix is ``mixed``: passed^kept x rate^share of ``corrected`` and of
    ``own`` (each a (rate, share) pair; the shares and ``kept`` sum to 1). Solved for passed with
    the other two as they are; where that asks more than 1 of it, passed is 1 and the other two
    take the rest by one common power lam (rest^lam = mixed: the lower rate moves the more). Where
    the other two have nothing to give (a rate 0, or both 1), the prior, or passed at most 1.
    ``kept`` > 0 (the caller skips a chain whose m kept no proposal)."""
    (corrected_rate, corrections), (own_rate, own_share) = corrected, own
    rest = corrected_rate**corrections * own_rate**own_share
    if rest <= 0:
        return prior
    passed = (mixed / rest) ** (1.0 / kept)
    if passed <= 1.0 or rest >= 1.0:
        return replace(prior, passed=min(1.0, passed))
    lam = math.log(mixed) / math.log(rest) if mixed < 1.0 else 0.0
    return replace(prior, passed=1.0, corrected=corrected_rate**lam, own=own_rate**lam)


def _predicted(cost: Cost, level: int, size: int) -> float:
    """What ``cost`` predicts for a step of the run: a level-0 step drafting ``size`` tokens (a
    lookup call: its host seconds), or a verification over ``size`` fed tokens."""
    if level == 0:
        return draft_seconds(cost, max(size, 1))
    return cost(size)


def _without_reuse(cost: Cost) -> Cost:
    """``cost`` without the verifications from its hidden states an exit's profile lists."""
    return replace(cost, reused_by=()) if getattr(cost, "reused_by", ()) else cost
