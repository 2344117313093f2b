"""The adaptive controller (docs/design.md, "The adaptive controller"): a policy for an adaptive run
(``generate(..., adapt=...)``) that re-solves the latency model on estimates from the running request.

Terms. The *candidates* are an adaptive run's levels under the target; index ``n`` (their count) is
the target. A *pair* (i, j) is candidate i verified by j. The *prior* is a profile: step costs per
candidate (``latency.Cost``, from ``select_hierarchy``'s profile cache) and the pairwise acceptance
matrix, measured on calibration text in another process. The run corrects both as it decodes:

- **Costs**: every step the run times (``Observation.step_seconds``) against what the prior predicts
  for it (a draft step of k tokens, a verification over n fed tokens, a lookup call): the median
  ratio over the recent steps of a candidate scales all its costs (``Scaled``). The machine, the
  process and the batch change a cost's scale most; what its shape misses shows in the chain's
  delivered seconds (below).
- **A lookup level's proposals**: how many tokens a call proposes (``LookupCost.lengths``, the
  share of calls that match nothing above all) depends on the text more than anything: every
  verification of its proposals tells a row's proposal length (censored at the block size: a
  proposal of T tokens says only "at least T"), counted on top of the prior's lengths as
  ``PRIOR_CALLS`` pseudo-calls and faded like the trials; the lengths are the product-limit
  estimate over them. The prior replays the lookup at each block size (``latency.DepthRates``):
  what the run counts at the T it runs is carried to every T as its surplus over the replay at
  that T (``depth_counts``), so a T that does not run keeps where its own replay places the calls
  and the counts move it as much as the text differs from the calibration. At batch B the
  verification is padded to the widest of B proposals, so a text where few rows match makes the
  lookup level cost more than it gains. Under a middle model m
  (lookup > m > ...) the later calls of m's runs, after m's own token, offer less and are taken
  less than the first (``Observation.opens``): with ``later_calls_apart`` only the first calls count
  there, the later ones apart, on top of the first calls' estimates (``later_calls``,
  ``latency.LaterCalls``; off by default, see its doc).
- **Acceptance**: every verification of the active pairs (``Observation.verified / accepted``),
  counted as Bernoulli trials up to the first rejection, per block position, on top of the prior
  as ``PRIOR_TOKENS`` pseudo-trials (a lookup level's: as many pseudo-calls, each reaching a block
  position as often as the prior's lengths and rates carry it, ``_reached``); older rounds fade
  (``FADE`` per round), so the estimate follows the text. The counts of pairs that do not run
  fade too (their estimates drift back to the prior), except as probes add to them.
- **Tokens that came through** (``through``): in a chain lookup > m > v, v's trials on m's tokens
  mix its rate on the proposals m kept, on m's corrections and on m's own drafts (the profile's
  ``latency.RatesThrough``): they are counted apart from the pair (m, v), and the mix is solved for
  the kept proposals' rate (where that would pass 1, for the other two kinds as well).
- **Rows apart**: the estimate pools a batch's rows, but the batch decodes at its slowest row's
  pace; with the profile's spread (``row_spread``) each pair is priced at the rate of the expected
  slowest of the rows still decoding (``_paced``).
- **Probes** (greedy runs): at a look, while the probes' seconds stay under ``probe_share`` of the
  wall time it has seen, the idle model candidate considered longest ago (at most once every
  ``probe_every`` looks, twice as long after each further probe that left it out) is fed the
  committed tokens it lacks and scored on them (``probes.py``) if the rates a probe measures,
  raised to the upper end of what their estimates allow, could bring it in (``_worth_probing``);
  its agreement with the target's tokens counts as trials of the pair
  (candidate, target), so a draft that sits out is still judged on this request's text. Where a
  lookup level is a candidate, the probe also scores the candidate on the lookup's proposals
  replayed on that text: trials of the pair (lookup, candidate) and of the target's rates on what
  the candidate would hand up of them (``through``).

- **What the model misses**: a run's seconds per token also hold what the latency model leaves
  out: a batch's rows that finish apart (the batch pays for the rows that still decode), the
  engine's host work between steps, a verification's cost growing faster with its width than the
  profile's. Each look compares the seconds per token the hierarchy that ran delivered (the
  look's wall time, the look before it left out, x rows / tokens committed) with what the model
  predicts for it, except the first look of a request, after a draft model joined, or after steps
  that ran eagerly while their shapes waited to compile (``Observation.warming``: a prefill, a
  joining model's catch-up, a warm-up are costs of starting, not of running; warm-up rounds teach
  no step costs either). The ratio, kept per chain (its levels, whatever
  the block sizes) and faded per look (``CORRECTION_FADE``), multiplies the chain's predictions,
  shrunk by ``CORRECTION_PRIOR`` tokens per row towards the ratio pooled over every drafting chain
  that ran (what misleads the model about one draft mostly misleads it about all: a chain not yet
  run is priced like those that did), and that towards 1. Plain decoding has its own. A chain the
  run left drifts back to the model's prediction and is tried again if the model still prefers it.

It looks every ``every`` rounds at first (``look_every``: the run shows it nothing in between, so a
look's host work is paid once per interval) and after a switch. A new request with as many rows as
the last keeps the hierarchy without deciding (nothing was learnt since the last decision) and looks
first at half the interval the last request ended with; one with other rows is decided afresh and
starts at ``every``. While its choice holds, the interval doubles with each look, up to the smallest
at which the looks take at most ``look_share`` of the time: a look costs ~1 ms of host time (the
run's part and the controller's), measured, as is a round (the medians over the last
``RECENT_LOOKS`` looks). A zoo round at batch 1 takes ~6 ms, so there looks grow sparse (every 16
rounds for 2 %) where the hierarchy is already right, which a fixed interval of 4 paid 4 % of the
time for; a batch-16 round takes 8-30 ms and looks come every 4-8 rounds, where a growth on no other
ground (``look_share=0``: up to ``max_every``) kept drafts that did not pay for 44 % of the tokens
(docs/design.md §8.9). The rounds between two looks are all shown at the next one, and those after
a request's last look at its end (``finished``): only decisions wait.

It scores the current hierarchy and its neighbours (each block size one up or down, a
candidate added or removed, the level-0 draft swapped) and the selector's last runner-ups with the
exact latency model on the current estimates, and switches when the best is predicted faster by more
than ``margin`` (hysteresis: an estimate's noise must not make it flap). The full selector runs at
the start and every ``resolve_every`` looks (counted over every request the controller serves).
Decisions and probes each keep within a share of the wall time the controller has seen
(``decide_share``, ``probe_share``): a look that would exceed it keeps the current hierarchy.

Only what the switching machinery shows a policy is used: its exactness argument holds for any
policy, this one included (docs/design.md, "Switching hierarchies").
"""

from __future__ import annotations

import itertools
import math
import statistics
import time
import weakref
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
from hsd_fast.hierarchy_types import DEFAULT_MAX_T, Hierarchy
from hsd_fast.latency import (
    Acceptance,
    Cost,
    DepthRates,
    LaterCalls,
    LookupCost,
    RatesThrough,
    Through,
    chain_rates,
    decode_seconds,
    draft_seconds,
    expected_latency,
    rate_at,
    reindexed,
    shares_through,
)
from hsd_fast.lookup import level_identity
from hsd_fast.row_spread import Spread, row_rate, sigma_of, slowest_row_z
from hsd_fast.selector import level_zero_only, select
from hsd_fast.switching_types import Choice, Observation, ProposalsProbed

_KEPT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # hierarchy -> {candidates: controller}

PRIOR_TOKENS = 32.0
"""Pseudo-trials the prior acceptance rate counts as: a pair's own rate outweighs it after a few
dozen verified drafts."""
PRIOR_CALLS = 32.0
"""Pseudo-calls the prior proposal lengths of a lookup level count as (``PRIOR_TOKENS``'s
counterpart)."""
FADE = 0.9
"""What a pair's counted trials keep per round: about the last ten rounds dominate."""
CORRECTION_PRIOR = 4.0
"""Tokens per row (about a look's) the model's own prediction counts as in a chain's correction."""
CORRECTION_FADE = 0.98
"""What a chain's measurements keep per look: they halve every 34 looks. What they correct (a batch's
tail, host work, a cost curve's shape) belongs to the setting more than to the text, which the
acceptance and proposal estimates follow; and a chain the run left is tried again only once its
measurements have faded enough for the model's preference to win, every few hundred looks where
the model errs by 2x."""
RECENT_STEPS = 48
"""Steps per candidate whose measured / predicted ratio the cost scale is the median of."""
RECENT_LOOKS = 16
"""Looks whose host time, and the time per round of the rounds before them, set the look interval
(medians: one round held up by the machine must not move it)."""


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


class LatencyController:
    """The latency model's choice, re-solved on the running request's own estimates (module doc).

    ``costs``: the prior step costs of the candidates and the target (the target last);
    ``alpha``: the prior acceptance matrix over them; ``max_T``: the largest block size chosen;
    ``every``: rounds between looks (each may decide) at first, doubling while the hierarchy holds
    up to the interval at which looks take at most ``look_share`` of the measured time, at most
    ``max_every`` (``look_share=0``: up to ``max_every``; ``max_every=every``: a fixed interval);
    ``margin``: the predicted gain a switch needs;
    ``probe_share``: the share of wall time probes may take (0: never probe); ``probe_every``: the
    fewest looks between two probes of one candidate (``_probe_wait``); ``decide_share``: the share
    of wall time decisions may take (a decision look is skipped while they have taken more);
    ``spread``: how far apart rows accept, per pair (``row_spread``; None: all alike; a proposal
    level's rows, ``ProposalRows``, as their log-odds spread): at more than one row the model
    prices each pair at the rate of the batch's slowest row, which sets the batch's pace;
    ``through``: the rates at which a model accepts the proposals the model under it passed
    (``latency.chain_rates``), corrected by the chains that run (``through``, the method);
    ``later_calls_apart``: under a middle model, count a lookup level's calls after the first of
    the middle model's run apart and price chains with them (``later_calls``). Off by default: it
    makes the model's middle verifications per round right (docs/design.md, "Tokens that came
    through", *First and later calls*), but on the cost twin's stream the controller then ran
    ``lookup > xs > s`` where ``lookup > s`` was faster (0.90-0.95x the pick, from 0.95-1.01x)."""

    def __init__(
        self,
        costs: Sequence[Cost],
        alpha: Sequence[Sequence[Acceptance]],
        max_T: int = DEFAULT_MAX_T,
        every: int = 4,
        max_every: int = 32,
        look_share: float = 0.02,
        margin: float = 0.05,
        resolve_every: int = 128,
        probe_share: float = 0.03,
        probe_every: int = 4,
        decide_share: float = 0.02,
        spread: Sequence[Sequence[Spread]] | None = None,
        through: Through | None = None,
        later_calls_apart: bool = False,
    ) -> None:
        n = len(costs)
        if n < 1 or len(alpha) != n or any(len(row) != n for row in alpha):
            raise ValueError(f"need costs for the candidates and the target and an {n} x {n} alpha matrix")
        if spread is not None and (len(spread) != n or any(len(row) != n for row in spread)):
            raise ValueError(f"the spread matrix must be {n} x {n}, like alpha")
        self.spread = None if spread is None else [[sigma_of(s) for s in row] for row in spread]
        # an adaptive run recomputes an exit's layers in its verifier (the layers' K/V below the exit
        # are not kept across hierarchies): every verification at its full cost
        self.prior_costs = [_without_reuse(c) for c in costs]
        self.prior_alpha = [list(row) for row in alpha]
        self.prior_through = dict(through or {})
        self.later_calls_apart = later_calls_apart
        self.max_T, self.every, self.margin, self.resolve_every = max_T, every, margin, resolve_every
        self.max_every, self.look_share = max(max_every, every), look_share
        self.steady = 0  # looks in a row, in this request, that kept the hierarchy
        self.interval = every  # the rounds between looks the run was last told (``look_every``)
        self.look_costs: list[float] = []  # host seconds of the recent looks, probes not counted
        self.round_costs: list[float] = []  # seconds per round of the rounds before them
        self.probe_share, self.probe_every, self.decide_share = probe_share, probe_every, decide_share
        self.looks = self.resolved_at = 0  # looks seen, over every request; the look of the last resolve
        self.decide_seconds = 0.0  # of the decisions: scoring, resolving
        self.wall = self.probe_seconds = 0.0  # seconds of the rounds seen, and of their probes
        self.last_probe: dict[int, int] = {}  # candidate -> the look it was last considered at
        self.probed_in_vain: dict[int, int] = {}  # candidate -> its probes since it last ran, this request
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
        self.rows = 1  # rows of the run last seen: a lookup level's verification pads to their widest
        self.batch = 1  # rows of the last request (a new one with as many keeps the choice)
        # per chain (drafts, tree): measured seconds per token x tokens per row, the model's
        # prediction x tokens per row, and tokens per row, faded; and what awaits a prediction
        self.measured: dict[tuple, np.ndarray] = {}
        self.unpredicted: dict[Choice, np.ndarray] = {}  # choice -> [seconds x rows, tokens, per row]
        self.measured_at = 0  # the look of the last fold: older measurements fade from there
        self.drafting = 1.0  # the correction pooled over the drafting chains, at the last fold
        self.last_chain: tuple | None = None  # the chain of the last look's rounds
        self.shortlist: list[Choice] = []
        self.current: Choice | None = None
        self.decisions: list[tuple[int, Choice, float]] = []  # (round, choice, predicted seconds/token)

    @classmethod
    def from_hierarchy(cls, hierarchy: Hierarchy, candidates: Sequence, **kwargs) -> LatencyController:
        """A controller for an adaptive run over ``candidates`` (models, a ``LookupDraft`` first),
        its prior the profile ``hierarchy`` was selected from (``select_hierarchy``), choosing up to
        the block size that selection chose from unless ``max_T`` is given; a ValueError names a
        candidate that profile did not measure."""
        profile = hierarchy.profile
        if profile is None:
            raise ValueError("the hierarchy carries no profile (select_hierarchy attaches one)")
        profiled = [level_identity(p) for p in profile.candidates[:-1]]
        index = []
        for i, c in enumerate(candidates):
            found = [j for j, p in enumerate(profiled) if p == level_identity(c)]
            if not found:
                raise ValueError(
                    f"candidate {i} ({type(c).__name__}) was not among the hierarchy's profiled ones"
                )
            index.append(found[0])
        index.append(len(profile.candidates) - 1)  # the target
        costs = [profile.costs[i] for i in index]
        alpha = [[profile.alpha[i][j] for j in index] for i in index]
        if profile.spread is not None and "spread" not in kwargs:
            kwargs["spread"] = [[profile.spread[i][j] for j in index] for i in index]
        kwargs.setdefault("max_T", profile.max_T)
        if profile.through and "through" not in kwargs:
            kwargs["through"] = reindexed(profile.through, {p: i for i, p in enumerate(index)})
        return cls(costs, alpha, **kwargs)

    @classmethod
    def kept_for(cls, hierarchy: Hierarchy, candidates: Sequence, **kwargs) -> LatencyController:
        """``from_hierarchy``'s controller, one per hierarchy and candidates while the hierarchy
        lives: what it learnt in one request serves the next (a 256-token request is too short to
        learn much)."""
        kept = _KEPT.setdefault(hierarchy, {})
        key = (
            tuple(level_identity(c) for c in candidates),
            *kwargs.items(),
        )
        if key not in kept:
            kept[key] = cls.from_hierarchy(hierarchy, candidates, **kwargs)
        return kept[key]

    @property
    def look_every(self) -> int:
        """Round ends until the next look (``switching_types.Policy``), set at each look."""
        return self.interval

    def _interval(self) -> int:
        """``every``, doubled for each look in a row that kept the hierarchy, up to the smallest
        interval at which the looks take at most ``look_share`` of the time (module doc)."""
        cap = self.every
        if (times := self._look_times()) is not None:
            look, round_ = times
            while cap < self.max_every and look > self.look_share * (look + cap * round_):
                cap *= 2
        return min(self.every << min(self.steady, 16), cap, self.max_every)

    def _look_times(self) -> tuple[float, float] | None:
        """A look's host seconds and a round's seconds, the medians over the recent looks (None
        before any was measured)."""
        if not self.look_costs:
            return None
        return statistics.median(self.look_costs), statistics.median(self.round_costs)

    # ------------------------------------------------------------------ estimates
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
            prior, direct = out[chain], _mean_rate(alpha[chain[1]][chain[2]])
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
            prior, direct = out[chain], _mean_rate(alpha[chain[1]][chain[2]])
            kept, corrections, own = (x / tried for x in shared) if tried > 0 else (0.0, 0.0, 0.0)
            if kept <= 0:
                continue
            corrected = direct if prior.corrected is None else prior.corrected
            own_rate = direct if prior.own is None else prior.own
            rest = corrected**corrections * own_rate**own  # the part this leaves as the prior's
            mixed = (passed + PRIOR_TOKENS * prior.passed**kept * rest) / (tried + PRIOR_TOKENS)
            out[chain] = _solved_mix(prior, mixed, kept, (corrected, corrections), (own_rate, own))
        return out

    def learn(self, seen: Observation) -> None:
        """Fold the round ``seen`` reports into the estimates."""
        self.wall += seen.round_seconds
        if not seen.finished.all():  # the run's end (``finished``) leaves the rows it last decoded
            self.rows = _rows(seen)
        for found in seen.probes:
            self.probe_seconds += found.seconds
            if found.positions:
                pair = (found.candidate, self.target)
                self._count(pair, np.array([found.agreed]), np.array([found.positions]), T=1)
            if found.proposals is not None:
                self._count_probed_proposals(found.candidate, found.proposals)
        if seen.choice is None:
            return
        joined = set(seen.choice.drafts) - set(self.last_chain[0] if self.last_chain else ())
        # a request's first look holds its prefill, a model's first after joining its catch-up, and a
        # look over warm-up steps (run eagerly while their shape waits to compile: 2-5x the model's time
        # in a process's first requests) what they cost: costs of starting, not of running
        starting = (
            seen.round <= 1
            or seen.warming
            or any(not isinstance(self.prior_costs[m], LookupCost) for m in joined)
        )
        self.last_chain = _chain(seen.choice)
        if seen.round_seconds > 0 and not starting:  # what a look costs against the rounds it spaces
            self.look_costs.append(max(seen.look_seconds - sum(p.seconds for p in seen.probes), 0.0))
            self.round_costs.append(max(seen.round_seconds - seen.look_seconds, 0.0) / max(seen.rounds, 1))
            del self.look_costs[:-RECENT_LOOKS], self.round_costs[:-RECENT_LOOKS]
        if seen.round_tokens > 0 and not starting:  # seconds x rows / tokens, modelled at the next decision
            rows = len(seen.committed)
            # without the look before these rounds (its decision, probes, reconfiguration): the
            # controller's own time, budgeted apart, is not what the hierarchy costs
            decoding = max(seen.round_seconds - seen.look_seconds, 0.0)
            waiting = self.unpredicted.setdefault(seen.choice, np.zeros(3))
            waiting += (decoding * rows, seen.round_tokens, seen.round_tokens / rows)
        levels = [*seen.choice.drafts, self.target]
        costs_before = self.prior_costs
        timed = zip(seen.step_sizes, seen.step_seconds, strict=True) if not seen.warming else ()
        for level, (sizes, seconds) in enumerate(timed):
            model = levels[level]
            for size, s in zip(sizes.tolist(), seconds.tolist(), strict=True):
                predicted = _predicted(costs_before[model], level, size)
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

    def wants_probes(self, seen: Observation) -> list[int]:
        """At a look, the idle model candidate considered longest ago, if a probe could change the
        decision (``_worth_probing``) and probes stay within their share of the wall time (module
        doc)."""
        if self.probe_share <= 0 or self.current is None or seen.round == 0:
            return []  # round 0: nothing generated yet to score
        if self.probe_seconds > self.probe_share * self.wall:
            return []
        for m in self.current.drafts:  # running: its next probe, once idle again, waits the least
            self.probed_in_vain.pop(m, None)
        idle = [
            m
            for m in self._cost_order()
            if m not in self.current.drafts and not level_zero_only(self.prior_costs[m])
            and (m not in self.last_probe or self.looks - self.last_probe[m] >= self._probe_wait(m))
        ]  # fmt: skip
        if not idle:
            return []
        started = time.perf_counter()  # the gate's own time counts as probing
        considered = min(idle, key=lambda m: self.last_probe.get(m, -1))
        self.last_probe[considered] = self.looks  # considered: probed or not, not again for a while
        worth = self._worth_probing(considered, self.costs(), self.alpha())
        if worth:
            self.probed_in_vain[considered] = self.probed_in_vain.get(considered, 0) + 1
        self.probe_seconds += time.perf_counter() - started
        return [considered] if worth else []

    def _probe_wait(self, m: int) -> int:
        """Looks between two considerations of probing ``m``: ``probe_every``, doubled for each
        further probe of m in this request since it last ran (up to 64x). A probe that did not
        bring m into the hierarchy mostly says the next will not either, on this request's text:
        a new request starts afresh."""
        return self.probe_every << min(max(self.probed_in_vain.get(m, 0) - 1, 0), 6)

    def _worth_probing(self, m: int, costs: Sequence[Cost], alpha) -> bool:
        """Whether what a probe of ``m`` could find might change the decision: with the rates a
        probe measures at the upper end of what their estimates allow (``_raised``: m's acceptance
        by the target, and the target's on what m would pass of a lookup level's proposals), a
        hierarchy next to the current one that holds ``m`` would be chosen. Each probe of m that
        did not bring it in makes the next wait longer (``_probe_wait``)."""
        assert self.current is not None
        counted = self.trials.get((m, self.target))
        optimistic = [list(row) for row in alpha]
        optimistic[m][self.target] = _raised(
            _mean_rate(alpha[m][self.target]), 0.0 if counted is None else counted[1].sum()
        )
        through = self.through(alpha)
        raised = dict(through)
        for chain, rates in through.items():
            if chain[1:] == (m, self.target):
                probed = self.through_probed.get(chain, np.zeros(6))
                ran = self.through_trials.get(chain, np.zeros(5))[1]
                corrected, own = rates.corrected, rates.own
                raised[chain] = replace(
                    rates,
                    passed=_raised(rates.passed, probed[1] + ran),
                    corrected=None if corrected is None else _raised(corrected, probed[3]),
                    own=None if own is None else _raised(own, probed[5]),
                )
        now = self.predicted(self.current, costs, alpha, through)
        holding = [c for c in self._neighbours(self.current) if m in c.drafts]
        return any(self.predicted(c, costs, optimistic, raised) < (1 - self.margin) * now for c in holding)

    def describe(self, names: Sequence[str]) -> list[str]:
        """The controller's view in lines of text: each candidate's cost scale (measured /
        predicted), each pair's acceptance, prior and now, with the trials behind it, its look
        interval and what sets it, and its last decisions. ``names``: the candidates', then the
        target's."""
        costs, alpha = self.costs(), self.alpha()
        lines = ["cost scale (measured / profiled), per level:"]
        for m, name in enumerate(names):
            scale = costs[m].factor if isinstance(costs[m], Scaled) else 1.0
            lines.append(f"  {name}: {scale:.2f} ({len(self.ratios[m])} recent steps)")
        lines.append("acceptance, per pair that ran or was probed: prior -> now (trials, faded)")
        for (i, j), counts in sorted(self.trials.items()):
            lines.append(
                f"  {names[i]} > {names[j]}: {_mean_rate(self.prior_alpha[i][j]):.2f} -> "
                f"{_mean_rate(alpha[i][j]):.2f} ({counts[1].sum():.0f})"
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
        if self.spread is not None and self.rows > 1:
            z = slowest_row_z(self.rows)
            lines.append(f"  priced at the slowest of {self.rows} rows (z {z:.2f}), per pair that ran:")
            lines += [
                f"    {names[i]} > {names[j]}: {_mean_rate(self._paced(alpha[i][j], i, j)):.2f} "
                f"(spread {self.spread[i][j]:.2f})"
                for i, j in sorted(self.trials)
            ]
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
        lines.append("measured / modelled seconds per token, per chain that ran (tokens per row, faded):")
        for chain, (measured, modelled, tokens) in sorted(self.measured.items(), key=str):
            drafts, tree = chain
            names_of = " > ".join(names[m] for m in (*drafts, self.target)) + (" (tree)" if tree else "")
            lines.append(f"  {names_of}: {measured / modelled:.2f} ({tokens:.0f})")
        if (times := self._look_times()) is not None:
            look, round_ = times
            lines.append(
                f"looks: every {self.interval} rounds now (a look {look * 1e3:.2f} ms, a round "
                f"{round_ * 1e3:.2f} ms; looks may take {self.look_share:.0%} of the time)"
            )
        lines.append(f"decisions: {len(self.decisions)}; the last (round: hierarchy, predicted ms/token):")
        for round_, choice, seconds in self.decisions[-5:]:
            chain = " > ".join(names[m] for m in (*choice.drafts, self.target))
            lines.append(f"  {round_}: {chain} T={list(choice.T)}, {seconds * 1e3:.2f}")
        return lines

    # ------------------------------------------------------------------ decisions
    def predicted(
        self, choice: Choice, costs: Sequence[Cost], alpha, through: Through | None = None
    ) -> float:
        """Seconds per committed token of ``choice`` under the estimates (the exact recursion),
        times its chain's correction (``correction``). ``through``: the rates through a lookup
        level (default: ``through(alpha)``)."""
        return self.modelled(choice, costs, alpha, through) * self.correction(choice)

    def modelled(self, choice: Choice, costs: Sequence[Cost], alpha, through: Through | None = None) -> float:
        """The latency model's seconds per committed token of ``choice`` under the estimates."""
        levels = [*choice.drafts, self.target]
        through = self.through(alpha) if through is None else through
        costs = self._chain_costs(costs, alpha, levels)
        rates = chain_rates(costs, alpha, levels, choice.block_sizes, through)
        pairs = [self._paced(r, a, b) for r, (a, b) in zip(rates, itertools.pairwise(levels), strict=True)]
        return expected_latency([costs[m] for m in levels], pairs, list(choice.block_sizes))

    def _chain_costs(self, costs: Sequence[Cost], alpha, levels: Sequence[int]) -> list[Cost]:
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

    def _paced(self, rate: Acceptance, a: int, b: int) -> Acceptance:
        """Pair (a, b)'s ``rate`` as the batch's slowest row accepts (``row_spread``): with one draft
        every row drafts and is verified in step, so the batch runs as many rounds as that row
        needs (the batch replay with rows apart: within about 10 % of it for one draft on the zoo's
        batch-16 profile; below it for two, whose rows also fall out of step). One row, or no
        spread: ``rate``."""
        if self.spread is None or self.rows <= 1:
            return rate
        return row_rate(rate, self.spread[a][b], slowest_row_z(self.rows))

    def correction(self, choice: Choice) -> float:
        """Measured / modelled seconds per token of the hierarchies over ``choice``'s chain that
        ran (module doc), shrunk by ``CORRECTION_PRIOR`` tokens per row towards the drafting
        chains' pooled correction (plain decoding: towards 1)."""
        towards = self.drafting if choice.drafts else 1.0
        measured, modelled, tokens = self.measured.get(_chain(choice), (0.0, 0.0, 0.0))
        return _shrunk(measured, modelled, tokens, towards)

    def _measure(self, costs: Sequence[Cost], alpha) -> None:
        """Fold the seconds per token delivered since the last decision (``unpredicted``) into
        their chains' corrections, against the model's prediction on the current estimates."""
        for counts in self.measured.values():
            counts *= CORRECTION_FADE ** (self.looks - self.measured_at)
        self.measured_at = self.looks
        for choice, (seconds_rows, tokens, per_row) in self.unpredicted.items():
            delivered = seconds_rows / tokens  # seconds per token of a row
            counts = self.measured.setdefault(_chain(choice), np.zeros(3))
            counts += (delivered * per_row, self.modelled(choice, costs, alpha) * per_row, per_row)
        self.unpredicted = {}
        drafting = [counts for (drafts, _), counts in self.measured.items() if drafts]
        self.drafting = _shrunk(*np.sum(drafting, axis=0), 1.0) if drafting else 1.0

    def __call__(self, seen: Observation) -> Choice:
        if seen.round == 0:  # a new request, whose text may differ: the probes' waits start afresh
            self.probed_in_vain = {}
            if self.current is not None and len(seen.committed) == self.batch:
                return self._next_request()
        self.batch = len(seen.committed)
        before = self.current if seen.round > 0 else None  # round 0: a new request starts
        self.current = self._decide(seen)
        self.steady = self.steady + 1 if self.current == before else 0
        self.interval = self._interval()
        return self.current

    def finished(self, seen: Observation) -> None:
        """The run ended (``switching_types.Policy``): the rounds after its last look are learnt like a
        look's; the decision waits for the next request's first look."""
        self.learn(seen)

    def _next_request(self) -> Choice:
        """A new request with as many rows as the last: the last decision stands (since it, only the
        last request's last rounds were learnt, ``finished``). Its text may differ from the last
        request's, so its first look comes at half the interval that request ended with, not at
        ``every``: deciding again before the first round and restarting at ``every`` made 3-4 looks
        per 128-token request at batch 1, 3.7 ms of the ~95 ms it took compiled on a 2-core CPU
        (docs/design.md, "The adaptive controller")."""
        assert self.current is not None
        self.steady = max(0, (self.interval // self.every).bit_length() - 2)  # interval = every << steady
        self.interval = self._interval()
        return self.current

    def _decide(self, seen: Observation) -> Choice:
        self.learn(seen)
        self.looks += 1
        if self.current is not None and self.decide_seconds > self.decide_share * self.wall:
            return self.current
        started = time.perf_counter()
        costs, alpha = self.costs(), self.alpha()
        self._measure(costs, alpha)
        if self.current is None or self.looks - self.resolved_at >= self.resolve_every:
            self._resolve(costs, alpha)
        options = {*self.shortlist, *self._neighbours(self.current or self.shortlist[0])}
        through = self.through(alpha)  # once for every option scored
        scores = {c: self.predicted(c, costs, alpha, through) for c in options}
        best = min(scores, key=scores.get)
        if self.current is None or scores[best] < (1 - self.margin) * scores[self.current]:
            self.current = best
        self.decisions.append((seen.round, self.current, scores[self.current]))
        self.decide_seconds += time.perf_counter() - started
        return self.current

    def _resolve(self, costs: Sequence[Cost], alpha) -> None:
        """The selector's pick and runner-ups on the current estimates become the shortlist."""
        self.resolved_at = self.looks
        paced = [[self._paced(rate, a, b) for b, rate in enumerate(row)] for a, row in enumerate(alpha)]
        selection = select(costs, paced, self.max_T, through=self.through(alpha))
        self.shortlist = [Choice(tuple(s.chain[:-1]), tuple(s.T)) for s in (selection, *selection.runner_ups)]

    def _neighbours(self, choice: Choice) -> list[Choice]:
        """``choice`` with one block size one up or down, one candidate added or removed, or the
        level-0 draft swapped for another; every candidate in cost order, a lookup level first."""
        out = [choice]
        drafts, T = list(choice.drafts), list(choice.T)
        for i in range(len(T)):
            for step in (-1, 1):
                t = T[i] + step
                if 1 <= t <= self.max_T:
                    out.append(Choice(tuple(drafts), (*T[:i], t, *T[i + 1 :])))
        order = self._cost_order()
        for m in order:
            if m in drafts:
                i = drafts.index(m)
                out.append(Choice(tuple(drafts[:i] + drafts[i + 1 :]), tuple(T[:i] + T[i + 1 :])))
            else:
                grown = sorted([*drafts, m], key=order.index)
                i = grown.index(m)
                out.append(Choice(tuple(grown), (*T[:i], min(4, self.max_T), *T[i:])))
                if drafts:  # swap level 0
                    swapped = sorted([m, *drafts[1:]], key=order.index)
                    if swapped[0] == m:
                        out.append(Choice(tuple(swapped), tuple(T)))
        return [c for c in out if self._valid(c)]

    def _cost_order(self) -> list[int]:
        candidates = range(self.target)
        return sorted(
            candidates, key=lambda m: (not level_zero_only(self.prior_costs[m]), self.prior_costs[m](1))
        )

    def _valid(self, choice: Choice) -> bool:
        lookups = [i for i, m in enumerate(choice.drafts) if level_zero_only(self.prior_costs[m])]
        return lookups in ([], [0]) and len(set(choice.drafts)) == len(choice.drafts)


def _rows(seen: Observation) -> int:
    """The rows still decoding (at least 1)."""
    return max(1, int((~seen.finished).sum()))


def _mean_rate(rate: Acceptance) -> float:
    """One number for a pair's acceptance: a lookup level's per-position rates averaged."""
    return float(np.mean(rate)) if isinstance(rate, tuple) else float(rate)


def _raised(rate: float, trials: float) -> float:
    """``rate`` at the upper end of what ``trials`` Bernoulli trials on top of the prior's
    ``PRIOR_TOKENS`` allow: two standard errors up."""
    return min(1.0, rate + 2 * (rate * (1 - rate) / (PRIOR_TOKENS + trials)) ** 0.5)


def _shrunk(measured: float, modelled: float, tokens: float, towards: float) -> float:
    """The ratio ``measured / modelled`` over ``tokens`` tokens per row, shrunk towards ``towards``
    as if ``CORRECTION_PRIOR`` more had measured that, in logs: a ratio is a factor, and one look
    over a request's last few tokens (at batch 16, rows waiting on the slowest: 11x the model)
    must not move a chain's correction far on its little weight."""
    if tokens <= 0 or modelled <= 0 or measured <= 0:
        return towards
    logs = math.log(measured / modelled) * tokens + math.log(towards) * CORRECTION_PRIOR
    return math.exp(logs / (tokens + CORRECTION_PRIOR))


def _chain(choice: Choice) -> tuple:
    """What a correction is kept per: the levels (a token tree or none), whatever the block sizes."""
    return choice.drafts, choice.tree


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
