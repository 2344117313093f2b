"""What a selection produces, as plain data: the ``Selection`` (candidate indices and block sizes,
the selector's answer), the ``Hierarchy`` (those indices bound to draft models: what ``generate``
and ``wrap`` take), the ``TreeDraft`` candidate and the warnings about a selection.

A leaf, so the request path can check ``hierarchy=`` without importing the selector or the profiler:
``hsd_fast.selector`` computes a ``Selection`` and ``hsd_fast.hierarchy`` (``select_hierarchy``)
binds it.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from hsd_fast.lookup import LookupDraft
from hsd_fast.tree import Tree

DEFAULT_MAX_T = 8
"""The largest block size the selector, the latency controller and an adaptive run consider unless
told otherwise. A verification of T tokens feeds T + 1 columns, run at a bucket of widths
(``layout.BUCKETS``: ..., 8, 12, 16): T = 7 fills 8 columns, the next full bucket is T = 11. On the
zoo, compiled, CPU, ``lookup > s`` at T = 11 ran no faster than at T = 7 (docs/design.md §8.8)."""


@dataclass(frozen=True)
class Selection:
    """A chain of candidate indices (drafts smallest first, the target last) with block sizes T."""

    chain: tuple[int, ...]
    T: tuple[int, ...]
    predicted_latency: float  # seconds per token of each row (exact recursion; at B rows batch_latency)
    speedup_over_ar: float = 1.0
    speedup_over_best_single: float = 1.0
    runner_ups: tuple[Selection, ...] = field(default=(), compare=False)


class HierarchyBatchWarning(UserWarning):
    """A hierarchy runs at a batch size other than the one it was selected for."""


class NoDraftWarning(UserWarning):
    """The selector chose no-draft decoding: the best hierarchy's predicted gain was within the
    latency model's own error."""


@dataclass(frozen=True)
class TreeDraft:
    """A candidate level 0: ``model`` drafting the token tree ``tree``."""

    model: torch.nn.Module
    tree: Tree


@dataclass(frozen=True)
class Profile:
    """What ``select_hierarchy`` chose from: its candidates in the selection's index order (a lookup
    level as its ``LookupDraft``, token trees as ``TreeDraft``s, the target last), their step costs
    (``latency.Cost``) and their acceptance matrix. An adaptive run's controller starts from it."""

    candidates: tuple
    costs: tuple
    alpha: tuple[tuple, ...]
    # how far apart rows accept, per pair (``row_spread``), where the selection was for a batch
    spread: tuple[tuple[float, ...], ...] | None = None
    # ((p, m, v), rate): v's rate on the tokens of proposal level p that m passed (``latency.chain_rates``)
    through: tuple[tuple[tuple[int, int, int], float], ...] = ()
    # the largest block size the selection chose from (a lookup level is replayed up to it): an
    # adaptive run from this profile (``adapt=True``) chooses up to it too
    max_T: int = DEFAULT_MAX_T

    @classmethod
    def of(
        cls,
        candidates: Sequence,
        costs: Sequence,
        alpha: Sequence[Sequence],
        spread=None,
        through=None,
        max_T: int = DEFAULT_MAX_T,
    ) -> Profile:
        """The profile of lists as the selector builds them, frozen into tuples."""
        frozen_spread = None if spread is None else _frozen(spread)
        frozen_through = tuple(sorted((through or {}).items()))
        return cls(tuple(candidates), tuple(costs), _frozen(alpha), frozen_spread, frozen_through, max_T)


def _frozen(matrix: Sequence[Sequence]) -> tuple[tuple, ...]:
    return tuple(tuple(row) for row in matrix)


@dataclass(frozen=True)
class Hierarchy:
    """Draft models (smallest first) and their block sizes T, with what the selector predicted;
    ``tree``: the token tree the first draft drafts (``T[0]`` is then its depth).

    ``selection.chain`` indexes the candidates ``select_hierarchy`` profiled: the ones it was given,
    then the tree candidates it made (``tree_sizes``), the target last; ``runner_ups`` are the
    next-best hierarchies, bound the same way."""

    drafts: tuple[torch.nn.Module | LookupDraft, ...]  # a LookupDraft only first
    T: tuple[int, ...]
    selection: Selection
    runner_ups: tuple[Hierarchy, ...] = ()
    measured_latency: float | None = None  # seconds per token measured with the engine (NaN: too noisy)
    cost_noise: float = 0.0  # relative standard error of the step costs it was chosen on (0: unknown)
    within_noise: bool = False  # its predicted advantage is smaller than that noise can resolve
    tree: Tree | None = None
    batch: int = 1  # rows it was chosen for: its latencies are per token of each row
    no_draft_reason: str | None = None  # why no draft was chosen over a better-predicted chain
    fewer_drafts_reason: str | None = None  # why fewer drafts were chosen over a better-predicted chain
    profile: Profile | None = field(default=None, compare=False, repr=False)  # what it was chosen from

    @property
    def predicted_tokens_per_second(self) -> float:
        """Tokens per second the whole batch is predicted to make."""
        return self.batch / self.predicted_latency

    @classmethod
    def bind(
        cls, selection: Selection, models: Sequence[torch.nn.Module | LookupDraft | TreeDraft], batch: int = 1
    ) -> Hierarchy:
        """``selection`` (chosen for ``batch`` rows) with its drafts taken from ``models`` (the
        candidates, the target last)."""
        drafts = [models[i] for i in selection.chain[:-1]]
        tree = drafts[0].tree if drafts and isinstance(drafts[0], TreeDraft) else None
        return cls(
            drafts=tuple(d.model if isinstance(d, TreeDraft) else d for d in drafts),
            T=selection.T if tree is None else (tree.depth, *selection.T[1:]),
            selection=selection,
            runner_ups=tuple(cls.bind(s, models, batch) for s in selection.runner_ups),
            tree=tree,
            batch=batch,
        )

    @property
    def chain(self) -> tuple[int, ...]:
        return self.selection.chain

    def warn_unless_selected_for(self, rows: int) -> None:
        """A ``HierarchyBatchWarning`` when it runs ``rows`` rows but was selected for another batch:
        a step's cost grows with the rows it feeds, so drafts that pay at one batch can cost more than
        they save at another (docs/design.md, "Selecting for a batch")."""
        if rows != self.batch:
            warnings.warn(
                f"this hierarchy was selected for batch {self.batch} and runs a batch of {rows}: it may "
                f"be slower there than plain decoding; select_hierarchy(..., batch={rows}) picks for it",
                HierarchyBatchWarning,
                stacklevel=3,
            )

    @property
    def predicted_latency(self) -> float:
        return self.selection.predicted_latency

    @property
    def speedup_over_ar(self) -> float:
        return self.selection.speedup_over_ar

    @property
    def speedup_over_best_single(self) -> float:
        return self.selection.speedup_over_best_single
