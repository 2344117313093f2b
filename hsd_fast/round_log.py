"""What every round of a run did, kept raw while it decodes and summed into ``HSDStats`` once at the
end: a round's own host work stays a few list appends."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hsd_fast.stats import HSDStats
from hsd_fast.tree import Tree


class RoundLog:
    """The rounds of one run under one hierarchy, per level: fed spans, verifications, times."""

    def __init__(self, num_levels: int) -> None:
        self.num_levels = num_levels
        self.spans: list[list[np.ndarray]] = [[] for _ in range(num_levels)]  # fed tokens per row
        self.verifies: list[list[tuple]] = [[] for _ in range(num_levels)]
        self.times: list[list[tuple[float, float]]] = [[] for _ in range(num_levels)]
        self.lookups: list[int] = []  # tokens proposed per lookup round
        self.tree_nodes = 0  # token-tree nodes drafted
        self.ranks: list[np.ndarray] = []  # [depth, R] per tree verification: accepted nodes' ranks

    def drafted(self, starts: np.ndarray, ends: np.ndarray, drawn: np.ndarray) -> None:
        for k in range(int(drawn.max())):  # one lockstep forward per token drawn
            self.spans[0].append(ends - starts if k == 0 else np.ones(int((drawn > k).sum()), dtype=np.int64))

    def drafted_tree(self, starts: np.ndarray, ends: np.ndarray, tree: Tree) -> None:
        """A token tree drafted: the catch-up forward, then one forward per depth but the last."""
        self.spans[0].append(ends - starts)
        for width in tree.widths[:-1]:
            self.spans[0].append(np.full(len(ends), width, dtype=np.int64))
        self.tree_nodes += len(ends) * tree.num_nodes

    def ranked(self, ranks: np.ndarray) -> None:
        self.ranks.append(ranks)

    def proposed(self, counts: np.ndarray) -> None:
        """A lookup round: no forward, ``counts`` [R] tokens proposed."""
        self.spans[0].append(np.zeros(len(counts), dtype=np.int64))
        self.lookups.append(int(counts.sum()))

    def verified(self, level: int, starts, ends, outs, accepted, kept, cascaded) -> None:
        self.spans[level].append(ends - starts)
        self.verifies[level].append((ends - outs - 1, accepted, kept, cascaded))

    def timed(self, level: int, wall: float, inside_step: float) -> None:
        self.times[level].append((wall, inside_step))

    def marks(self) -> list[int]:
        """How many verifications each level has logged so far."""
        return [len(v) for v in self.verifies]

    def verifications_since(self, marks: Sequence[int]) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Per level >= 1: the drafts and the accepted drafts of every verification logged after
        ``marks`` (``[]``: from the start), all rows concatenated (``[N]`` each)."""
        drafts, accepted = [], []
        for level in range(1, self.num_levels):
            since = self.verifies[level][marks[level] if marks else 0 :]
            drafts.append(np.concatenate([v[0] for v in since]) if since else np.zeros(0, dtype=np.int64))
            accepted.append(np.concatenate([v[1] for v in since]) if since else np.zeros(0, dtype=np.int64))
        return drafts, accepted

    def stats(self) -> HSDStats:
        stats = HSDStats(self.num_levels)
        for level in range(self.num_levels):
            for fed in self.spans[level]:
                stats.record_forward(level, len(fed), int(fed.sum()))
            if level == 0 and self.lookups:  # a lookup level: its rounds, no forwards
                stats.record_draft(sum(self.lookups))
            elif level == 0 and self.tree_nodes:
                stats.record_draft(self.tree_nodes)
            elif level == 0:
                stats.record_draft(int(sum(len(fed) for fed in self.spans[0])))
            elif self.verifies[level]:
                stats.record_verify(
                    level, *(np.concatenate(parts) for parts in zip(*self.verifies[level], strict=True))
                )
            for wall, inside in self.times[level]:
                stats.record_time(level, wall, inside)
        if self.ranks:
            stats.record_ranks(np.concatenate([r.ravel() for r in self.ranks]))
        return stats
