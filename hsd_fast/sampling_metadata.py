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

    seeds: torch.Tensor  # [B] int64: keys the target's randomness of row b (design, "Keyed randomness")
    draft_seeds: torch.Tensor  # [B] int64: keys every level below the target; changed per epoch, in place
    host_seeds: np.ndarray  # [B] int64: ``seeds`` on the host
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
        runs_before: int = 0,
    ) -> SamplingMetadata:
        """``seeds``: one int (row seeds derived from it) or one int64 per row; ``temperature``: one
        float or one per row; ``eos_token_id``: none, one or several ids; ``runs_before``: the runs
        an adaptive run's policy served before it (``run_seeds``)."""
        seeds = run_seeds(seed_tensor(seeds, num_rows), runs_before)
        temperature = _temperatures(temperature, num_rows, greedy).to(device)
        eos = [] if eos_token_id is None else np.atleast_1d(eos_token_id).tolist()
        host = seeds.to(torch.int64).numpy().copy()
        seeds = seeds.to(device=device, dtype=torch.int64)
        return cls(
            seeds=seeds,
            draft_seeds=seeds.clone(),
            host_seeds=host,
            temperature=temperature.expand(num_rows).contiguous(),
            eos_ids=torch.tensor(eos, dtype=torch.int64, device=device),
            greedy=greedy,
            use_kernel=use_kernel,
        )

    def seeds_at(self, below_target: bool) -> torch.Tensor:
        """[B] the row seeds a level keys its randomness with: the target's own, or those of the
        levels below it."""
        return self.draft_seeds if below_target else self.seeds

    def start_epoch(self, epoch: int) -> None:
        """Key the levels below the target by ``epoch`` from now on (epoch 0: the target's seeds):
        an adaptive run starts a new epoch wherever its policy looks at the run, so that no uniform
        a lower level will still use can have influenced what the policy saw (docs/design.md,
        "Switching hierarchies"). In place, so compiled steps keep reading the same tensor; hashed
        on the host from ``host_seeds``, one copy to the device per epoch."""
        if epoch == 0:
            self.draft_seeds.copy_(self.seeds)
        else:
            self.draft_seeds.copy_(torch.from_numpy(_epoch_seeds(self.host_seeds, epoch)))


def run_seeds(seeds: torch.Tensor, runs_before: int) -> torch.Tensor:
    """[B] int64 row seeds of an adaptive run whose policy served ``runs_before`` runs before it:
    ``seeds`` for its first, else a 64-bit hash of (seed, runs_before) apart from the epochs'. A
    policy that keeps state across runs has seen what their keys decided; run again with the same
    seed, keyed alike, it could choose on the uniforms still to be used (docs/design.md, "Switching
    hierarchies")."""
    if runs_before == 0:
        return seeds
    hashed = _epoch_seeds(_epoch_seeds(seeds.numpy(), runs_before), _RUNS_DOMAIN)
    return torch.from_numpy(hashed)


_RUNS_DOMAIN = 0x52554E53  # hashed in after the run count: a run's seeds are no epoch's


def epoch_seeds(seeds: torch.Tensor, epoch: int) -> torch.Tensor:
    """[B] int64 seeds for ``epoch`` >= 1 from the row seeds ``seeds`` [B]: a 64-bit hash of (seed,
    epoch) (on the host)."""
    return torch.from_numpy(_epoch_seeds(seeds.cpu().numpy(), epoch))


def _epoch_seeds(seeds: np.ndarray, epoch: int) -> np.ndarray:  # [B] int64 -> [B] int64
    bits = seeds.astype(np.int64).view(np.uint64)
    lo, hi = bits & _MASK32, bits >> np.uint64(32)
    e = np.uint64(epoch & 0xFFFFFFFF)
    top = _mix32(_mix32(hi ^ _mix32(e ^ np.uint64(0x85EBCA6B))) ^ lo)
    return ((top << np.uint64(32)) | _mix32(top ^ lo ^ _mix32(e))).view(np.int64)


_MASK32 = np.uint64(0xFFFFFFFF)


def _mix32(x: np.ndarray) -> np.ndarray:
    """lowbias32 (docs/design.md, "Keyed randomness") on uint64 arrays holding 32-bit values."""
    x = x ^ (x >> np.uint64(16))
    x = (x * np.uint64(0x7FEB352D)) & _MASK32
    x = x ^ (x >> np.uint64(15))
    x = (x * np.uint64(0x846CA68B)) & _MASK32
    return x ^ (x >> np.uint64(16))


def _temperatures(temperature: float | torch.Tensor, num_rows: int, greedy: bool) -> torch.Tensor:
    """[] or [B] float32 temperatures, checked on the host once per request (on CUDA the ops read no
    values, so a temperature <= 0 would reach the kernels unchecked): finite and > 0 when sampling,
    one value or one per row; otherwise a ValueError naming ``temperature``."""
    values = torch.as_tensor(temperature, dtype=torch.float32).detach().cpu()
    if values.dim() > 1 or (values.dim() == 1 and values.numel() != num_rows):
        raise ValueError(
            f"temperature must be one float or one per row ({num_rows}), got shape {tuple(values.shape)}"
        )
    if not greedy and not (torch.isfinite(values).all() and (values > 0).all()):
        raise ValueError(f"temperature must be finite and > 0 when sampling, got {values.tolist()}")
    return values


SEED_RANGE = (-(2**63), 2**64)
"""Seeds are 64-bit: ``[-2**63, 2**64)`` as ``torch.manual_seed`` takes them. A seed outside is
refused, never silently reduced (two different seeds would then key the same randomness)."""


def seed_tensor(seed: int | Sequence[int] | torch.Tensor | np.ndarray, num_rows: int) -> torch.Tensor:
    """[B] int64 row seeds from one int (derived per row, ``row_seeds``) or one per row, or a
    TypeError/ValueError naming ``seed``. A seed in [2**63, 2**64) is kept as the int64 with the same
    64 bits."""
    if isinstance(seed, (torch.Tensor, np.ndarray)) and seed.ndim == 0:
        seed = seed.item()
    if _is_int(seed):
        return row_seeds(_in_range(int(seed)), num_rows)
    if isinstance(seed, torch.Tensor):
        if seed.dtype.is_floating_point or seed.dtype.is_complex or seed.dtype == torch.bool:
            raise TypeError(f"seed must hold ints, got a tensor of {seed.dtype}")
        values = seed.flatten().tolist() if seed.dim() == 1 else None
    elif isinstance(seed, (Sequence, np.ndarray)) and not isinstance(seed, (str, bytes)):
        values = list(seed) if np.ndim(seed) == 1 else None
    else:
        raise TypeError(f"seed must be an int or one int per row, got {type(seed).__name__}")
    if values is None or len(values) != num_rows:
        raise ValueError(f"seed: one int, or one per row ({num_rows}), got shape {tuple(np.shape(seed))}")
    if not all(_is_int(v) for v in values):
        raise TypeError(f"seed must hold ints, got {values}")
    return torch.tensor([_as_int64(_in_range(int(v))) for v in values], dtype=torch.int64)


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _in_range(seed: int) -> int:
    low, high = SEED_RANGE
    if not low <= seed < high:
        raise ValueError(f"seed must lie in [-2**63, 2**64) (64 bits), got {seed}")
    return seed


def _as_int64(seed: int) -> int:
    return seed - 2**64 if seed >= 2**63 else seed


def row_seeds(seed: int, num_rows: int) -> torch.Tensor:
    """Seeds of rows 0..num_rows-1 derived from one integer (row r gets the same seed alone or in a
    batch, as long as it is row r)."""
    rows = torch.arange(num_rows, dtype=torch.int64)
    hi = mix32_torch(rows ^ ((seed >> 32) & 0xFFFFFFFF))
    return (hi << 32) | mix32_torch(hi ^ (seed & 0xFFFFFFFF))
