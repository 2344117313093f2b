"""The ops the engine calls, each dispatched to its Triton kernels or its torch reference.

``verify`` (one verification step, contract in ``rejection_torch.py``) and ``sample`` (level 0's
draw, ``sampling_torch.py``) run the kernels on CUDA tensors where Triton is installed (or when
``use_kernel=True``) and the references elsewhere. This module imports no Triton: the kernel
modules are imported on first use, so ``import hsd_fast`` works where Triton is not installed
(macOS, Windows) and the CPU path never pays for it (docs/design.md, "The house rule for ops").
"""

from __future__ import annotations

import functools
import importlib.util

import torch

from .rejection_torch import VerifyResult, verify_torch
from .sampling_torch import sample_torch


@functools.cache
def triton_installed() -> bool:
    try:
        return importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):  # a broken or blocked installation
        return False


def _use_kernel(use_kernel: bool | None, first: torch.Tensor) -> bool:
    # A non-tensor first argument goes on to the reference, whose checks name it. On CUDA without
    # Triton the references run (the same results), as `hsd-fast doctor` reports.
    if use_kernel is None:
        return getattr(first, "is_cuda", False) and triton_installed()
    return use_kernel


def verify(*args, use_kernel: bool | None = None, **kwargs) -> VerifyResult:
    """``verify_triton`` on CUDA tensors (or when ``use_kernel``), ``verify_torch`` elsewhere."""
    if _use_kernel(use_kernel, args[0] if args else kwargs["verifier_logits"]):
        from .rejection import verify_triton

        return verify_triton(*args, **kwargs)
    return verify_torch(*args, **kwargs)


def sample(*args, use_kernel: bool | None = None, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """``sample_triton`` on CUDA tensors (or when ``use_kernel``), ``sample_torch`` elsewhere."""
    if _use_kernel(use_kernel, args[0] if args else kwargs["logits"]):
        from .sampling import sample_triton

        return sample_triton(*args, **kwargs)
    return sample_torch(*args, **kwargs)
