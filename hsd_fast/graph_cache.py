"""Compiled CPU steps kept across processes (docs/design.md, "Compiled steps"): inductor's FX graph
cache, keyed on the contents of a frozen graph's weights.

Inductor keeps compiled graphs on disk (the FX graph cache, under ``/tmp/torchinductor_$USER`` unless
``TORCHINDUCTOR_CACHE_DIR`` says otherwise), and a later process that traces the same graph loads the
compiled code instead of compiling it again. A frozen CPU step (``compile_policy.CPU_INDUCTOR_CONFIG``)
never got there, for two reasons in inductor's cache key:

- freezing packs each fp32 weight for MKL, and the key refuses packed (mkldnn) tensors: the graph
  bypassed the cache;
- the key describes a frozen weight by its shape and dtype only, while the compiled graph it stores
  keeps constants computed from the weights' values at compile time (the C++ GEMM template's own
  blocked copy of each weight). Keyed on shapes alone, a model of the same shapes as an earlier one
  would run with the earlier one's weights: wrong outputs, silently (seen on torch 2.13 with two random
  ``Linear`` stacks, which is what admitting packed weights alone would have done).

While a CPU step compiles, ``weights_in_cache_key(model)`` names every frozen weight in the key by a
digest of its bytes, and every packed weight by its shape and the digest of the step's model (a packed
buffer's own bytes include uninitialised padding, so they differ from process to process; freezing
packs only the model's weights, and may drop the dense original from the graph). A graph is then
reused exactly when its code and its weights are the same. Packed weights are never pickled: a frozen
or packed weight is read from the graph being compiled, and what the cache stores are the template's
dense copies, a copy of the weights per step shape: so a model's steps are cached only while its
weights are at most ``MAX_CACHED_WEIGHTS`` (1 GiB) and the disk keeps ``DISK_RESERVE`` free beside
them. Hashing costs a pass over the weights per compiled step (about 1 GB/s), small beside a compile.

What is patched is inductor's cache-key pickler (``FxGraphCachePickler._reduce_tensor``, torch
2.11-2.15; from 2.13 on also ``CacheabilityValidator.check_tensor``, which refuses mkldnn tensors), once
per process, and it changes nothing outside ``weights_in_cache_key`` on the thread that entered it
(dynamo computes the key on the thread that calls the step). Where those are not found the patch does
nothing and CPU steps compile in every process, as before; ``TORCHINDUCTOR_FX_GRAPH_CACHE=0`` turns
inductor's cache, and with it this, off."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import shutil
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import torch


class _Inductor(NamedTuple):
    """What this module reads and patches of inductor's FX graph cache."""

    codecache: Any  # torch._inductor.codecache
    original_reduce: Callable  # FxGraphCachePickler._reduce_tensor, as inductor has it
    original_check: Callable | None  # CacheabilityValidator.check_tensor (torch 2.13 on)
    tensor_metadata: Callable  # extract_tensor_metadata_for_cache_key
    is_frozen_param: Callable


@functools.cache
def _inductor() -> _Inductor | None:
    """Inductor's cache internals, imported at the first compile (importing inductor loads Triton, and
    ``import hsd_fast`` loads neither); None where this torch lacks them (the patch is then skipped)."""
    try:
        from torch._inductor import codecache
        from torch._inductor.freezing_utils import is_frozen_param

        validator = getattr(codecache, "CacheabilityValidator", None)
        return _Inductor(
            codecache,
            codecache.FxGraphCachePickler._reduce_tensor,
            getattr(validator, "check_tensor", None),
            codecache.extract_tensor_metadata_for_cache_key,
            is_frozen_param,
        )
    except (ImportError, AttributeError):  # pragma: no cover - other torch versions
        return None


MAX_CACHED_WEIGHTS = 2**30
"""Bytes of weights beyond which a model's steps are not cached (they compile in every process, as
before): each cached step stores the C++ GEMM template's copy of the weights on disk."""
DISK_RESERVE = 2**30
"""Bytes of free disk a cached step must leave in inductor's cache directory beyond its weights."""

_COMPILING = threading.local()
"""``.step``: the ``_Step`` this thread compiles, absent outside ``weights_in_cache_key``
(dynamo computes the key on the thread that calls the step; elsewhere inductor is left as it is)."""
_INSTALL_LOCK = threading.Lock()
_installed = False
_MODEL_DIGESTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""model -> (the identities and versions of its tensors, digest): a model is hashed once while unchanged."""


def tensor_digest(t: torch.Tensor) -> str:
    """SHA-256 of a dense CPU tensor's elements in row-major order."""
    return hashlib.sha256(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy()).hexdigest()


def model_digest(model: torch.nn.Module) -> str:
    """SHA-256 over a model's parameters and buffers: names, dtypes, shapes and bytes. Kept per model
    until a tensor is replaced or edited in place (which bumps its version counter)."""
    tensors = sorted({**dict(model.named_parameters()), **dict(model.named_buffers())}.items())
    identity = tuple((id(t), t.data_ptr(), t._version) for _, t in tensors)
    known = _MODEL_DIGESTS.get(model)
    if known is not None and known[0] == identity:
        return known[1]
    h = hashlib.sha256()
    for name, t in tensors:
        h.update(f"{name} {t.dtype} {tuple(t.shape)} {tensor_digest(t.cpu())}\n".encode())
    _MODEL_DIGESTS[model] = (identity, h.hexdigest())
    return h.hexdigest()


def cache_dir() -> str:
    """Inductor's cache directory (``TORCHINDUCTOR_CACHE_DIR``, else ``torchinductor_$USER`` in the
    temporary directory), created if missing."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return cache_dir()


def cacheable(model: torch.nn.Module) -> bool:
    """Whether ``model``'s compiled steps go to inductor's cache: its weights are at most
    ``MAX_CACHED_WEIGHTS`` bytes and the cache's disk has room for another copy beyond
    ``DISK_RESERVE``."""
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    if weights > MAX_CACHED_WEIGHTS:
        return False
    try:
        free = shutil.disk_usage(cache_dir()).free
    except OSError:
        return False
    return free >= weights + DISK_RESERVE


class _Step(NamedTuple):
    """The step this thread compiles, as its key needs it."""

    model_digest: str | None  # of the step's model; None: no (cacheable) model, packed weights refused


def described(t: torch.Tensor, model_digest: str | None) -> tuple | None:
    """How the key names a CPU tensor constant of a graph whose step's model has ``model_digest``: a
    packed weight by its shape and that digest, a frozen dense weight by its metadata and its own
    digest; ``None``: as inductor does (other constants, whose values it names itself, and packed
    weights of a step without a model, which it refuses)."""
    if t.is_mkldnn:
        if model_digest is None:
            return None
        return ("packed weight", str(t.dtype), tuple(t.shape), model_digest)
    if _inductor().is_frozen_param(t):
        return ("frozen weight", _inductor().tensor_metadata(t), tensor_digest(t))
    return None


def _reduce_tensor(pickler: Any, t: torch.Tensor) -> tuple[Callable, tuple]:
    """Inductor's reduction of a tensor in a cache key, but ``described`` while a step compiles."""
    step = getattr(_COMPILING, "step", None)
    description = None if step is None or t.device.type != "cpu" else described(t, step.model_digest)
    if description is None:
        return _inductor().original_reduce(pickler, t)
    return _inductor().codecache._ident, (description,)


def _check_tensor(t: torch.Tensor) -> None:
    """torch 2.13's cacheability check of a tensor, which refuses every mkldnn tensor: passed while
    a step with a model compiles (``described`` names its packed weights, which are never pickled)."""
    step = getattr(_COMPILING, "step", None)
    if step is None or step.model_digest is None:
        _inductor().original_check(t)


def _install(inductor: _Inductor) -> None:
    """Put ``_reduce_tensor`` (and ``_check_tensor``) in inductor's place, once per process."""
    global _installed
    with _INSTALL_LOCK:
        if not _installed:
            inductor.codecache.FxGraphCachePickler._reduce_tensor = _reduce_tensor
            if inductor.original_check is not None:
                inductor.codecache.CacheabilityValidator.check_tensor = staticmethod(_check_tensor)
            _installed = True


@contextlib.contextmanager
def weights_in_cache_key(model: torch.nn.Module | None) -> Iterator[None]:
    """While in force on this thread, inductor's FX graph cache keys a frozen CPU graph on the bytes
    of its weights, and admits the packed weights of ``model``, the model the step runs, where it is
    ``cacheable`` (the module docstring says why)."""
    inductor = _inductor()
    if inductor is None:
        yield
        return
    _install(inductor)
    previous = getattr(_COMPILING, "step", None)
    _COMPILING.step = _Step(model_digest(model) if model is not None and cacheable(model) else None)
    try:
        yield
    finally:
        _COMPILING.step = previous
