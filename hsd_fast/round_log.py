"""What every round of a run did, kept raw while it decodes and summed into ``HSDStats`` once at the
end: a round's own host work stays a few list appends."""

from __future__ import annotations

import numpy as np

from hsd_fast.stats import HSDStats
from hsd_fast.tree import Tree


class RoundLog:
    """The rounds of one run under one hierarchy, per level: fed spans, verifications, times."""

    def __init__(self, num_levels: int) -> None:
        self.num_levels = num_levels
        self.spans: list[list[np.ndarray]] = [[] for _ in range(num_levels)]  # fed tokens per row
        self.verifies: list[list[tuple]] = [[] for _ in range(num_levels)]
        self.opens: list[list[np.ndarray]] = [[] for _ in range(num_levels)]  # per verification, [R] bool
        self.times: list[list[tuple[float, float, int]]] = [
            [] for _ in range(num_levels)
        ]  # wall, inside, size
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

    def verified(self, level: int, starts, ends, outs, accepted, kept, cascaded, opens) -> None:
        """A verification by ``level``; ``opens``: [R] whether it opened the level's run in each row
        (none of the level's own tokens waited for the level above)."""
        self.spans[level].append(ends - starts)
        self.verifies[level].append((ends - outs - 1, accepted, kept, cascaded))
        self.opens[level].append(opens)

    def timed(self, level: int, wall: float, inside_step: float, size: int = 0) -> None:
        """A step of ``level`` took ``wall`` seconds of the round, ``inside_step`` of them in its step
        function; ``size``: what the latency model counts of it (``round_steps.run_step``)."""
        self.times[level].append((wall, inside_step, size))

    def marks(self) -> tuple[list[int], list[int]]:
        """How many verifications and how many steps each level has logged so far."""
        return [len(v) for v in self.verifies], [len(t) for t in self.times]

    def since(self, marks: tuple[list[int], list[int]] | None) -> dict[str, tuple[np.ndarray, ...]]:
        """What was logged after ``marks`` (None: from the start): per level >= 1 the drafts and the
        accepted drafts of every verification and whether it opened the level's run (``verified``,
        ``accepted``, ``opens``: all rows concatenated, ``[N]`` each), and per level the size and
        the seconds inside the step function of every step (``step_sizes``, ``step_seconds``)."""
        verifies, times = marks if marks is not None else ([0] * self.num_levels, [0] * self.num_levels)
        empty = np.zeros(0, dtype=np.int64)
        out: dict[str, list[np.ndarray]] = {
            "verified": [],
            "accepted": [],
            "opens": [],
            "step_sizes": [],
            "step_seconds": [],
        }
        for level in range(self.num_levels):
            steps = self.times[level][times[level] :]
            out["step_sizes"].append(np.array([s for _, _, s in steps], dtype=np.int64))
            out["step_seconds"].append(np.array([inside for _, inside, _ in steps], dtype=np.float64))
            if level >= 1:
                done = self.verifies[level][verifies[level] :]
                out["verified"].append(np.concatenate([v[0] for v in done]) if done else empty)
                out["accepted"].append(np.concatenate([v[1] for v in done]) if done else empty)
                opens = self.opens[level][verifies[level] :]
                out["opens"].append(np.concatenate(opens) if opens else np.zeros(0, dtype=bool))
        return {k: tuple(v) for k, v in out.items()}

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
            for wall, inside, _ in self.times[level]:
                stats.record_time(level, wall, inside)
        if self.ranks:
            stats.record_ranks(np.concatenate([r.ravel() for r in self.ranks]))
        return stats
