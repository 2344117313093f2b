"""End-to-end measurement: seconds per generated token of a hierarchy, through ``generate``."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from hsd_fast.profile.costs import synchronize

if TYPE_CHECKING:
    from hsd_fast.hierarchy import Hierarchy


def measured_latency(
    target: torch.nn.Module,
    hierarchy: Hierarchy | None,
    prompts: torch.Tensor,  # [N, L]: each row is generated alone (batch 1)
    max_new_tokens: int = 64,
    clock: Callable[[], float] = time.perf_counter,
    **generation_kwargs,
) -> float:
    """Seconds per generated token with the engine (``hierarchy=None``: autoregressive, K = 0), the
    prefill excluded: (time for ``max_new_tokens`` - time for 1 token) / (``max_new_tokens`` - 1),
    summed over the prompt rows. EOS is ignored so every run has the same length."""
    from hsd_fast.hf_generate import generate

    levels = {"hierarchy": hierarchy} if hierarchy is not None else {"drafts": [], "T": []}
    kwargs = {"eos_token_id": None, "seed": 0, **generation_kwargs, **levels}
    device = next(target.parameters()).device

    def timed(row: torch.Tensor, new_tokens: int) -> float:
        synchronize(device)
        start = clock()
        target.generate(row, custom_generate=generate, max_new_tokens=new_tokens, **kwargs)
        synchronize(device)
        return clock() - start

    timed(prompts[:1], max_new_tokens)  # warm-up: every step shape of the run (compiled steps compile now)
    total = sum(timed(row[None], max_new_tokens) - timed(row[None], 1) for row in prompts)
    return total / (len(prompts) * (max_new_tokens - 1))
