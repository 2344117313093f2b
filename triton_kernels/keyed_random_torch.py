"""Keyed randomness: every random number is a pure function of its key (docs/design.md, "Keyed randomness").

    key   = (row seed, level, absolute position, purpose, vocabulary index)
    h     = mix32(C)
    h     = mix32(h ^ seed_lo);  h = mix32(h ^ seed_hi)          # 64-bit row seed, two halves
    h     = mix32(h ^ (level << 8 | purpose))                     # level < 2**24, purpose < 256
    h     = mix32(h ^ position)                                   # position < 2**32
    h     = mix32(h ^ index)                                      # 0 where no index is needed
    u     = ((h >> 9) + 0.5) * 2**-23                             # in (0, 1), exact in fp32

    mix32(x) = "lowbias32" (C. Wellons, hash-prospector):
        x ^= x >> 16; x *= 0x7FEB352D; x ^= x >> 15; x *= 0x846CA68B; x ^= x >> 16   (mod 2**32)

Why a hash and not a generator: a row's tokens then depend neither on the batch it runs in nor on
the schedule, and the torch reference and the Triton kernels draw identical numbers. Why the level
is in the key: two levels reusing one uniform on the same token is measurably biased. Why 23 bits and
not 24: ``(h >> 8) + 0.5`` needs 25 significant bits, so fp32 rounds it, and the top value to exactly
1.0; the race's Gumbel key -log(-log u) is then +inf and that token wins whatever its weight (about
V / 2**24 of all draws: 1 in 110 at V = 152k). With 23 bits, u lies in [2**-24, 1 - 2**-24].

This module is the reference and imports no Triton; its Triton twins in ``keyed_random.py``
(``key_state``, ``uniform_from_state``) are bit-identical (tests/test_keyed_random.py). torch has no
uint32 arithmetic, so the torch side works in int64 and splits the 32x32-bit product into 16-bit
halves to stay clear of int64 overflow.
"""

from __future__ import annotations

import torch

DRAFT, ACCEPT, RESIDUAL, BONUS = 0, 1, 2, 3
"""Purposes: a draft token, an accept test, a residual (correction) draw, a bonus. A token tree's
nodes use these too: their column goes into the key's position (``tree_torch.node_key``)."""

_MASK32 = 0xFFFFFFFF
_M1, _M2 = 0x7FEB352D, 0x846CA68B
_START = 0x9E3779B9  # golden-ratio constant: makes an all-zero key hash to a non-zero state


def _mul32_torch(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2**32 for int64 tensors holding uint32 values, without int64 overflow."""
    lo, hi = x & 0xFFFF, x >> 16
    return (lo * c + (((hi * c) & 0xFFFF) << 16)) & _MASK32


def mix32_torch(x: torch.Tensor) -> torch.Tensor:
    x = x ^ (x >> 16)
    x = _mul32_torch(x, _M1)
    x = x ^ (x >> 15)
    x = _mul32_torch(x, _M2)
    return x ^ (x >> 16)


def key_state_torch(
    seeds: torch.Tensor, level: int, positions: torch.Tensor, purpose: int | torch.Tensor
) -> torch.Tensor:
    """Hash state of (seed, level, position, purpose), to be finished with an index. int64, [R]."""
    seeds = seeds.to(torch.int64)
    h = mix32_torch(torch.full_like(seeds, _START))
    h = mix32_torch(h ^ (seeds & _MASK32))
    h = mix32_torch(h ^ ((seeds >> 32) & _MASK32))
    h = mix32_torch(h ^ ((level << 8) | purpose))
    return mix32_torch(h ^ (positions.to(torch.int64) & _MASK32))


def uniform_from_state_torch(state: torch.Tensor, index: torch.Tensor | int) -> torch.Tensor:
    """Uniforms in (0, 1), fp32, for hash states broadcast against indices."""
    h = mix32_torch(state ^ index)
    return ((h >> 9).to(torch.float32) + 0.5) * (2.0**-23)


def uniform_torch(
    seeds: torch.Tensor, level: int, positions: torch.Tensor, purpose: int, index: int = 0
) -> torch.Tensor:
    """One uniform per row: [R] fp32."""
    return uniform_from_state_torch(key_state_torch(seeds, level, positions, purpose), index)


def race_torch(
    log_weights: torch.Tensor,  # [R, V] unnormalised log-weights, -inf for impossible tokens
    seeds: torch.Tensor,  # [R]
    level: int,
    positions: torch.Tensor,  # [R] absolute position of the token being drawn
    purpose: int | torch.Tensor,  # one purpose, or one per row [R]
) -> torch.Tensor:  # [R] int64
    """Exponential race (Gumbel-max): argmax_v log w_v - log(-log u_v) draws v w.p. w_v / sum w."""
    u = uniform_grid_torch(seeds, level, positions, purpose, log_weights.shape[-1])  # [R, V]
    return torch.argmax(log_weights.float() - torch.log(-torch.log(u)), dim=-1)


def uniform_grid_torch(
    seeds: torch.Tensor,
    level: int,
    positions: torch.Tensor,
    purpose: int | torch.Tensor,
    vocab_size: int,
) -> torch.Tensor:
    """[R, V] uniforms from the reference, the counterpart of ``uniform_triton``."""
    state = key_state_torch(seeds, level, positions, purpose)
    vocab = torch.arange(vocab_size, device=seeds.device)
    return uniform_from_state_torch(state[:, None], vocab[None, :])
