"""Triton twins of the keyed hash in ``keyed_random_torch.py`` (the reference, which documents the
key and the hash): device functions for the kernels, and ``uniform_triton`` to test them against it."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .keyed_random_torch import ACCEPT, BONUS, DRAFT, RESIDUAL

__all__ = [
    "ACCEPT",
    "BONUS",
    "DRAFT",
    "RESIDUAL",
    "key_state",
    "uniform_from_state",
    "uniform_triton",
]


@triton.jit
def _mix32(x):
    x = x ^ (x >> 16)
    x = x * 0x7FEB352D
    x = x ^ (x >> 15)
    x = x * 0x846CA68B
    return x ^ (x >> 16)


@triton.jit
def key_state(seed, level, position, purpose):
    """Triton twin of ``key_state_torch``: seed int64 scalar, the rest integers; returns uint32."""
    s = seed.to(tl.uint64)
    h = _mix32(tl.full((), 0x9E3779B9, tl.uint32))
    h = _mix32(h ^ (s & 0xFFFFFFFF).to(tl.uint32))
    h = _mix32(h ^ (s >> 32).to(tl.uint32))
    h = _mix32(h ^ ((level << 8) | purpose).to(tl.uint32))
    return _mix32(h ^ position.to(tl.uint32))


@triton.jit
def uniform_from_state(state, index):
    """Triton twin of ``uniform_from_state_torch``: fp32 uniforms in (0, 1)."""
    h = _mix32(state ^ index.to(tl.uint32))
    return ((h >> 9).to(tl.float32) + 0.5) * 1.1920928955078125e-07  # 2**-23


@triton.jit
def _uniform_kernel(seeds_ptr, positions_ptr, out_ptr, V, level, purpose, BLOCK_V: tl.constexpr):
    row = tl.program_id(0)
    state = key_state(tl.load(seeds_ptr + row), level, tl.load(positions_ptr + row), purpose)
    cols = tl.arange(0, BLOCK_V)
    u = uniform_from_state(state, cols)
    tl.store(out_ptr + row * V + cols, u, mask=cols < V)


def uniform_triton(
    seeds: torch.Tensor, level: int, positions: torch.Tensor, purpose: int, vocab_size: int
) -> torch.Tensor:
    """[R, V] uniforms drawn in Triton: tests the device functions against the reference."""
    out = torch.empty(seeds.shape[0], vocab_size, dtype=torch.float32, device=seeds.device)
    block = triton.next_power_of_2(vocab_size)
    _uniform_kernel[(seeds.shape[0],)](
        seeds.to(torch.int64), positions.to(torch.int64), out, vocab_size, level, purpose, block
    )
    return out
