"""End-to-end measurement: seconds per generated token of a hierarchy, through ``generate``.

``generate`` is an argument (``hsd_fast.generate``, passed by ``select_hierarchy`` and the commands):
the profiler sits above the HF glue in the layers but does not need to import it."""

from __future__ import annotations

import math
import statistics
import time
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from hsd_fast.profile.costs import ProfileNoiseWarning, synchronize, warm_up

if TYPE_CHECKING:
    from hsd_fast.hierarchy_types import Hierarchy


def measured_latency(
    target: torch.nn.Module,
    hierarchy: Hierarchy | None,
    prompts: torch.Tensor,  # [N, L]: generated ``batch`` rows at a time
    max_new_tokens: int = 64,
    clock: Callable[[], float] = time.perf_counter,
    repeats: int = 3,
    batch: int = 1,
    *,
    generate: Callable[..., Any],
    **generation_kwargs,
) -> float:
    """Seconds per token each row generates with the engine (``hierarchy=None``: autoregressive,
    K = 0), the prefill excluded: (time for ``max_new_tokens`` - time for 1 token) /
    (``max_new_tokens`` - 1), the median of ``repeats`` such pairs per batch of ``batch`` rows of
    ``prompts`` (rows repeated to fill one batch if fewer; timed one after the other, so that load
    that comes and goes spoils a pair, not a whole side), averaged over the batches. EOS is ignored
    so every run has the same length. NaN, with a ``ProfileNoiseWarning``, when the machine was too
    busy to tell: the long runs took no longer than the short ones. ``generate``: the
    ``custom_generate`` that runs the engine (``hsd_fast.generate``)."""
    if max_new_tokens < 2 or repeats < 1 or batch < 1:
        raise ValueError(
            "measured_latency needs max_new_tokens >= 2 (the first token is the prefill's), "
            f"repeats >= 1 and batch >= 1, got {max_new_tokens}, {repeats} and {batch}"
        )
    levels = {"hierarchy": hierarchy} if hierarchy is not None else {"drafts": [], "T": []}
    kwargs = {"eos_token_id": None, "seed": 0, **generation_kwargs, **levels}
    device = next(target.parameters()).device

    def timed(row: torch.Tensor, new_tokens: int) -> float:
        synchronize(device)
        start = clock()
        target.generate(row, custom_generate=generate, max_new_tokens=new_tokens, **kwargs)
        synchronize(device)
        return clock() - start

    rows = prompts[torch.arange(max(len(prompts), batch) // batch * batch) % len(prompts)]
    batches = rows.split(batch)  # each [batch, L]
    warm_up(lambda: [timed(ids, max_new_tokens) for ids in batches])  # every batch's step shapes
    total = sum(
        statistics.median(timed(ids, max_new_tokens) - timed(ids, 1) for _ in range(repeats))
        for ids in batches
    )
    if total <= 0:
        warnings.warn(
            f"measured_latency: generating {max_new_tokens} tokens took no longer than generating 1 "
            "(median of the repeats): the machine is too busy to measure; returning NaN",
            ProfileNoiseWarning,
            stacklevel=2,
        )
        return math.nan
    return total / (len(batches) * (max_new_tokens - 1))
