"""Step costs for the latency model, measured through the engine's own level steps (the path
``generate`` takes: eager or compiled, the forward with the slot cache and the 4D mask, the sampling
transform, the draft or verification op, and the host's part of a step):

- ``c(n)``: a verification step over n fed tokens (n - 1 drafts), for n in ``spans``;
- ``d(k)``: a draft step that draws k tokens, for k in ``drafts``;

medians after warm-up, each fitted as ``a + b n``. Autoregressive decoding (K = 0) draws
``TOKENS_PER_DECODE_STEP`` tokens per step: its cost per token is ``d(that) / that``. The clock is
injectable (tests use a fake one); on CUDA every timing is synchronised.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from hsd_fast.engine import TOKENS_PER_DECODE_STEP
from hsd_fast.hf_runner import HFRunner
from hsd_fast.latency import AffineCost
from hsd_fast.processors import LogitsTransform
from hsd_fast.sampling_metadata import SamplingMetadata
from hsd_fast.steps import DecodeState, LevelStep


@dataclass(frozen=True)
class CostProfile:
    spans: tuple[int, ...]
    seconds: tuple[float, ...]  # median seconds of a verification step over each span
    drafts: tuple[int, ...]
    draft_seconds: tuple[float, ...]  # median seconds of a step drafting that many tokens

    @functools.cached_property
    def fit(self) -> AffineCost:
        """Least-squares c(n) = fixed + per_token * n over the verification steps."""
        return _fit(self.spans, self.seconds)

    @functools.cached_property
    def draft_fit(self) -> AffineCost:
        return _fit(self.drafts, self.draft_seconds)

    def __call__(self, n: int) -> float:
        return self.fit(n)

    def draft(self, k: int) -> float:
        return self.draft_fit(k)

    def decode(self) -> float:
        """Seconds per token of autoregressive decoding."""
        return self.draft(TOKENS_PER_DECODE_STEP) / TOKENS_PER_DECODE_STEP


def forward_costs(
    model: torch.nn.Module,
    spans: Sequence[int] = (1, 2, 4, 8, 16),
    drafts: Sequence[int] = (1, 2, 4, 8),
    context: int = 128,
    repeats: int = 5,
    warmup: int = 2,
    clock: Callable[[], float] = time.perf_counter,
    compile: bool = False,
    greedy: bool = True,
    transform: LogitsTransform | None = None,
) -> CostProfile:
    """Time ``model``'s steps after ``context`` cached tokens, as ``generate`` runs them
    (``compile``, greedy or sampled under ``transform``)."""
    runner = HFRunner(model, model.get_output_embeddings().weight.shape[0])
    device = next(model.parameters()).device
    positions = context + max(*spans, *drafts) + 1
    ids = torch.randint(3, runner.vocab_size, (1, positions), device=device)
    transform = transform or LogitsTransform()
    sampling = SamplingMetadata.build(1, device, temperature=transform.temperature, greedy=greedy)
    ring_dtype = torch.float32 if transform.processors else runner.dtype
    state = DecodeState(
        list(ids), positions, 2 * positions, runner.vocab_size, ring_dtype, sampling, transform, not greedy
    )
    runner.prepare(1, positions)
    verify = LevelStep(runner, level=1, top=2, compile=compile)  # keeps its p, as a middle level
    draft = LevelStep(runner, level=0, top=1, compile=compile)
    row = np.zeros(1, dtype=np.int64)

    def timed(run: Callable[[], object]) -> float:
        return _settled_median(run, clock, device, warmup, repeats)

    with torch.inference_mode():
        verify(state, row, row, row + context, row + context - 1)  # prefill the context once
        verify_seconds = [
            timed(lambda n=n: verify(state, row, row + context, row + context + n, row + context))
            for n in spans
        ]
        draft_seconds = [
            timed(lambda k=k: draft(state, row, row + context, row + context + 1, row + context, row + k))
            for k in drafts
        ]
    return CostProfile(tuple(spans), tuple(verify_seconds), tuple(drafts), tuple(draft_seconds))


SETTLE_CALLS = 30
"""Most warm-up calls spent waiting for a step's time to settle (see ``_settled_median``)."""


def _settled_median(
    run: Callable[[], object], clock: Callable[[], float], device: torch.device, warmup: int, repeats: int
) -> float:
    """Median seconds of ``repeats`` calls of ``run`` after warm-up. Warm-up is at least ``warmup``
    calls and lasts until three calls in a row agree within 20 %: right after ``torch.compile``
    has built a step (with the C++ wrapper, on a CPU), its calls can run 100x slower for a while."""

    def once() -> float:
        synchronize(device)
        begin = clock()
        run()  # rewrites the same slots each time
        synchronize(device)
        return clock() - begin

    recent = [once() for _ in range(warmup)]
    while len(recent) < SETTLE_CALLS and (len(recent) < 3 or max(recent[-3:]) > 1.2 * min(recent[-3:])):
        recent.append(once())
    return statistics.median(once() for _ in range(repeats))


def _fit(spans: Sequence[int], seconds: Sequence[float]) -> AffineCost:
    """Least-squares c(n) = fixed + per_token * n (a constant with a single span)."""
    if len(spans) == 1:
        return AffineCost(seconds[0])
    per_token, fixed = np.polyfit(np.asarray(spans, float), np.asarray(seconds), 1)
    return AffineCost(float(fixed), float(per_token))


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
