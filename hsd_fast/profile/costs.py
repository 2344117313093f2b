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

from hsd_fast.hf_runner import HFRunner
from hsd_fast.latency import AffineCost
from hsd_fast.processors import LogitsTransform
from hsd_fast.sampling_metadata import SamplingMetadata
from hsd_fast.steps import DecodeState, LevelStep


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
    compile: bool = False,
) -> CostProfile:
    """Seconds of one level step of ``model`` over n fed tokens after ``context`` cached ones (a
    greedy verification of n - 1 drafts: the forward, the transform, the op and the host's part of
    the step), for each n, as ``generate`` runs it (``compile``: the compiled step)."""
    runner = HFRunner(model, model.get_output_embeddings().weight.shape[0])
    device = next(model.parameters()).device
    ids = torch.randint(3, runner.vocab_size, (1, context + max(spans)), device=device)
    sampling = SamplingMetadata.build(1, device, greedy=True)
    state = DecodeState(
        list(ids),
        context + max(spans) + 1,
        1,
        runner.vocab_size,
        runner.dtype,
        sampling,
        LogitsTransform(),
        False,
    )
    runner.prepare(1, context + max(spans) + 1)
    step = LevelStep(runner, level=1, top=1, compile=compile)
    row = np.zeros(1, dtype=np.int64)

    def run(start: int, end: int, out: int) -> None:
        step(state, row, row + start, row + end, row + out)

    with torch.inference_mode():
        run(0, context, context - 1)  # prefill the context once
        medians = []
        for n in spans:
            times = []
            for i in range(warmup + repeats):
                synchronize(device)
                begin = clock()
                run(context, context + n, context)  # rewrites the same slots each time
                synchronize(device)
                if i >= warmup:
                    times.append(clock() - begin)
            medians.append(statistics.median(times))
    return CostProfile.from_medians(spans, medians)


def _fit(spans: Sequence[int], seconds: Sequence[float]) -> AffineCost:
    """Least-squares c(n) = fixed + per_token * n (a constant with a single span)."""
    if len(spans) == 1:
        return AffineCost(seconds[0])
    per_token, fixed = np.polyfit(np.asarray(spans, float), np.asarray(seconds), 1)
    return AffineCost(float(fixed), float(per_token))


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
