"""HSDStats: what each level did during one decoding run, summed over the rows of the batch."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from hsd_fast.switching_types import HierarchyUsed


def _zeros(n: int) -> list[int]:
    return [0] * n


@dataclass
class HSDStats:
    """Counters per level (index = level; level 0 drafts, level K is the target).

    A *block position* k is the index of a draft inside the block a level verifies (0 = first).
    Every rejection is a rollback of the verifier's own cache; ``cascade_depth[d]`` counts the
    rollbacks that also cut the caches of ``d`` levels below the verifier.
    """

    num_levels: int
    forwards: list[int] = field(default_factory=list)  # lockstep forward passes
    row_forwards: list[int] = field(default_factory=list)  # rows taking part, summed over passes
    fed_tokens: list[int] = field(default_factory=list)  # tokens fed (catch-up + new)
    drafted: list[int] = field(default_factory=list)  # tokens drawn (level 0 only: it alone drafts)
    verified: list[int] = field(default_factory=list)  # drafts verified (levels >= 1)
    accepted: list[int] = field(default_factory=list)
    bonus: list[int] = field(default_factory=list)  # all accepted, extra token kept
    corrections: list[int] = field(default_factory=list)  # = rollbacks of that level
    verified_at: list[list[int]] = field(default_factory=list)  # [level][k]
    accepted_at: list[list[int]] = field(default_factory=list)  # [level][k]
    rejected_at: list[list[int]] = field(default_factory=list)  # [level][k]
    cascade_depth: list[int] = field(default_factory=list)  # [d]
    accepted_by_rank: list[int] = field(default_factory=list)  # [r] token trees: accepted nodes of rank r
    wall_time: list[float] = field(default_factory=list)  # seconds of the level's rounds, host clock
    step_time: list[float] = field(default_factory=list)  # of which inside its step functions
    # adaptive runs (levels = the candidates, then the target): every hierarchy used, in order
    hierarchies: list[HierarchyUsed] = field(default_factory=list)
    look_seconds: float = 0.0  # adaptive runs: host seconds of the looks between rounds (policy included)
    probe_seconds: float = 0.0  # adaptive runs: of the looks, seconds of probing idle candidates
    # a draft with another tokenizer: host seconds of its byte bridge (encoding both ways, keeping the
    # two token domains in step), inside level 0's wall time; its model's forwards are not counted
    bridge_seconds: float = 0.0
    # models under that draft, in its tokenizer (other_tokenizer_chain): ids they drafted for it and
    # how many of those it kept (the ids below its top model; the top's own verification only)
    chain_drafted: int = 0
    chain_accepted: int = 0
    # what each level is, as ``summary`` prints it ("lookup", a checkpoint's name, "exit2"): set by
    # ``generate`` (``request.level_names``); empty: levels are shown by number only
    level_names: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = self.num_levels
        for name in ("forwards", "row_forwards", "fed_tokens", "drafted", "verified", "accepted", "bonus"):
            setattr(self, name, getattr(self, name) or _zeros(n))
        self.corrections = self.corrections or _zeros(n)
        for name in ("verified_at", "accepted_at", "rejected_at"):
            setattr(self, name, getattr(self, name) or [[] for _ in range(n)])
        self.cascade_depth = self.cascade_depth or _zeros(n)
        self.wall_time = self.wall_time or [0.0] * n
        self.step_time = self.step_time or [0.0] * n

    # ------------------------------------------------------------------ recording
    def record_forward(self, level: int, num_rows: int, fed: int) -> None:
        self.forwards[level] += 1
        self.row_forwards[level] += num_rows
        self.fed_tokens[level] += fed

    def record_time(self, level: int, wall: float, inside_step: float) -> None:
        """A round of ``level`` took ``wall`` seconds, ``inside_step`` of them in its step function
        (the forward, transform and op, with the host sync that ends it)."""
        self.wall_time[level] += wall
        self.step_time[level] += inside_step

    def record_ranks(self, ranks: np.ndarray) -> None:
        """Token trees: the ranks of the nodes level 1 accepted (-1 entries are no node)."""
        _add(self.accepted_by_rank, np.bincount(ranks[ranks >= 0]))

    def record_draft(self, num_tokens: int) -> None:
        self.drafted[0] += num_tokens

    def record_verify(
        self,
        level: int,
        num_drafts: np.ndarray,  # [R]
        num_accepted: np.ndarray,  # [R]
        kept_extra: np.ndarray,  # [R] 0/1
        cascaded: np.ndarray,  # [R] levels below `level` whose caches the rollback cut
    ) -> None:
        rejected = num_accepted < num_drafts
        self.verified[level] += int(num_drafts.sum())
        self.accepted[level] += int(num_accepted.sum())
        self.bonus[level] += int((~rejected & (kept_extra == 1)).sum())
        self.corrections[level] += int(rejected.sum())
        width = int(num_drafts.max(initial=0))
        k = np.arange(width)
        _add(self.verified_at[level], (k[None, :] < num_drafts[:, None]).sum(0))
        _add(self.accepted_at[level], (k[None, :] < num_accepted[:, None]).sum(0))
        _add(self.rejected_at[level], np.bincount(num_accepted[rejected], minlength=width))
        _add(self.cascade_depth, np.bincount(cascaded[rejected], minlength=len(self.cascade_depth)))

    def __add__(self, other: HSDStats) -> HSDStats:
        """Counters of two runs summed (same number of levels)."""
        if other.num_levels != self.num_levels:
            raise ValueError(f"cannot add stats of {self.num_levels} and {other.num_levels} levels")
        total = HSDStats(self.num_levels)
        total.hierarchies = [*self.hierarchies, *other.hierarchies]
        total.level_names = list(self.level_names) if self.level_names == other.level_names else []
        scalars = ("look_seconds", "probe_seconds", "bridge_seconds", "chain_drafted", "chain_accepted")
        for name in scalars:
            setattr(total, name, getattr(self, name) + getattr(other, name))
        for f in fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if f.name in ("num_levels", "hierarchies", "level_names", *scalars):
                continue
            if mine and isinstance(mine[0], list):
                setattr(total, f.name, [_summed(a, b) for a, b in zip(mine, theirs, strict=True)])
            else:
                setattr(total, f.name, _summed(mine, theirs))
        return total

    def lifted(self, levels: Sequence[int], num_levels: int) -> HSDStats:
        """These counters, of a hierarchy whose level i is level ``levels[i]`` of ``num_levels``
        (an adaptive run's candidates and target), as counters of those levels."""
        out = HSDStats(
            num_levels, cascade_depth=list(self.cascade_depth), accepted_by_rank=list(self.accepted_by_rank)
        )
        for f in fields(self):
            if f.name in _PER_LEVEL:
                mine, theirs = getattr(self, f.name), getattr(out, f.name)
                for level, value in zip(levels, mine, strict=True):
                    theirs[level] = list(value) if isinstance(value, list) else value
        return out

    # ------------------------------------------------------------------ views
    def acceptance_rate(self, level: int) -> float:
        """Fraction of the drafts verified by ``level`` (>= 1) that it accepted."""
        return self.accepted[level] / self.verified[level] if self.verified[level] else float("nan")

    @property
    def host_time(self) -> float:
        """Seconds of the rounds spent outside the step functions: the engine's own work (ledger,
        metadata, statistics)."""
        return sum(self.wall_time) - sum(self.step_time)

    @property
    def mean_accepted_per_target_pass(self) -> float:
        """Drafts the target accepted per row-forward of the target."""
        top = self.num_levels - 1
        return self.accepted[top] / self.row_forwards[top] if self.row_forwards[top] else float("nan")

    def summary(self) -> str:
        """A table of the counters, a line per level (named where ``level_names`` says), then what the
        run's other records hold."""
        names = self.level_names if len(self.level_names) == self.num_levels else []
        width = max(map(len, names), default=0)
        name = (lambda lvl: f"{names[lvl]:<{width}}  ") if names else (lambda lvl: "")
        header = f"{'':<{width}}  " if names else ""
        columns = "level  forwards  row-fwds  fed-tok  verified  accepted  bonus  corrections  wall-s"
        lines = [header + columns]
        for lvl in range(self.num_levels):
            lines.append(
                f"{name(lvl)}{lvl:>5}  {self.forwards[lvl]:>8}  {self.row_forwards[lvl]:>8}  "
                f"{self.fed_tokens[lvl]:>7}  {self.verified[lvl] if lvl else '-':>8}  "
                f"{self.accepted[lvl] if lvl else '-':>8}  {self.bonus[lvl]:>5}  "
                f"{self.corrections[lvl]:>11}  {self.wall_time[lvl]:>6.3f}"
            )
        lines.append(f"rollbacks by levels cascaded into: {self.cascade_depth}")
        if self.accepted_by_rank:
            lines.append(f"token trees: accepted nodes by rank {self.accepted_by_rank}")
        if self.hierarchies:  # an adaptive run: its levels are the candidates, then the target
            lines.append(
                "hierarchies used (levels: the candidates, the target last); looks "
                f"{self.look_seconds:.3f} s, of which probes {self.probe_seconds:.3f} s"
            )
            top = self.num_levels - 1
            for used in self.hierarchies:
                choice = used.choice
                chain = " > ".join(names[lvl] if names else str(lvl) for lvl in (*choice.drafts, top))
                shape = f" T={list(choice.T)}" if choice.T else ""
                tree = " (token tree)" if choice.tree is not None else ""
                lines.append(
                    f"  from round {used.from_round:>4}: {chain}{shape}{tree}: {used.rounds} rounds, "
                    f"{used.committed} tokens, {used.seconds:.3f} s; switch "
                    f"{used.switch_seconds * 1e3:.2f} ms, {used.catch_up_tokens} catch-up tokens"
                )
        if self.bridge_seconds:
            lines.append(
                f"byte bridge (another tokenizer at level 0): {self.bridge_seconds:.3f} s of host time"
            )
        if self.chain_drafted:
            lines.append(
                f"models under the bridged draft: {self.chain_accepted} of {self.chain_drafted} drafted ids "
                f"kept ({self.chain_accepted / self.chain_drafted:.0%})"
            )
        return "\n".join(lines)


_PER_LEVEL = (
    "forwards", "row_forwards", "fed_tokens", "drafted", "verified", "accepted", "bonus", "corrections",
    "verified_at", "accepted_at", "rejected_at", "wall_time", "step_time",
)  # fmt: skip
"""The fields indexed by level (``cascade_depth`` is by depth, ``accepted_by_rank`` by rank)."""


def _summed(a: list, b: list) -> list:
    total = list(a)
    _add(total, np.asarray(b))
    return total


def _add(total: list[int], counts: np.ndarray) -> None:
    """total += counts, growing total as needed."""
    if len(counts) > len(total):
        total.extend([0] * (len(counts) - len(total)))
    for i, c in enumerate(counts.tolist()):
        total[i] += c
