"""The adaptive controller (docs/design.md, "The adaptive controller"): a policy for an adaptive run
(``generate(..., adapt=...)``) that re-solves the latency model on estimates from the running request.

Terms. The *candidates* are an adaptive run's levels under the target; index ``n`` (their count) is
the target. A *pair* (i, j) is candidate i verified by j. The *prior* is a profile: step costs per
candidate and the pairwise acceptance matrix, measured on calibration text in another process. The
run corrects both as it decodes (``run_estimates``: each candidate's cost scale, a lookup level's
proposal lengths at each block size, each pair's acceptance per block position, the rates through
a lookup level); the controller decides on them:

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
  the candidate would hand up of them (``RunEstimates.through``).
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
than ``margin`` (hysteresis: an estimate's noise must not make it flap); the hierarchy a run started
from (``Adaptive.start``, a pick) is the current one at its first look. The full selector runs at
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
from dataclasses import replace

import numpy as np

from hsd_fast.hierarchy_types import DEFAULT_MAX_T, Hierarchy
from hsd_fast.latency import Acceptance, Cost, LookupCost, Through, chain_rates, expected_latency, reindexed
from hsd_fast.lookup import level_identity
from hsd_fast.row_spread import Spread, row_rate, sigma_of, slowest_row_z
from hsd_fast.run_estimates import PRIOR_TOKENS, RunEstimates, mean_rate
from hsd_fast.selector import level_zero_only, select
from hsd_fast.switching_types import Choice, Observation

_KEPT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # hierarchy -> {candidates: controller}

CORRECTION_PRIOR = 4.0
"""Tokens per row (about a look's) the model's own prediction counts as in a chain's correction."""
CORRECTION_FADE = 0.98
"""What a chain's measurements keep per look: they halve every 34 looks. What they correct (a batch's
tail, host work, a cost curve's shape) belongs to the setting more than to the text, which the
acceptance and proposal estimates follow; and a chain the run left is tried again only once its
measurements have faded enough for the model's preference to win, every few hundred looks where
the model errs by 2x."""
RECENT_LOOKS = 16
"""Looks whose host time, and the time per round of the rounds before them, set the look interval
(medians: one round held up by the machine must not move it)."""


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
    (``latency.chain_rates``), corrected by the chains that run (``RunEstimates.through``);
    ``later_calls_apart``: under a middle model, count a lookup level's calls after the first of
    the middle model's run apart and price chains with them (``RunEstimates.later_calls``). Off by default: it
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
        if spread is not None and (len(spread) != n or any(len(row) != n for row in spread)):
            raise ValueError(f"the spread matrix must be {n} x {n}, like alpha")
        self.estimates = RunEstimates(costs, alpha, through, later_calls_apart)
        self.spread = None if spread is None else [[sigma_of(s) for s in row] for row in spread]
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

    # ------------------------------------------------------------------ learning, probes
    @property
    def target(self) -> int:
        return self.estimates.target

    def learn(self, seen: Observation) -> None:
        """Fold the round ``seen`` reports into the estimates (``RunEstimates.learn``), the wall and
        probe seconds, a look's cost against the rounds it spaced, and the seconds per token that
        await the model's prediction (``_measure``)."""
        self.wall += seen.round_seconds
        self.probe_seconds += sum(found.seconds for found in seen.probes)
        self.estimates.learn(seen)
        if seen.choice is None:
            return
        joined = set(seen.choice.drafts) - set(self.last_chain[0] if self.last_chain else ())
        # a request's first look holds its prefill, a model's first after joining its catch-up, and a
        # look over warm-up steps (run eagerly while their shape waits to compile: 2-5x the model's time
        # in a process's first requests) what they cost: costs of starting, not of running
        starting = (
            seen.round <= 1
            or seen.warming
            or any(not isinstance(self.estimates.prior_costs[m], LookupCost) for m in joined)
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
            if m not in self.current.drafts and not level_zero_only(self.estimates.prior_costs[m])
            and (m not in self.last_probe or self.looks - self.last_probe[m] >= self._probe_wait(m))
        ]  # fmt: skip
        if not idle:
            return []
        started = time.perf_counter()  # the gate's own time counts as probing
        considered = min(idle, key=lambda m: self.last_probe.get(m, -1))
        self.last_probe[considered] = self.looks  # considered: probed or not, not again for a while
        worth = self._worth_probing(considered, self.estimates.costs(), self.estimates.alpha())
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
        counted = self.estimates.trials.get((m, self.target))
        optimistic = [list(row) for row in alpha]
        optimistic[m][self.target] = _raised(
            mean_rate(alpha[m][self.target]), 0.0 if counted is None else counted[1].sum()
        )
        through = self.estimates.through(alpha)
        raised = dict(through)
        for chain, rates in through.items():
            if chain[1:] == (m, self.target):
                probed = self.estimates.through_probed.get(chain, np.zeros(6))
                ran = self.estimates.through_trials.get(chain, np.zeros(5))[1]
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
        """The controller's view in lines of text: the estimates (``RunEstimates.describe``), each
        pair that ran as the batch's slowest row would take it, each chain's measured / modelled
        seconds, its look interval and what sets it, and its last decisions. ``names``: the
        candidates', then the target's."""
        costs, alpha = self.estimates.costs(), self.estimates.alpha()
        lines = self.estimates.describe(names, costs, alpha)
        if self.spread is not None and self.estimates.rows > 1:
            z = slowest_row_z(self.estimates.rows)
            lines.append(
                f"  priced at the slowest of {self.estimates.rows} rows (z {z:.2f}), per pair that ran:"
            )
            lines += [
                f"    {names[i]} > {names[j]}: {mean_rate(self._paced(alpha[i][j], i, j)):.2f} "
                f"(spread {self.spread[i][j]:.2f})"
                for i, j in sorted(self.estimates.trials)
            ]
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
        through = self.estimates.through(alpha) if through is None else through
        costs = self.estimates.chain_costs(costs, alpha, levels)
        rates = chain_rates(costs, alpha, levels, choice.block_sizes, through)
        pairs = [self._paced(r, a, b) for r, (a, b) in zip(rates, itertools.pairwise(levels), strict=True)]
        return expected_latency([costs[m] for m in levels], pairs, list(choice.block_sizes))

    def _paced(self, rate: Acceptance, a: int, b: int) -> Acceptance:
        """Pair (a, b)'s ``rate`` as the batch's slowest row accepts (``row_spread``): with one draft
        every row drafts and is verified in step, so the batch runs as many rounds as that row
        needs (the batch replay with rows apart: within about 10 % of it for one draft on the zoo's
        batch-16 profile; below it for two, whose rows also fall out of step). One row, or no
        spread: ``rate``."""
        if self.spread is None or self.estimates.rows <= 1:
            return rate
        return row_rate(rate, self.spread[a][b], slowest_row_z(self.estimates.rows))

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
        costs, alpha = self.estimates.costs(), self.estimates.alpha()
        self._measure(costs, alpha)
        if self.current is None or self.looks - self.resolved_at >= self.resolve_every:
            self._resolve(costs, alpha)
        if self.current is None and seen.choice is not None and seen.choice.tree is None:
            # the hierarchy the run started from (a pick): held as any choice of its own, until the
            # model predicts another faster by the margin (the selector may have preferred it to one
            # predicted a little faster, ``selector.prefer_fewer_drafts``)
            self.current = seen.choice
        options = {*self.shortlist, *self._neighbours(self.current or self.shortlist[0])}
        through = self.estimates.through(alpha)  # once for every option scored
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
        selection = select(costs, paced, self.max_T, through=self.estimates.through(alpha))
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
            candidates,
            key=lambda m: (
                not level_zero_only(self.estimates.prior_costs[m]),
                self.estimates.prior_costs[m](1),
            ),
        )

    def _valid(self, choice: Choice) -> bool:
        lookups = [i for i, m in enumerate(choice.drafts) if level_zero_only(self.estimates.prior_costs[m])]
        return lookups in ([], [0]) and len(set(choice.drafts)) == len(choice.drafts)


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
