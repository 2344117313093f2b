"""Drawing one token per row from logits with keyed randomness: level 0's drafting step.

``sample_torch`` is the reference (and the CPU path) and imports no Triton; ``sample_triton``
(``sampling.py``) draws the same tokens with fused kernels; ``ops.sample`` picks the kernels for CUDA
tensors.
"""

from __future__ import annotations

import torch

from .checks import check_sample_args
from .keyed_random_torch import race_torch


def sample_torch(
    logits: torch.Tensor,  # [R, V] processed logits, any float dtype; -inf marks excluded tokens
    temperature: torch.Tensor,  # [R] fp32; 1 when the logits are already processed
    seeds: torch.Tensor,  # [R] int64 row seeds
    positions: torch.Tensor,  # [R] int64 absolute position of the token being drawn
    level: int,
    purpose: int,
    greedy: bool,
    *,
    error_flag: torch.Tensor | None = None,  # [1] int32: value errors OR'd in where not raised (checks.py)
) -> tuple[torch.Tensor, torch.Tensor]:  # tokens [R] int64, log-sum-exp [R] fp32
    """Sample from softmax(logits / temperature); return the tokens and the fp32 log-sum-exp that
    the next level up needs to evaluate this distribution as its draft distribution ``q``."""
    check_sample_args(logits, temperature, seeds, positions, level, purpose, greedy, error_flag)
    scaled = logits.float() / temperature[:, None]  # [R, V]
    lse = torch.logsumexp(scaled, dim=-1)  # [R]
    if greedy:
        return torch.argmax(logits, dim=-1), lse
    return race_torch(scaled, seeds, level, positions, purpose), lse
