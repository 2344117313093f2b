"""Forward costs through the engine's own runner (slot cache, 4D mask), for the latency model:
seconds of one forward over n fed tokens at a working context length, medians after warm-up,
fitted as ``c(n) = a + b n``. The clock is injectable (tests use a fake one); on CUDA every timing
is synchronised."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from hsd_fast.engine import Feed
from hsd_fast.hf_runner import HFRunner
from hsd_fast.latency import AffineCost
from hsd_fast.processors import LogitsTransform


@dataclass(frozen=True)
class CostProfile:
    spans: tuple[int, ...]
    seconds: tuple[float, ...]  # median seconds of one forward over each span
    fit: AffineCost  # least-squares c(n) = fixed + per_token * n

    def __call__(self, n: int) -> float:
        return self.fit(n)

    @classmethod
    def from_medians(cls, spans: Sequence[int], seconds: Sequence[float]) -> CostProfile:
        return cls(tuple(spans), tuple(seconds), _fit(spans, seconds))


def forward_costs(
    model: torch.nn.Module,
    spans: Sequence[int] = (1, 2, 4, 8, 16),
    context: int = 128,
    repeats: int = 5,
    warmup: int = 2,
    clock: Callable[[], float] = time.perf_counter,
) -> CostProfile:
    """Time one forward of ``model`` over n new tokens after ``context`` cached ones, for each n."""
    runner = HFRunner(model, LogitsTransform(), model.get_output_embeddings().weight.shape[0])
    runner.prepare(1, context + max(spans) + 1)
    device = next(model.parameters()).device
    ids = torch.randint(3, runner.vocab_size, (context + max(spans),), device=device)
    runner.forward(_feed(ids, 0, context))  # prefill the context once
    medians = []
    for n in spans:
        times = []
        for i in range(warmup + repeats):
            synchronize(device)
            start = clock()
            runner.forward(_feed(ids, context, context + n))  # rewrites the same slots each time
            synchronize(device)
            elapsed = clock() - start
            if i >= warmup:
                times.append(elapsed)
        medians.append(statistics.median(times))
    return CostProfile.from_medians(spans, medians)


def _fit(spans: Sequence[int], seconds: Sequence[float]) -> AffineCost:
    """Least-squares c(n) = fixed + per_token * n (a constant with a single span)."""
    if len(spans) == 1:
        return AffineCost(seconds[0])
    per_token, fixed = np.polyfit(np.asarray(spans, float), np.asarray(seconds), 1)
    return AffineCost(float(fixed), float(per_token))


def _feed(ids: torch.Tensor, start: int, end: int) -> Feed:
    one = np.array([1], dtype=np.int64)
    return Feed(np.array([0]), one * start, one * end, one * (end - 1), ids[start:end])


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
