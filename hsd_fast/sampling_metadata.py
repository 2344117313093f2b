"""Per-run sampling state, bundled: what every draft and verification step of one run reads besides
the logits (vLLM keeps the same in its ``SamplingMetadata``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from hsd_fast.triton_kernels.keyed_random_torch import mix32_torch


@dataclass(frozen=True)
class SamplingMetadata:
    """Row seeds, temperatures and EOS ids of one run, on the run's device.

    ``greedy``: every level's distribution is one-hot at its argmax. ``use_kernel``: draft and verify
    with the Triton kernels (``None``: on CUDA tensors) or the torch references."""

    seeds: torch.Tensor  # [B] int64: keys all randomness of row b (docs/design.md, "Keyed randomness")
    temperature: torch.Tensor  # [B] fp32; 1 when the runners' logits are already processed
    eos_ids: torch.Tensor  # [E] int64, possibly empty
    greedy: bool = False
    use_kernel: bool | None = None

    @classmethod
    def build(
        cls,
        num_rows: int,
        device: torch.device,
        seeds: torch.Tensor | int = 0,
        temperature: float | torch.Tensor = 1.0,
        eos_token_id: int | Sequence[int] | None = None,
        greedy: bool = False,
        use_kernel: bool | None = None,
    ) -> SamplingMetadata:
        """``seeds``: one int (row seeds derived from it) or one int64 per row; ``temperature``: one
        float or one per row; ``eos_token_id``: none, one or several ids."""
        seeds = row_seeds(seeds, num_rows) if isinstance(seeds, int) else torch.as_tensor(seeds)
        if seeds.shape != (num_rows,):
            raise ValueError(f"seed: one int, or one per row ({num_rows}), got shape {tuple(seeds.shape)}")
        temperature = torch.as_tensor(temperature, dtype=torch.float32, device=device)
        eos = [] if eos_token_id is None else np.atleast_1d(eos_token_id).tolist()
        return cls(
            seeds=seeds.to(device=device, dtype=torch.int64),
            temperature=temperature.expand(num_rows).contiguous(),
            eos_ids=torch.tensor(eos, dtype=torch.int64, device=device),
            greedy=greedy,
            use_kernel=use_kernel,
        )


def row_seeds(seed: int, num_rows: int) -> torch.Tensor:
    """Seeds of rows 0..num_rows-1 derived from one integer (row r gets the same seed alone or in a
    batch, as long as it is row r)."""
    rows = torch.arange(num_rows, dtype=torch.int64)
    hi = mix32_torch(rows ^ ((seed >> 32) & 0xFFFFFFFF))
    return (hi << 32) | mix32_torch(hi ^ (seed & 0xFFFFFFFF))
