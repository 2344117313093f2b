"""How busy the GPU is during a call: the union of its kernels' intervals in a ``torch.profiler``
trace, over the call's wall time. Host work the GPU waits for (a sync, then the next launch) shows
as the gap; a run that keeps the GPU fed is close to 1."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

from hsd_fast.profile.costs import synchronize

CALL_LABEL = "hsd_fast profiled call"  # the profiler range around the call: the share's window


@dataclass(frozen=True)
class BusyTime:
    kernels_s: float  # seconds some kernel ran (overlapping kernels counted once)
    window_s: float  # the profiled call's wall time (the profiler slows the host, not the kernels)

    def share_of(self, wall_s: float) -> float:
        """The kernels' time over ``wall_s`` (an unprofiled call's wall time)."""
        return self.kernels_s / wall_s


def covered(intervals: list[tuple[float, float]], window: tuple[float, float]) -> float:
    """How much of ``window`` the union of ``intervals`` covers, in the inputs' unit."""
    low, high = window
    total, reached = 0.0, low
    for start, end in sorted(intervals):
        start, end = max(start, reached), min(end, high)
        if end > start:
            total += end - start
            reached = end
    return total


def busy_time(prof: profile) -> BusyTime | None:
    """The kernels' time within the ``CALL_LABEL`` range of ``prof``; None without device events
    (a CPU run)."""
    events = list(prof.events())
    calls = [e for e in events if e.name == CALL_LABEL and e.device_type == DeviceType.CPU]
    kernels = [(e.time_range.start, e.time_range.end) for e in events if e.device_type == DeviceType.CUDA]
    if not calls or not kernels:
        return None
    window = (calls[0].time_range.start, calls[0].time_range.end)  # microseconds
    return BusyTime(covered(kernels, window) / 1e6, (window[1] - window[0]) / 1e6)


def profiled(call: Callable[[], object], device: torch.device) -> tuple[profile, BusyTime | None]:
    """Runs ``call`` once under the profiler (CUDA activity where ``device`` is CUDA)."""
    activities = [ProfilerActivity.CPU] + [ProfilerActivity.CUDA] * (device.type == "cuda")
    with profile(activities=activities) as prof, record_function(CALL_LABEL):
        call()
        synchronize(device)
    return prof, busy_time(prof)


def kernel_tables(prof: profile, cuda: bool, rows: int = 25) -> str:
    """The profiler's tables: by the device's own time (CUDA), then by the host's."""
    averages = prof.key_averages()
    tables = [averages.table(sort_by="self_cpu_time_total", row_limit=rows)]
    if cuda:
        tables.insert(0, averages.table(sort_by="self_cuda_time_total", row_limit=rows))
    return "\n\n".join(tables)
