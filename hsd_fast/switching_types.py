"""The types of hierarchies that change between rounds (docs/design.md, "Switching hierarchies"):
a ``Choice`` over the candidates, what a policy sees (``Observation``) and returns, how a run is told
to adapt (``Adaptive``), and what it reports of each hierarchy it used (``HierarchyUsed``). The
machinery is ``switching.py``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from hsd_fast.hierarchy_types import DEFAULT_MAX_T
from hsd_fast.tree import Tree


@dataclass(frozen=True)
class Choice:
    """A hierarchy over the candidates: ``drafts`` indexes the candidates that run under the target
    (smallest first, each once, a lookup level only first; empty: no draft), ``T`` one block size
    per draft, ``tree`` a token tree the first draft (a model) drafts, its depth standing for
    ``T[0]``."""

    drafts: tuple[int, ...] = ()
    T: tuple[int, ...] = ()
    tree: Tree | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "drafts", tuple(int(d) for d in self.drafts))
        object.__setattr__(self, "T", tuple(int(t) for t in self.T))

    @property
    def block_sizes(self) -> list[int]:
        """The ledger's block sizes: ``T``, a tree's depth standing for the first."""
        return list(self.T) if self.tree is None else [self.tree.depth, *self.T[1:]]


@dataclass(frozen=True)
class Adaptive:
    """How an adaptive run chooses: ``policy``, the hierarchy to start with (None: the policy's
    first choice), the largest block size a choice may have (the ring of draft distributions is
    sized for it) and the token trees a choice may draft."""

    policy: Policy | None  # None: the built-in ``ExploreThenCommit``, fresh for every run
    start: Choice | None = None
    max_T: int = DEFAULT_MAX_T
    trees: tuple[Tree, ...] = ()


Policy = Callable[["Observation"], Choice]
"""A function from what the run has seen to the hierarchy of the next round. A policy object may
also have ``look_every``, an int read at the start and after every look: the run shows it a row's
rounds only every that many round ends (1 by default; the rounds between are decoded in the same
hierarchy and reported together at the next look), ``wants_probes(seen: Observation) ->
Sequence[int]``: the idle candidates to probe at this look, after its choice (their results come
with the next observation; greedy runs only), ``finished(seen: Observation) -> None``: shown the
rounds after the last look when the run ends (every row done; no choice follows), and ``max_T``,
an int: the largest block size it chooses (``adapt=policy`` runs with ``Adaptive(policy, max_T=)``;
default 8). One policy object
may serve many runs: each after its first is keyed apart from the seed's first (``switching.take_run``)."""


@dataclass(frozen=True)
class Observation:
    """What the run shows its policy at a round's end. Everything here was decided by randomness
    the run will not use again (docs/design.md, "Switching hierarchies")."""

    round: int  # looks so far (0: nothing decoded yet, the policy picks the first hierarchy)
    epoch: int  # the epoch whose keys the levels below the target used in those rounds
    choice: Choice | None  # the hierarchy of the round that just ended (None before the first)
    num_candidates: int
    lookup_first: bool  # candidate 0 is a lookup level (no model: it drafts no tree)
    trees: tuple[Tree, ...]  # the token trees a choice may draft
    committed: np.ndarray  # [B] committed tokens per row, prompt included
    finished: np.ndarray  # [B] bool
    tokens: (
        torch.Tensor
    )  # [B, S] the run's token buffer, a view to read: row r's first committed[r] are its own
    round_tokens: int  # tokens the last round committed, all rows
    round_seconds: float  # its wall-clock time, the switch before it included
    look_seconds: float = 0.0  # of that, the host time of the look before it (policy, probes, switch)
    verified: tuple[np.ndarray, ...] = ()  # per level >= 1 of ``choice``: drafts of each verification
    accepted: tuple[np.ndarray, ...] = ()  # per level >= 1: accepted drafts of each verification
    # per level >= 1: whether each verification opened the level's run (the first of its run, right
    # after the level above verified: none of the level's own tokens waited; the target's all do)
    opens: tuple[np.ndarray, ...] = ()
    step_sizes: tuple[np.ndarray, ...] = ()  # per level: each step's tokens drawn (level 0) or widest fed
    step_seconds: tuple[np.ndarray, ...] = ()  # per level: each step's seconds inside its step function
    probes: tuple[Probe, ...] = ()  # what the probes the policy asked for at the last look found
    # a compiled run ran a step eagerly in these rounds, its shape waiting to compile: their times
    # are a warm-up's, not what the hierarchy costs once warm
    warming: bool = False
    rounds: int = 1  # round ends since the last look, the most of any row: the rounds this look reports


@dataclass(frozen=True)
class Probe:
    """A probe of an idle candidate (docs/design.md, "Probes"): at a look, the candidate was fed the
    committed tokens its cache lacked (which also keeps its cache current) and scored at the
    ``positions`` of them whose next token the target generated: ``agreed`` of those next tokens
    were its argmax. In a greedy run that is the candidate's acceptance rate as the draft under
    the target, on this request's own text."""

    candidate: int
    positions: int  # scored positions, all rows
    agreed: int  # of them, where the candidate's argmax was the committed next token
    seconds: float  # the probe's forwards, host clock
    proposals: ProposalsProbed | None = None  # where a lookup level is a candidate too


@dataclass(frozen=True)
class ProposalsProbed:
    """What a probe of model candidate m found on the lookup level's proposals (docs/design.md,
    "Probes"): the lookup replayed on the probed committed text as it proposes under the target,
    m scored as the level between them (lookup > m > target), as a profile's replay scores it on
    calibration text (``proposal_scores``), all rows summed. Trials are weighted counts."""

    lookup: int  # the lookup level's candidate index
    passed: np.ndarray  # [T] per block position j: m accepted the proposal's j-th token ...
    tried: np.ndarray  # [T] ... of those whose tokens 1..j-1 it accepted
    kept: tuple[float, float]  # the target on the proposed tokens m accepted: (passed, tried)
    corrections: tuple[float, float]  # the target on m's own token where it rejected one: (passed, tried)
    own: tuple[float, float]  # the target on m's other own tokens (bonus, draft where none was offered)


@dataclass
class HierarchyUsed:
    """One stretch of an adaptive run under one hierarchy: from which round, which, and what
    switching to it cost (the host's reconfiguration, and the committed tokens the joining levels'
    caches lacked: they feed them with their first step)."""

    from_round: int
    choice: Choice
    switch_seconds: float = 0.0
    catch_up_tokens: int = 0
    rounds: int = 0
    committed: int = 0  # tokens committed under it
    seconds: float = 0.0  # wall-clock seconds decoded under it
