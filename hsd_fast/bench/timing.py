"""Timing many configurations fairly on a shared machine.

Every pass runs every configuration once, in an order rotated from pass to pass (no configuration
always runs first, after a slow one, or while caches are cold); the warm-up is not counted. A pass
during which other processes took more than ``MAX_FOREIGN_CPU`` of the machine is redone (up to
``MAX_REDOS`` times per pass) and counted as redone in the report.

Compilation is excluded the same way. Our steps compile a shape at its third use and HF's compiled
cache a new shape when it first meets it, so one warm-up call can leave compilations (tens of
seconds each on a CPU) for the counted passes: a configuration is warmed up until a call compiles
nothing (``profile.costs.warm_up``), and a counted pass in which anything compiled is redone and
counted apart.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from hsd_fast.profile.costs import compilations, warm_up

MAX_FOREIGN_CPU = 0.10
"""Share of the machine's CPU time other processes may take during a pass before it is redone."""
MAX_REDOS = 3


def pass_order(num_configs: int, pass_index: int) -> list[int]:
    """Configurations in the order pass ``pass_index`` runs them: rotated by one per pass."""
    return [(pass_index + i) % num_configs for i in range(num_configs)]


class CpuMeter:
    """CPU time taken by *other* processes over an interval, as a share of the machine: the system's
    busy time (``/proc/stat``) minus this process's own (``os.times``), over wall time x cores.
    Where ``/proc/stat`` does not exist, nothing is measured (``available`` is false)."""

    def __init__(self, stat_path: str = "/proc/stat") -> None:
        self.stat_path = stat_path
        self.available = os.path.exists(stat_path)
        self.cores = os.cpu_count() or 1
        self.ticks_per_second = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    def _busy_seconds(self) -> float:
        with open(self.stat_path) as f:
            fields = [int(v) for v in f.readline().split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        return (sum(fields[:8]) - idle) / self.ticks_per_second

    def snapshot(self) -> tuple[float, float, float]:
        """(wall, system busy, own CPU) seconds now."""
        own = os.times()
        busy = self._busy_seconds() if self.available else 0.0
        return time.perf_counter(), busy, own.user + own.system

    def foreign_share(self, before: tuple[float, float, float], after: tuple[float, float, float]) -> float:
        """Share of the machine other processes used between two snapshots (0 when unmeasurable)."""
        if not self.available:
            return 0.0
        wall = after[0] - before[0]
        foreign = (after[1] - before[1]) - (after[2] - before[2])
        return max(0.0, foreign) / max(wall * self.cores, 1e-9)


@dataclass
class Timings:
    """Seconds of every counted pass, per configuration, and how many passes were redone."""

    seconds: list[list[float]]
    redone: int = 0  # passes redone because the machine was busy
    recompiled: int = 0  # passes redone because something compiled in them
    foreign_shares: list[float] = field(default_factory=list)  # of the counted passes


def interleaved(
    runs: Sequence[Callable[[], object]],
    passes: int,
    meter: CpuMeter | None = None,
    max_foreign: float = MAX_FOREIGN_CPU,
    max_redos: int = MAX_REDOS,
    clock: Callable[[], float] = time.perf_counter,
    on_pass: Callable[[int], None] | None = None,
    compiled: Callable[[], int] = compilations,
) -> Timings:
    """Time ``runs`` over ``passes`` counted passes after the warm-up (see the module doc).
    ``compiled``: a count of the compilations so far."""
    meter = meter or CpuMeter()
    timings = Timings([[] for _ in runs])
    for run in runs:  # warm-up: compilation, caches, allocator
        warm_up(run, compiled)
    for p in range(passes):
        for attempt in range(max_redos + 1):
            before, compiled_before = meter.snapshot(), compiled()
            seconds = [0.0] * len(runs)
            for i in pass_order(len(runs), p):
                start = clock()
                runs[i]()
                seconds[i] = clock() - start
            share = meter.foreign_share(before, meter.snapshot())
            recompiled = compiled() != compiled_before
            if (share <= max_foreign and not recompiled) or attempt == max_redos:
                break
            timings.recompiled += recompiled
            timings.redone += not recompiled
        for i, s in enumerate(seconds):
            timings.seconds[i].append(s)
        timings.foreign_shares.append(share)
        if on_pass is not None:
            on_pass(p)
    return timings
