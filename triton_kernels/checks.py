"""Argument checks of the ops (``verify``, ``sample``), shared by the torch references and the
Triton launchers so that both raise the same ``ValueError``, naming the argument. Imports no Triton.

Two kinds of check (docs/design.md, "Kernel contracts"):

- **Structure** (always, on the host, no device sync): every tensor argument is a tensor of the
  right rank, dtype family (float or integer) and device, the shapes agree
  (``verifier_logits [B, D + 1, V]``, ``draft_logits [B, D, V]`` (or None, point-mass drafts,
  with ``draft_lse``), ``draft_lse`` and ``draft_tokens [B, D]``, ``num_drafts``, ``temperature``,
  ``seeds`` and ``positions [B]``), and the scalars are what they should be (``level`` in
  [0, 2**24), ``purpose`` in [0, 256), ``greedy`` a bool).
- **Values** (draft tokens of a row's draft columns in [0, V), ``num_drafts`` in [0, D],
  ``temperature`` > 0): read on the host only where that costs no device sync, on CPU tensors outside
  ``torch.compile``. Elsewhere the launchers' kernels (and the references, with tensor ops) OR bits
  into ``error_flag``, a one-element int32 tensor the caller passes, zeroes once, and reads at a sync
  it makes anyway (``raise_on_error_flag``). The kernels clamp what they read, so bad values give
  wrong numbers and a set flag, never an out-of-bounds read.
"""

from __future__ import annotations

import torch

NUM_DRAFTS_OUT_OF_RANGE = 1
DRAFT_TOKEN_OUT_OF_RANGE = 2
TEMPERATURE_NOT_POSITIVE = 4
"""Bits of ``error_flag``."""

_FLAG_MEANINGS = {
    NUM_DRAFTS_OUT_OF_RANGE: "num_drafts: a count outside [0, D]",
    DRAFT_TOKEN_OUT_OF_RANGE: "draft_tokens: a draft outside [0, V)",
    TEMPERATURE_NOT_POSITIVE: "temperature: a value that is not > 0",
}

MAX_LEVEL = 2**24
MAX_PURPOSE = 256
"""Exclusive bounds of the key fields (keyed_random_torch.py: ``level << 8 | purpose``)."""
MAX_VOCAB = 2**31
"""The kernels index a row's vocabulary in int32."""

_INT_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def _fail(name: str, message: str) -> ValueError:
    return ValueError(f"{name}: {message}")


def _shape(t: torch.Tensor) -> list[int]:
    return list(t.shape)


def _tensor(name: str, value: object, rank: int, kind: str, device: torch.device | None) -> torch.Tensor:
    """``value`` as a tensor of ``rank`` dimensions, a float (``kind == "float"``) or integer dtype,
    on ``device`` (None: any)."""
    if not isinstance(value, torch.Tensor):
        raise _fail(name, f"expected a torch.Tensor, got {type(value).__name__}")
    if value.dim() != rank:
        raise _fail(name, f"expected {rank} dimensions, got shape {_shape(value)}")
    ok = value.is_floating_point() if kind == "float" else value.dtype in _INT_DTYPES
    if not ok:
        wanted = "a floating-point" if kind == "float" else "an integer"
        raise _fail(name, f"expected {wanted} dtype, got {value.dtype}")
    if device is not None and value.device != device:
        raise _fail(name, f"on {value.device}, expected {device} (where the logits are)")
    return value


def _integer(name: str, value: object, limit: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(name, f"expected an int, got {type(value).__name__}")
    if not 0 <= value < limit:
        raise _fail(name, f"must be in [0, {limit}), got {value}")


def _flag_arg(error_flag: object, device: torch.device) -> torch.Tensor | None:
    if error_flag is None:
        return None
    if not isinstance(error_flag, torch.Tensor):
        raise _fail("error_flag", f"expected a torch.Tensor, got {type(error_flag).__name__}")
    if error_flag.dtype != torch.int32 or error_flag.numel() != 1:
        raise _fail(
            "error_flag", f"expected one int32 element, got {error_flag.dtype} of shape {_shape(error_flag)}"
        )
    if error_flag.device != device:
        raise _fail("error_flag", f"on {error_flag.device}, expected {device} (where the logits are)")
    return error_flag


def _row_vectors(num_rows: int, device: torch.device, **vectors: object) -> None:
    """[B] tensors: ``temperature`` a float one, the others integer ones."""
    for name, value in vectors.items():
        t = _tensor(name, value, 1, "float" if name == "temperature" else "int", device)
        if t.shape[0] != num_rows:
            raise _fail(name, f"expected shape [B] = [{num_rows}], got {_shape(t)}")


def host_values(t: torch.Tensor) -> bool:
    """Whether values are checked on the host: CPU tensors (no device sync) outside a compiled
    trace (where a data-dependent ``raise`` cannot be traced)."""
    return t.device.type == "cpu" and not torch.compiler.is_compiling()


def _vocab(name: str, vocab: int) -> None:
    if not 1 <= vocab < MAX_VOCAB:
        raise _fail(name, f"the vocabulary (last dimension) must hold 1 to 2**31 - 1 entries, got {vocab}")


def check_verify_args(
    verifier_logits: torch.Tensor,
    draft_logits: torch.Tensor | None,
    draft_lse: torch.Tensor | None,
    draft_tokens: torch.Tensor,
    num_drafts: torch.Tensor,
    temperature: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    level: int,
    greedy: bool,
    error_flag: torch.Tensor | None = None,
    flag_with_tensor_ops: bool = True,
) -> tuple[int, int, int]:
    """Checks the arguments of ``verify`` (rejection_torch.py states the contract); returns B, D, V.
    Values not read on the host are OR'd into ``error_flag`` with tensor ops if
    ``flag_with_tensor_ops`` (the reference); the launchers' kernels flag them themselves."""
    ver = _tensor("verifier_logits", verifier_logits, 3, "float", None)
    device = ver.device
    tokens = _tensor("draft_tokens", draft_tokens, 2, "int", device)
    num_rows, width = tokens.shape
    vocab = ver.shape[2]
    if _shape(ver)[:2] != [num_rows, width + 1]:
        raise _fail(
            "verifier_logits",
            f"expected shape [B, D + 1, V] = [{num_rows}, {width + 1}, V] (B, D from draft_tokens "
            f"{_shape(tokens)}), got {_shape(ver)}",
        )
    _vocab("verifier_logits", vocab)
    if (draft_logits is None) != (draft_lse is None):
        raise _fail(
            "draft_logits", "draft_logits and draft_lse are given together, or both None (point masses)"
        )
    if draft_logits is not None:  # None: every draft's q is a point mass on its token
        dft = _tensor("draft_logits", draft_logits, 3, "float", device)
        if _shape(dft) != [num_rows, width, vocab]:
            raise _fail(
                "draft_logits", f"expected shape [B, D, V] = {[num_rows, width, vocab]}, got {_shape(dft)}"
            )
        lse = _tensor("draft_lse", draft_lse, 2, "float", device)
        if _shape(lse) != [num_rows, width]:
            raise _fail("draft_lse", f"expected shape [B, D] = {[num_rows, width]}, got {_shape(lse)}")
    _row_vectors(
        num_rows, device, num_drafts=num_drafts, temperature=temperature, seeds=seeds, positions=positions
    )
    _integer("level", level, MAX_LEVEL)
    if not isinstance(greedy, bool):
        raise _fail("greedy", f"expected a bool, got {type(greedy).__name__}")
    flag = _flag_arg(error_flag, device)
    if host_values(num_drafts):
        _check_num_drafts(num_drafts, width)
        _check_draft_tokens(tokens, num_drafts, vocab)
        _check_temperature(temperature)
    elif flag is not None and flag_with_tensor_ops:
        flag.bitwise_or_(verify_error_bits(tokens, num_drafts, temperature, vocab))
    return num_rows, width, vocab


def check_sample_args(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    level: int,
    purpose: int,
    greedy: bool,
    error_flag: torch.Tensor | None = None,
    flag_with_tensor_ops: bool = True,
) -> tuple[int, int]:
    """Checks the arguments of ``sample`` (sampling_torch.py); returns R, V. ``error_flag`` and
    ``flag_with_tensor_ops``: as in ``check_verify_args``."""
    x = _tensor("logits", logits, 2, "float", None)
    num_rows, vocab = x.shape
    _vocab("logits", vocab)
    _row_vectors(num_rows, x.device, temperature=temperature, seeds=seeds, positions=positions)
    _integer("level", level, MAX_LEVEL)
    _integer("purpose", purpose, MAX_PURPOSE)
    if not isinstance(greedy, bool):
        raise _fail("greedy", f"expected a bool, got {type(greedy).__name__}")
    flag = _flag_arg(error_flag, x.device)
    if host_values(temperature):
        _check_temperature(temperature)
    elif flag is not None and flag_with_tensor_ops:
        flag.bitwise_or_(_temperature_bad(temperature).any().to(torch.int32) * TEMPERATURE_NOT_POSITIVE)
    return num_rows, vocab


def check_split(block_v: int | None, num_chunks: int | None) -> None:
    """The launchers' overrides of the vocabulary block (a power of two) and split (>= 1)."""
    if block_v is not None:
        _integer("block_v", block_v, MAX_VOCAB)
        if block_v < 1 or block_v & (block_v - 1):
            raise _fail("block_v", f"must be a power of two, got {block_v}")
    if num_chunks is not None:
        _integer("num_chunks", num_chunks, MAX_VOCAB)
        if num_chunks < 1:
            raise _fail("num_chunks", f"must be >= 1, got {num_chunks}")


# ----------------------------------------------------------------------------- values
def _check_num_drafts(num_drafts: torch.Tensor, width: int) -> None:
    if num_drafts.numel() == 0:
        return
    low, high = (int(v) for v in torch.aminmax(num_drafts))
    if low < 0 or high > width:
        row = int(torch.nonzero((num_drafts < 0) | (num_drafts > width))[0, 0])
        raise _fail(
            "num_drafts", f"row {row} has {int(num_drafts[row])} drafts, outside [0, D] = [0, {width}]"
        )


def _draft_columns(num_drafts: torch.Tensor, width: int) -> torch.Tensor:
    """[B, D] bool: row r's drafts are its last num_drafts[r] columns (the rest is padding)."""
    columns = torch.arange(width, device=num_drafts.device)
    return columns >= (width - num_drafts)[:, None]


def _check_draft_tokens(tokens: torch.Tensor, num_drafts: torch.Tensor, vocab: int) -> None:
    if tokens.numel() == 0:
        return
    low, high = (int(v) for v in torch.aminmax(tokens))
    if low >= 0 and high < vocab:  # padding included: the common case, two reductions fewer
        return
    bad = ((tokens < 0) | (tokens >= vocab)) & _draft_columns(num_drafts, tokens.shape[1])
    if bad.any():
        row, column = (int(i) for i in torch.nonzero(bad)[0])
        raise _fail(
            "draft_tokens",
            f"row {row}, column {column} holds token {int(tokens[row, column])}, "
            f"outside [0, V) = [0, {vocab})",
        )


def _temperature_bad(temperature: torch.Tensor) -> torch.Tensor:
    return ~(temperature > 0)  # NaN included


def _check_temperature(temperature: torch.Tensor) -> None:
    if temperature.numel() and not float(temperature.min()) > 0:  # NaN propagates: not > 0
        row = int(torch.nonzero(_temperature_bad(temperature))[0, 0])
        raise _fail("temperature", f"row {row} is {float(temperature[row])}; it must be > 0")


def verify_error_bits(
    tokens: torch.Tensor, num_drafts: torch.Tensor, temperature: torch.Tensor, vocab: int
) -> torch.Tensor:
    """The ``error_flag`` bits of a verification's values, with tensor ops (no sync): [] int32."""
    width = tokens.shape[1]
    bad_count = ((num_drafts < 0) | (num_drafts > width)).any()
    bad_token = (((tokens < 0) | (tokens >= vocab)) & _draft_columns(num_drafts, width)).any()
    bits = bad_count.to(torch.int32) * NUM_DRAFTS_OUT_OF_RANGE
    bits = bits | bad_token.to(torch.int32) * DRAFT_TOKEN_OUT_OF_RANGE
    return bits | _temperature_bad(temperature).any().to(torch.int32) * TEMPERATURE_NOT_POSITIVE


def raise_on_error_flag(error_flag: torch.Tensor) -> None:
    """Reads ``error_flag`` (a device sync on CUDA) and raises ``ValueError`` naming the arguments
    whose values were out of range, if any bit is set."""
    bits = int(error_flag.reshape(()).item())
    if bits:
        wrong = [meaning for bit, meaning in _FLAG_MEANINGS.items() if bits & bit]
        raise ValueError("invalid op arguments (error_flag " + str(bits) + "): " + "; ".join(wrong))
