"""The keyed hash of triton_kernels/keyed_random.py in plain Python integers, written from its
docstring, and its inverse: tests use it to pick keys whose uniform is a chosen extreme."""

MASK = 0xFFFFFFFF
M1, M2, START = 0x7FEB352D, 0x846CA68B, 0x9E3779B9


def mix32(x: int) -> int:
    x ^= x >> 16
    x = (x * M1) & MASK
    x ^= x >> 15
    x = (x * M2) & MASK
    return x ^ (x >> 16)


def unmix32(x: int) -> int:
    """Inverse of ``mix32``: xor-shifts by >= 16 undo themselves, by 15 need a second term."""
    x ^= x >> 16
    x = (x * pow(M2, -1, 2**32)) & MASK
    x ^= (x >> 15) ^ (x >> 30)
    x = (x * pow(M1, -1, 2**32)) & MASK
    return x ^ (x >> 16)


def state_before_position(seed: int, level: int, purpose: int) -> int:
    h = mix32(START)
    for part in (seed & MASK, (seed >> 32) & MASK, (level << 8) | purpose):
        h = mix32(h ^ part)
    return h


def hash_bits(seed: int, level: int, position: int, purpose: int, index: int) -> int:
    h = mix32(state_before_position(seed, level, purpose) ^ position)
    return mix32(h ^ index)


def position_hashing_to(bits: int, seed: int, level: int, purpose: int, index: int) -> int:
    """The position at which (seed, level, position, purpose, index) hashes to ``bits``."""
    state = unmix32(bits) ^ index
    return unmix32(state) ^ state_before_position(seed, level, purpose)
