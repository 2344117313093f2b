"""How the level steps are compiled (docs/design.md, "Compiled steps"): the ``torch.compile``
wrapper and inductor settings, the progress line of a first call, which step shapes are worth a
graph, whether memory holds another one, and what of a model a compiled step assumes. ``LevelStep``
(``level_step.py``) applies this policy per level."""

from __future__ import annotations

import contextlib
import threading
import time
import types
import weakref
from collections.abc import Callable

import torch
from tqdm.auto import tqdm

from hsd_fast.graph_cache import weights_in_cache_key

CPP_WRAPPER = True
COMPILED_MAX_WIDTH = 16
"""The widest step that is compiled: decoding feeds a few tokens per step; a prefill feeds many."""
COMPILE_AFTER_USES = 3
"""A step shape is compiled at its third use: the shapes of every round (a verification of T
drafts, a draft step feeding one or two tokens) reach it in the first request, while shapes that
occur once per request (the flush at the end, an odd catch-up) run eagerly or in a covering graph."""
MAX_COVER_WASTE = 2
"""A compiled graph serves a narrower step if it is at most this many times as wide."""

CPU_INDUCTOR_CONFIG = {"freezing": True, "max_autotune": True, "max_autotune_gemm_backends": "CPP"}
"""Inductor settings a CPU step is traced and compiled under: the weights become constants of the
graph (``freezing``), prepacked for inductor's C++ GEMM template, which reads them at the memory's
bandwidth. Measured on the 2-core CPU (docs/design.md, "Compiled steps"): the zoo's ``s`` model
verifies 1 token in 1.2 ms instead of 4.3 ms, 5 tokens in 1.8 ms instead of 8.0 ms, all in fp32.
With the CPP backend alone inductor builds one candidate per matmul and benchmarks nothing, so
the kernels do not depend on how busy the machine was while compiling. ``freezing`` must be set
when dynamo *traces* (it decides then to keep parameters as constants), hence a config patch around
the first call rather than ``torch.compile(options=...)``, which reaches inductor only. Each
compiled step keeps its own packed copy of the weights."""

GRAPH_MEMORY_RESERVE = 2 * 2**30
"""Bytes of available memory a new CPU graph must leave, beyond twice the weights it copies
(compiling packs them while the previous buffers are still alive)."""


def compiled_step(step: Callable, device: torch.device) -> Callable:
    """``step`` compiled through a function of its own. Dynamo keeps the compiled variants of a
    function per code object and tries their guards one after the other at every call; a shared
    code object (every level and width compiled through one wrapper) makes that list long, each
    call slower as it grows, and at the recompile limit dynamo silently runs the step uncompiled.
    A private copy of a small forwarding function keeps one variant per list (docs/design.md,
    "Compiled steps")."""

    def forward(*args):
        return step(*args)

    code = forward.__code__.replace()  # an equal code object, distinct from every other copy
    own = types.FunctionType(code, forward.__globals__, forward.__name__, None, forward.__closure__)
    # Guards on tensors only (shapes, dtypes, devices) and on symbolic sizes: everything else a step
    # depends on is in the key it is built under, and the models are fingerprinted (LevelStep.of). The
    # full guard set (the models' modules and configs) cost 100-200 us per call here, a fifth of a draft
    # step. The C++ wrapper saves another 10-17 % of a step on CPU (measured: docs/design.md, "Compiled
    # steps").
    options: dict = {"guard_filter_fn": _tensor_and_shape_guards}
    if device.type == "cuda":
        options["triton.cudagraphs"] = True  # mode="reduce-overhead", which cannot take options too
    else:
        options["cpp_wrapper"] = CPP_WRAPPER
    compiled = torch.compile(own, fullgraph=True, dynamic=False, options=options)
    weakref.finalize(compiled, _forget_graphs, code).atexit = False  # at exit everything goes anyway
    return compiled


def _tensor_and_shape_guards(guard_entries: list) -> list[bool]:
    """``torch.compiler.keep_tensor_guards_unsafe`` (the guards on tensors other than parameters:
    dtype, device, sizes) and also those on symbolic sizes (the capacity dimension,
    ``layout.capacity_buffer``: what the graph assumed of it, a bound or a relation between
    two buffers); the rest are dropped."""
    keep = torch.compiler.keep_tensor_guards_unsafe(guard_entries)
    return [k or entry.guard_type == "SHAPE_ENV" for k, entry in zip(keep, guard_entries, strict=True)]


def _forget_graphs(code: types.CodeType) -> None:
    """Drop what dynamo keeps for ``code`` (its cache entries, their guards and compiled code) once
    the step is gone: dynamo keeps them on the code object, which its own tables keep alive (the
    compiled code maps back to it), so they stayed until ``torch._dynamo.reset()``. The frozen weight
    copies of a CPU graph are not among them: inductor keeps those beyond ``reset()`` too
    (docs/design.md, "Caches and slots")."""
    forget = getattr(torch._dynamo.eval_frame, "remove_from_cache", None)
    if forget is not None:
        forget(code)


_SECONDS = threading.local()
"""``.total``: seconds this thread has spent in steps' first calls (compiling), ``compile_seconds``."""


def compile_seconds() -> float:
    """Seconds this thread has spent compiling steps so far (a run's share: the difference over it)."""
    return getattr(_SECONDS, "total", 0.0)


class Compiling:
    """A compiled step that reports its first call, when it compiles (tens of seconds on a CPU, a few
    where inductor's cache has the step from an earlier process), on one progress line shared by all
    steps of the process, and counts its seconds (``compile_seconds``)."""

    bar: tqdm | None = None

    def __init__(self, fn: Callable, name: str, device: torch.device, model: object = None) -> None:
        self.fn, self.name, self.compiled = fn, name, False
        # The model whose weights the step reads: on a CPU its digest keys the step in inductor's cache.
        self.model = model if isinstance(model, torch.nn.Module) else None
        self.config = CPU_INDUCTOR_CONFIG if device.type == "cpu" else {}
        self.cuda = device.type == "cuda"

    def __call__(self, *args):
        if self.cuda:  # the engine has read the last step's output: its graph memory may be reused
            torch.compiler.cudagraph_mark_step_begin()
        if self.compiled:
            return self.fn(*args)
        if Compiling.bar is None:
            Compiling.bar = tqdm(desc="hsd_fast: compiling steps", unit=" step", leave=False)
        Compiling.bar.set_postfix_str(self.name)
        # Traced and compiled in this call. No duck sizing: buffers whose capacities are equal in this
        # run get a symbol each (layout.capacity_buffer), so a run where they differ reuses the graph.
        no_duck_sizing = torch.fx.experimental._config.patch(use_duck_shape=False)
        # A CPU step compiled once is loaded by later processes from inductor's cache (graph_cache.py).
        cache = contextlib.nullcontext() if self.cuda else weights_in_cache_key(self.model)
        started = time.perf_counter()
        with torch._inductor.config.patch(self.config), no_duck_sizing, cache:
            out = self.fn(*args)
        _SECONDS.total = compile_seconds() + time.perf_counter() - started
        self.compiled = True
        Compiling.bar.update()
        return out

    @classmethod
    def done(cls) -> None:
        """Close the progress line (at the end of a run that compiled something)."""
        if cls.bar is not None:
            cls.bar.close()
            cls.bar = None


def available_memory() -> int | None:
    """Bytes the OS could give this process now (``MemAvailable`` of /proc/meminfo), or None where
    that is not known."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def graph_memory_ok(weight_bytes: int) -> bool:
    """Whether a CPU graph that freezes ``weight_bytes`` of weights fits in the available memory."""
    available = available_memory()
    return available is None or available >= 2 * weight_bytes + GRAPH_MEMORY_RESERVE


def fingerprint(runner: object) -> tuple:
    """What a compiled step assumes of a runner's model beyond tensor shapes: which parameter
    tensors it holds (a replaced or reallocated weight changes this), their contents (a compiled CPU
    step holds a frozen copy of the weights, so an in-place edit, which bumps a tensor's version
    counter, must rebuild it) and its attention implementation. A runner without a ``model`` module
    has none: ``()``."""
    model = getattr(runner, "model", None)
    if not isinstance(model, torch.nn.Module):
        return ()
    params = tuple((id(p), p.data_ptr(), p._version) for p in model.parameters())
    return (getattr(model.config, "_attn_implementation", None), params)
