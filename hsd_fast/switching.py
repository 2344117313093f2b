"""Hierarchies that change between rounds (docs/design.md, "Switching hierarchies").

Terms. The *candidates* are the levels a run may put under the target, smallest first (a lookup
level only first). A ``Choice`` is a hierarchy over them: which candidates run (a sub-chain, none at
all included), their block sizes and a token tree the first draft model drafts. A *round* ends when
every unfinished row's speculative tokens have all been verified by the target: rows that finish
their round first are held by the ledger until the others have. At each round's end the run shows
the policy an ``Observation`` and decodes the next round with the ``Choice`` it returns.

Exactness under any policy rests on two rules the engine keeps, whatever the policy does:

- the policy looks only at round ends, when no row holds a speculative token (nothing it saw is
  still to be verified), and
- every look starts a new *epoch*: the levels below the target key their randomness with the
  epoch's seeds (``SamplingMetadata.start_epoch``), so no uniform a lower level will still use can
  have influenced what the policy saw. The target keys with the row seed as always: of its uniforms,
  those at positions not yet committed have influenced nothing.

This module holds the bookkeeping of a switch (``Switcher``: which candidate's cache holds how much
of each row, the ledger reconfigured in one operation) and the built-in policy; the types are in
``switching_types.py``.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Sequence

import numpy as np
import torch

from hsd_fast._C import Ledger
from hsd_fast.round_log import RoundLog
from hsd_fast.sampling_metadata import SamplingMetadata
from hsd_fast.switching_types import Adaptive, Choice, HierarchyUsed, Observation, Probe

Prober = Callable[[int, np.ndarray, np.ndarray, np.ndarray], Probe]
"""(candidate, rows, cached starts, ends) -> what feeding it those committed positions found
(``probes.probe`` bound to the run: docs/design.md, "Probes")."""


class Switcher:
    """An adaptive run's switching state: which prefix of every row each candidate's cache holds (a
    level that leaves keeps its cache for a later return: it is valid on the committed prefix, which
    never changes), the epoch, the rounds, and the hierarchies used. ``candidates`` levels may sit
    under the target (index ``candidates``); ``lookup_first``: candidate 0 is a lookup level."""

    def __init__(
        self,
        candidates: int,
        adapt: Adaptive,
        lookup_first: bool,
        prompt_lens: np.ndarray,  # [B]
        budget_end: np.ndarray,  # [B] where each row's length budget ends
        tokens: torch.Tensor,  # [B, S] the run's token buffer
        prober: Prober | None = None,  # None: this run does not probe (sampled, or token trees offered)
    ) -> None:
        self.candidates, self.adapt, self.lookup_first, self.tokens = candidates, adapt, lookup_first, tokens
        self.prober, self.probes = prober, ()  # probes wait for the next observation
        self.probe_seconds = 0.0
        self.budget_end = budget_end
        self.policy = adapt.policy if adapt.policy is not None else ExploreThenCommit()
        self.look_every = self._look_every()
        self.rounds_since_look = np.zeros(len(prompt_lens), dtype=np.int64)  # [B]
        self.cached = np.zeros((candidates + 1, len(prompt_lens)), dtype=np.int64)  # [candidates + 1, B]
        self.epoch = self.round = 0
        self.look_seconds = 0.0  # host time of the looks: the policy, the epoch, the reconfiguration
        self.last_look_seconds = 0.0  # of the last look (shown to the policy with the rounds after it)
        self.used: list[HierarchyUsed] = []
        self.committed = prompt_lens.copy()  # [B] at the last round's end
        self.marks: tuple | None = None  # what the round log held at the last look (None: nothing)
        self.warm_up_steps = 0  # the run's warm-up steps (``DecodeState.warm_up_steps``) at the last look
        self.last_look = time.perf_counter()

    def first(self) -> Choice:
        """The hierarchy of the first round: ``adapt.start``, or the policy's choice before anything
        was decoded."""
        start = self.adapt.start
        if start is None:
            start = self.policy(self._observation(None, np.zeros_like(self.committed, dtype=bool), {}))
        return self.check(start)

    def begin(self, choice: Choice, sampling: SamplingMetadata) -> None:
        """The run starts with ``choice`` in epoch 1 (epoch 0, the target's own seeds, is for runs
        that never switch: here a lower level's keys must never meet the target's)."""
        self.sampling, self.epoch = sampling, 1
        sampling.start_epoch(self.epoch)
        self.look_every = self._look_every()  # the first choice may have changed it
        self.used.append(HierarchyUsed(0, choice))
        self.last_look = time.perf_counter()

    def _look_every(self) -> int:
        """A policy may look only every few rounds (asked again after each look: it may change):
        a row's round end holds it only at that count."""
        return max(1, int(getattr(self.policy, "look_every", 1)))

    def rounds_ended(self, rows: np.ndarray) -> np.ndarray:
        """``rows`` each ended a round: those of them to hold for the next look (the policy's
        ``look_every``-th round end since the last look; the others go on in the same hierarchy)."""
        self.rounds_since_look[rows] += 1
        return rows[self.rounds_since_look[rows] >= self.look_every]

    def round_end(self, ledger: Ledger, choice: Choice, log: RoundLog, warm_up_steps: int = 0) -> Choice:
        """Every unfinished row has ended its round (held): show the policy what happened, start a new
        epoch, and reconfigure the ledger for the hierarchy it chose (the same one included: the
        holds are released). ``warm_up_steps``: the run's steps so far that ran eagerly while their
        shape waited to compile (``DecodeState.warm_up_steps``). Returns that hierarchy."""
        now = time.perf_counter()
        committed = ledger.frontiers()[:, -1]  # [B]
        # at a round's end a row holds an EOS only if it is committed: then it is finished
        finished = (ledger.eos_positions() >= 0) | (committed >= self.budget_end)
        self.keep_caches(choice, ledger.cached_lens())
        self._count_stretch(committed, now)
        seen = self._looked_at(choice, finished, log, committed, now, warm_up_steps)
        chosen = self.check(self.policy(seen))
        self.look_every = self._look_every()
        self.epoch += 1  # the policy has looked: nothing a lower level draws from here on was seen
        self.sampling.start_epoch(self.epoch)
        cached = self.caches_for(chosen, committed)  # [levels, B]
        ledger.reconfigure(chosen.block_sizes, cached.T.reshape(-1).tolist())
        self.probes = self._probe(seen, chosen, committed, finished)
        if chosen != choice:
            joining = [i for i, c in enumerate(self.levels_of(chosen)) if c not in self.levels_of(choice)]
            catch_up = int((committed[None, :] - cached[joining]).sum())
            self.used.append(
                HierarchyUsed(self.round, chosen, catch_up_tokens=catch_up)
            )  # timed by the engine
        self.committed, self.last_look = committed, now
        self.rounds_since_look[:] = 0
        self.marks = log.marks() if chosen == choice else None
        return chosen

    def finish(self, ledger: Ledger, choice: Choice, log: RoundLog, warm_up_steps: int = 0) -> None:
        """The run ended: the rounds since the last look count for the hierarchy that ran them
        (``choice``), and a policy with ``finished`` (``switching_types.Policy``) is shown them: no
        look follows, and without it a short request's last rounds, up to half of them, would teach
        it nothing. Its time counts as a look's."""
        now = time.perf_counter()
        committed = ledger.frontiers()[:, -1]  # [B]
        self._count_stretch(committed, now)
        finished = getattr(self.policy, "finished", None)
        if finished is None or not self.rounds_since_look.any():
            return
        done = np.ones(len(committed), dtype=bool)  # every row: the run is over
        finished(self._looked_at(choice, done, log, committed, now, warm_up_steps))
        self.look_seconds += time.perf_counter() - now

    def _looked_at(
        self,
        choice: Choice,
        finished: np.ndarray,
        log: RoundLog,
        committed: np.ndarray,
        now: float,
        warm_up_steps: int,
    ) -> Observation:
        """The observation of a look (or of the run's end) at ``now``: the rounds since the last one."""
        self.round += 1
        warming = warm_up_steps > self.warm_up_steps
        self.warm_up_steps = warm_up_steps
        return self._observation(choice, finished, log.since(self.marks), committed, now, warming)

    def _count_stretch(self, committed: np.ndarray, now: float) -> None:
        """Add the rounds, tokens and seconds since the last look to the hierarchy that ran them."""
        current = self.used[-1]
        current.rounds += int(self.rounds_since_look.max(initial=1))
        current.committed += int((committed - self.committed).sum())
        current.seconds += now - self.last_look

    def looked(self, seconds: float) -> None:
        """The engine timed a look (``round_end`` and the chain it built): ``seconds`` of host time."""
        self.look_seconds += seconds
        self.last_look_seconds = seconds

    def _probe(self, seen: Observation, chosen: Choice, committed: np.ndarray, finished: np.ndarray) -> tuple:
        """Run the probes the policy wants at this look (``Policy``): idle model candidates only,
        each fed the committed tokens its cache lacks in the unfinished rows."""
        wants = getattr(self.policy, "wants_probes", None)
        if self.prober is None or wants is None:
            return ()
        rows = np.flatnonzero(~finished)
        ends = np.maximum(committed[rows] - 1, 0)  # [R]
        idle = set(range(int(self.lookup_first), self.candidates)) - set(chosen.drafts)
        wanted = dict.fromkeys(int(c) for c in wants(seen))  # asked every look: the policy keeps its schedule
        found = []
        for candidate in (c for c in wanted if c in idle and len(rows)):
            starts = np.minimum(self.cached[candidate, rows], ends)
            found.append(self.prober(candidate, rows, starts, ends))
            self.cached[candidate, rows] = ends
            self.probe_seconds += found[-1].seconds
        return tuple(found)

    def _observation(
        self, choice, finished, logged: dict, committed=None, now=None, warming: bool = False
    ) -> Observation:
        committed = self.committed if committed is None else committed
        return Observation(
            round=self.round,
            epoch=self.epoch,
            choice=choice,
            num_candidates=self.candidates,
            lookup_first=self.lookup_first,
            trees=self.adapt.trees,
            committed=committed.copy(),
            finished=finished,
            tokens=self.tokens,
            round_tokens=int((committed - self.committed).sum()),
            round_seconds=0.0 if now is None else now - self.last_look,
            look_seconds=self.last_look_seconds,
            probes=self.probes,
            warming=warming,
            rounds=int(self.rounds_since_look.max(initial=0)),
            **logged,
        )

    def check(self, choice: object) -> Choice:
        """``choice`` if the run can decode it, else a TypeError / ValueError that names the policy."""
        if not isinstance(choice, Choice):
            raise TypeError(f"an adaptive policy must return a hsd_fast.Choice, got {type(choice).__name__}")
        drafts, n, max_T = choice.drafts, self.candidates, self.adapt.max_T
        if any(not 0 <= d < n for d in drafts) or len(set(drafts)) != len(drafts):
            raise ValueError(f"policy chose drafts {list(drafts)}: candidate indices in [0, {n}), each once")
        if self.lookup_first and 0 in drafts[1:]:
            raise ValueError(
                f"policy chose drafts {list(drafts)}: the lookup level (0) can only be the first"
            )
        if len(choice.T) != len(drafts) or any(not 1 <= t <= max_T for t in choice.T):
            raise ValueError(
                f"policy chose T={list(choice.T)} for drafts {list(drafts)}: one block size per draft, each "
                f"in [1, {max_T}] (max_T)"
            )
        if choice.tree is not None:
            if choice.tree not in self.adapt.trees:
                raise ValueError("policy chose a token tree the run was not given (adapt trees=)")
            if not drafts or (self.lookup_first and drafts[0] == 0):
                raise ValueError("policy chose a token tree: it is drafted by a draft model at level 0")
        return choice

    def levels_of(self, choice: Choice) -> list[int]:
        """The candidate index of each level of ``choice``, the target's last."""
        return [*choice.drafts, self.candidates]

    def keep_caches(self, choice: Choice, cached_lens: np.ndarray) -> None:
        """At a round's end: what each level of ``choice`` holds now (the ledger's ``cached_lens``,
        ``[B, levels]``) becomes its candidate's."""
        self.cached[self.levels_of(choice)] = np.asarray(cached_lens).T

    def caches_for(self, choice: Choice, committed: np.ndarray) -> np.ndarray:
        """The cached lengths ``[levels, B]`` the ledger starts ``choice`` with: each candidate's own
        cache, at most the committed prefix but its last token (which every level feeds next, for
        the logits after it; a lookup level has no cache)."""
        levels = self.levels_of(choice)
        last = np.maximum(committed - 1, 0)[None, :]  # [1, B]
        cached = np.minimum(self.cached[levels], last)  # [levels, B]
        if self.lookup_first and choice.drafts and choice.drafts[0] == 0:
            cached[0] = last[0]
        return cached


_RUNS_SERVED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # policy -> runs it served
_RUNS_SERVED_BY_ID: dict[int, int] = {}  # a policy that cannot be weakly referenced (or hashed)


def take_run(policy: object) -> int:
    """The runs ``policy`` served before this one, this one now counted (None, the built-in policy
    made fresh for the run: 0; a bound method: its object's runs, which hold its state). An adaptive
    run keys its randomness by it (``sampling_metadata.run_seeds``): exactness holds for a policy's
    runs with the same seed too. State a policy keeps elsewhere (a global, an object it is built
    around anew for every run) is not seen: such runs need seeds of their own."""
    if policy is None:
        return 0
    holder = getattr(policy, "__self__", None)
    policy = policy if holder is None else holder
    try:
        served = _RUNS_SERVED.get(policy, 0)
        _RUNS_SERVED[policy] = served + 1
    except TypeError:  # unhashable, or no weak references: by id (a reused id only changes the keys)
        served = _RUNS_SERVED_BY_ID.get(id(policy), 0)
        _RUNS_SERVED_BY_ID[id(policy)] = served + 1
    return served


def no_draft() -> Choice:
    """The target alone."""
    return Choice()


class ExploreThenCommit:
    """The built-in policy: try each hierarchy of ``choices`` for ``explore_rounds`` rounds, decode
    with the one that committed the most tokens per second, and try them all again every
    ``period`` rounds (text changes as a request goes on). The measure includes what switching
    cost. Until a latency model steers it, this is a plain bandit over a few hierarchies.

    ``choices``: by default no draft, each candidate alone (a model candidate also with each tree
    offered) and all candidates together, with block size ``T``."""

    def __init__(
        self, choices: Sequence[Choice] | None = None, T: int = 4, explore_rounds: int = 3, period: int = 64
    ) -> None:
        if explore_rounds < 1 or period < 1:
            raise ValueError("explore_rounds and period must be >= 1")
        self.choices = list(choices) if choices is not None else None
        self.T, self.explore_rounds, self.period = T, explore_rounds, period
        self.tokens: dict[Choice, float] = {}
        self.seconds: dict[Choice, float] = {}
        self.best: Choice | None = None

    def default_choices(self, seen: Observation) -> list[Choice]:
        n = seen.num_candidates
        singles = [Choice((i,), (self.T,)) for i in range(n)]
        models = range(1 if seen.lookup_first else 0, n)
        trees = [Choice((i,), (t.depth,), t) for i in models for t in seen.trees]
        everything = [Choice(tuple(range(n)), (self.T,) * n)] if n > 1 else []
        return [no_draft(), *singles, *trees, *everything]

    def __call__(self, seen: Observation) -> Choice:
        if self.choices is None:
            self.choices = self.default_choices(seen)
        if seen.choice is not None and seen.round_seconds > 0:
            self.tokens[seen.choice] = self.tokens.get(seen.choice, 0.0) + seen.round_tokens
            self.seconds[seen.choice] = self.seconds.get(seen.choice, 0.0) + seen.round_seconds
        cycle = seen.round % self.period
        exploring = len(self.choices) * self.explore_rounds
        if cycle < exploring:
            if cycle == 0:  # a new exploration: forget the old measurements
                self.tokens, self.seconds = {}, {}
            return self.choices[cycle // self.explore_rounds]
        if cycle == exploring or self.best is None:
            rates = {c: self.tokens.get(c, 0.0) / s for c in self.choices if (s := self.seconds.get(c))}
            self.best = max(rates, key=rates.get) if rates else self.choices[0]
        return self.best
