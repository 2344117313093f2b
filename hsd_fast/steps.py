"""Level steps: one forward of a level over its fed block, the sampling transform, then a draft
(level 0) or a verification (levels >= 1), on device tensors, in the padded layout of
``layout.py``. Each step is a pure function of tensors at static shapes, so the same code runs
eagerly or compiled (``torch.compile``: inductor on CPU, CUDA graphs on CUDA), once per level and
pair of widths (docs/design.md, "Compiled steps").

Shapes: B rows in the run, L fed columns, O output columns (the last O of the L), D = O - 1 draft
columns of a verification, V vocabulary, S token positions, W ring slots.

A step writes its results into the run's tensors (the drawn or corrected token into ``tokens``, the
emitting level's distribution into the ring) and returns one small ``[2, B]`` int64 tensor, the
only thing the host reads back: per row the accepted count and whether the new token is an EOS.
Rows that sit the step out write to trash slots (the last column of ``tokens``, the last ring slot).
"""

from __future__ import annotations

import functools
import time
import types
import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np
import torch
from tqdm.auto import tqdm

from hsd_fast.layout import MAX_WIDTH, FedBlock, bucket, fed_block, head_chunks
from hsd_fast.processors import LogitsTransform
from hsd_fast.sampling_metadata import SamplingMetadata
from hsd_fast.triton_kernels.keyed_random_torch import DRAFT
from hsd_fast.triton_kernels.ops import sample, verify
from hsd_fast.triton_kernels.rejection_torch import VerifyResult

if TYPE_CHECKING:
    from hsd_fast.tree_steps import TreeBuffers


class Runner(Protocol):
    """One level of the hierarchy: a model plus its cache."""

    vocab_size: int
    dtype: torch.dtype  # of the logits it returns

    def prepare(self, num_rows: int, capacity: int, tree_slots: int = 0) -> None:
        """Start a run: empty caches for ``num_rows`` rows of up to ``capacity`` positions, and
        ``tree_slots`` more slots past them (a token tree's nodes stand after a row's prefix)."""

    def forward(self, block: FedBlock, num_outputs: int) -> torch.Tensor:
        """Cache the valid tokens of ``block`` and return the raw logits of its last
        ``num_outputs`` columns, ``[B, num_outputs, V]``."""

    def move(self, tree_start: torch.Tensor, nodes: torch.Tensor, lengths: torch.Tensor) -> None:
        """After a token tree's verification: per row, copy the cache entries of tree slots
        ``tree_start + nodes[:, d]`` to slots ``tree_start + d`` for ``d < lengths`` (``[B]``,
        ``[B, K]``, ``[B]``), all read before any is written (docs/design.md, "Token trees in the
        engine")."""


def graph_buffer(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``, a buffer that compiled steps write in place, marked on CUDA as a static input.
    Inductor's CUDA graphs (cudagraph trees) skip every graph that mutates an input not marked so:
    without the mark no compiled step replays from a graph. A new buffer in a marked input's place
    (the next run's) makes the graph record again (docs/design.md, "Compiled steps")."""
    if tensor.is_cuda:
        torch._dynamo.mark_static_address(tensor, guard=False)
    return tensor


class BufferPool:
    """Zeroed buffers for a run, taken from finished runs of the same shapes where it can. On CUDA a
    compiled step's graph is recorded for the addresses of the buffers it writes, and a run that
    brings new ones makes every graph record again (an extra run of each step, and one more
    recorded graph kept for each, request after request): reusing a finished run's buffers keeps the
    addresses. A buffer returns to the pool when the object that took it is collected, so two live
    runs never share one; the pool keeps the free buffers of its ``max_shapes`` most recent shapes.
    Pools on ``device_types`` only (a CPU has no graphs to keep)."""

    def __init__(self, device_types: frozenset[str] = frozenset({"cuda"}), max_shapes: int = 4) -> None:
        self.device_types, self.max_shapes = device_types, max_shapes
        self._free: dict[tuple, list[torch.Tensor]] = {}  # shape key -> free buffers, oldest key first

    def zeros(
        self, owner: object, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        """A zeroed ``shape`` buffer that belongs to ``owner`` until ``owner`` is collected."""
        if device.type not in self.device_types:
            return torch.zeros(shape, dtype=dtype, device=device)
        key = (tuple(shape), dtype, device)
        free = self._free.pop(key, [])
        self._keep(key, free)  # the most recent shape now
        buffer = free.pop().zero_() if free else graph_buffer(torch.zeros(shape, dtype=dtype, device=device))
        weakref.finalize(owner, self._give_back, key, buffer)
        return buffer

    @property
    def free_buffers(self) -> int:
        """How many buffers the pool holds for later runs."""
        return sum(len(free) for free in self._free.values())

    def _give_back(self, key: tuple, buffer: torch.Tensor) -> None:
        free = self._free.pop(key, [])
        free.append(buffer)
        self._keep(key, free)

    def _keep(self, key: tuple, free: list[torch.Tensor]) -> None:
        self._free[key] = free
        while len(self._free) > self.max_shapes:
            del self._free[next(iter(self._free))]


POOL = BufferPool()
"""The buffers of every run's ``DecodeState`` and token-tree buffers."""


class DecodeState:
    """The tensors of one run: every row's tokens by position and, for every speculative position,
    the distribution of the level that tagged it (processed logits + fp32 log-sum-exp) in a ring of
    W slots: the ``q`` the next level up verifies against. Greedy runs need no ring."""

    def __init__(
        self,
        prompts: Sequence[torch.Tensor],
        capacity: int,
        window: int,
        vocab: int,
        ring_dtype: torch.dtype,
        sampling: SamplingMetadata,
        transform: LogitsTransform,
        keep_q: bool,
    ) -> None:
        num_rows, device = len(prompts), prompts[0].device
        self.sampling, self.transform, self.window, self.trash = sampling, transform, window, capacity
        self.tokens = POOL.zeros(self, (num_rows, capacity + 1), torch.int64, device)  # [B, S + 1]
        for r, p in enumerate(prompts):
            self.tokens[r, : p.numel()] = p
        self.q_logits = self.q_lse = None
        if keep_q:  # slot W is the trash slot
            ring = (num_rows, window + 1, vocab)  # [B, W + 1, V]
            self.q_logits = POOL.zeros(self, ring, ring_dtype, device)
            self.q_lse = POOL.zeros(self, (num_rows, window + 1), torch.float32, device)  # [B, W + 1]
        # Everything a step's code depends on besides tensor shapes: a compiled step is built per
        # structure and guards on tensors only (see LevelStep). Without a ring the window is unused.
        ring = window if keep_q else None
        self.structure = (ring, capacity, sampling.greedy, keep_q, transform.key, str(ring_dtype))
        self.tree: TreeBuffers | None = None  # a token tree's pending nodes (level 0 drafts trees)

    def set_tree(self, buffers: TreeBuffers) -> None:
        """Level 0 drafts token trees of this topology, kept in ``buffers``; the topology is part of
        what a compiled step is built for."""
        self.tree = buffers
        self.structure = (*self.structure, buffers.plan.tree.parents)

    @property
    def num_rows(self) -> int:
        return self.tokens.shape[0]

    def ring_slot(self, positions: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """The ring slot of each position, or the trash slot where ``keep`` is false."""
        return torch.where(keep, positions % self.window, self.window)

    def keep_p(
        self, rows: torch.Tensor, slots: torch.Tensor, logits: torch.Tensor, lse: torch.Tensor
    ) -> None:
        """Store distributions (logits [..., V] and their fp32 log-sum-exp) at ring slots."""
        assert self.q_logits is not None and self.q_lse is not None
        self.q_logits[rows, slots] = logits.to(self.q_logits.dtype)
        self.q_lse[rows, slots] = lse

    def write_proposals(
        self,
        rows: np.ndarray,  # [R]
        ends: np.ndarray,  # [R]
        proposals: np.ndarray,  # [R, W] row i's first counts[i] entries proposed
        counts: np.ndarray,  # [R]
    ) -> None:
        """Put a lookup level's proposals (row ``rows[i]``'s at positions ``ends[i]``, ``ends[i] + 1``,
        ...) into the token buffer. Their q, a point mass on each token, is not written: the level
        above verifies them in the op's point-mass mode (docs/design.md, "The lookup level")."""
        offsets = np.arange(proposals.shape[1])  # [W]
        taken = offsets < counts[:, None]  # [R, W]
        if not taken.any():
            return
        at_row = np.broadcast_to(rows[:, None], taken.shape)[taken]  # [N] over all proposed tokens
        positions = (ends[:, None] + offsets)[taken]  # [N]
        if self.tokens.device.type == "cpu":  # written through numpy: a fifth of the tensor ops' time
            self.tokens.numpy()[at_row, positions] = proposals[taken]
            return
        device = self.tokens.device
        self.tokens[torch.from_numpy(at_row).to(device), torch.from_numpy(positions).to(device)] = (
            torch.from_numpy(proposals[taken]).to(device)
        )


def processed_logits(runner: Runner, state: DecodeState, block: FedBlock, num_outputs: int) -> torch.Tensor:
    logits = runner.forward(block, num_outputs)  # [B, O, V]
    return state.transform(logits.flatten(0, 1)).unflatten(0, logits.shape[:2])  # [B, O, V]


def broken_logits(logits: torch.Tensor, used: torch.Tensor) -> torch.Tensor:
    """[B] bool: a row whose used logits (``used``: [B] or [B, O]) hold a NaN or +inf (-inf marks an
    excluded token, which is fine): no distribution, so nothing drawn from it may be trusted."""
    bad = (torch.isnan(logits) | torch.isposinf(logits)).any(-1) & used  # [B] or [B, O]
    return bad if bad.dim() == 1 else bad.any(-1)


def step_result(
    num_accepted: torch.Tensor,
    token: torch.Tensor,
    eos_ids: torch.Tensor,
    active: torch.Tensor,
    broken: torch.Tensor,
) -> torch.Tensor:
    """[3, B] int64: accepted counts, whether the new token is an EOS, and whether the row's logits
    were broken (NaN or +inf), for active rows."""
    is_eos = (token[:, None] == eos_ids[None, :]).any(-1) & active  # [B]
    return torch.stack([num_accepted, is_eos.long(), broken.long()])


def draft_step(
    runner: Runner,
    state: DecodeState,
    spans: torch.Tensor,  # [5, B] int64 per row: starts, ends, outs, active (0/1), drafts wanted
    *,
    width: int,
    count: int,
    keep_q: bool,
    use_kernel: bool | None,
) -> torch.Tensor:  # [2, B]
    """Level 0: feed the block, then draw up to ``count`` tokens one after the other at positions
    ``ends, ends + 1, ...``: row r stops after its wanted number, or after an EOS. Drafting a few
    tokens in one step draws exactly the tokens one-token steps would (keyed randomness: a token's
    uniforms depend on its position, not on the step) and saves a step's overhead per token.
    Returns per row the number drawn, whether the last one is an EOS, and whether any logits it drew
    from were broken."""
    starts, ends, meta = spans[0], spans[1], state.sampling
    going, wanted = spans[3].bool() & (spans[4] > 0), spans[4]  # [B]
    rows = torch.arange(state.num_rows, device=ends.device)
    block = fed_block(state.tokens, starts, ends, going, width)
    drawn_count = torch.zeros_like(ends)
    last_is_eos, broken = torch.zeros_like(going), torch.zeros_like(going)
    for k in range(count):
        if k > 0:  # feed the token drawn last
            block = fed_block(state.tokens, ends + k - 1, ends + k, going, 1)
        logits = processed_logits(runner, state, block, 1)[:, 0]  # [B, V]
        broken = broken | broken_logits(logits, going)
        position = ends + k  # [B]
        drawn, lse = sample(
            logits, meta.temperature, meta.seeds, position, 0, DRAFT, meta.greedy, use_kernel=use_kernel
        )  # [B], [B]
        state.tokens[rows, torch.where(going, position, state.trash)] = drawn
        if keep_q:
            state.keep_p(rows, state.ring_slot(position, going), logits, lse)
        last_is_eos = torch.where(going, (drawn[:, None] == meta.eos_ids).any(-1), last_is_eos)
        drawn_count = drawn_count + going.long()
        going = going & ~last_is_eos & (k + 1 < wanted)
    return torch.stack([drawn_count, last_is_eos.long(), broken.long()])


def verify_step(
    runner: Runner,
    state: DecodeState,
    spans: torch.Tensor,  # [5, B] int64 per row: starts, ends, outs, active; drafts at [outs + 1, ends)
    *,
    level: int,
    width: int,
    out_width: int,
    keep_q: bool,
    use_kernel: bool | None,
    point_mass: bool = False,
) -> torch.Tensor:  # [2, B]
    """Level >= 1: feed the block, verify each row's drafts at ``[outs + 1, ends)`` against the ring
    (``point_mass``: the drafts are a lookup level's, each q a point mass on its token, and no ring is
    read), write the correction or bonus, and (``keep_q``) keep this level's p for the tokens it
    emitted. Returns [3, B]: accepted counts, EOS flags and broken-logits flags."""
    starts, ends, outs, active = spans[0], spans[1], spans[2], spans[3].bool()
    meta, drafts = state.sampling, out_width - 1  # D draft columns
    rows = torch.arange(state.num_rows, device=ends.device)
    logits = processed_logits(runner, state, fed_block(state.tokens, starts, ends, active, width), out_width)
    num_drafts = torch.where(active, ends - outs - 1, 0)  # [B]
    columns = torch.arange(drafts + 1, device=ends.device)  # [D + 1]
    positions = ends[:, None] - drafts + columns  # [B, D + 1]: the token each column's p is for
    draft_tokens = state.tokens.gather(1, positions[:, :drafts].clamp(min=0))  # [B, D]
    if meta.greedy:  # greedy verification reads no q
        draft_logits = logits.new_zeros(()).expand(state.num_rows, drafts, logits.shape[-1])
        draft_lse = logits.new_zeros((), dtype=torch.float32).expand(state.num_rows, drafts)
    elif point_mass:
        draft_logits = draft_lse = None
    else:
        assert state.q_logits is not None and state.q_lse is not None
        is_draft = columns[:drafts] >= drafts - num_drafts[:, None]  # [B, D]
        slots = state.ring_slot(positions[:, :drafts].clamp(min=0), is_draft)  # [B, D]
        draft_logits, draft_lse = state.q_logits[rows[:, None], slots], state.q_lse[rows[:, None], slots]
    result = verify(
        logits, draft_logits, draft_lse, draft_tokens, num_drafts, meta.temperature, meta.seeds,
        ends - num_drafts, level, meta.greedy, use_kernel=use_kernel,
    )  # fmt: skip
    emitted_at = ends - num_drafts + result.num_accepted  # [B]
    state.tokens[rows, torch.where(active, emitted_at, state.trash)] = result.next_token
    if keep_q:
        emitted = active[:, None] & (columns >= drafts - num_drafts[:, None])  # [B, D + 1]
        keep_emitted(state, rows, state.ring_slot(positions.clamp(min=0), emitted), logits, result)
    used = active[:, None] & (columns >= drafts - num_drafts[:, None])  # [B, D + 1]: drafts and bonus
    return step_result(
        result.num_accepted, result.next_token, meta.eos_ids, active, broken_logits(logits, used)
    )


def keep_emitted(
    state: DecodeState,
    rows: torch.Tensor,  # [B]
    slots: torch.Tensor,  # [B, D + 1] ring slots of the tokens at the verifier's columns (or trash)
    logits: torch.Tensor,  # [B, D + 1, V] the verifier's processed logits
    result: VerifyResult,
) -> None:
    """Keep the verifier's own p for every token it just emitted (accepted, correction or bonus):
    the q the next level up verifies them against. Never the residual a correction was drawn from:
    that token is still marginally a sample of p (docs/design.md, "Verify")."""
    state.keep_p(rows[:, None], slots, logits, result.verifier_lse)


def feed_step(runner: Runner, state: DecodeState, spans: torch.Tensor, *, width: int) -> None:
    """Only cache a chunk of a long span (a prompt), ``width`` at a time; no outputs are needed."""
    runner.forward(fed_block(state.tokens, spans[0], spans[1], spans[3].bool(), width), 1)


def _compiled(step: Callable, device: torch.device) -> Callable:
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
    # Guards on tensors only (shapes, dtypes, devices): everything else a step depends on is in the
    # key it is built under, and the models are fingerprinted (LevelStep.of). The full guard set (the
    # models' modules and configs) cost 100-200 us per call here, a fifth of a draft step. The C++
    # wrapper saves another 10-17 % of a step on CPU (measured: docs/design.md, "Compiled steps").
    options: dict = {"guard_filter_fn": torch.compiler.keep_tensor_guards_unsafe}
    if device.type == "cuda":
        options["triton.cudagraphs"] = True  # mode="reduce-overhead", which cannot take options too
    else:
        options["cpp_wrapper"] = CPP_WRAPPER
    return torch.compile(own, fullgraph=True, dynamic=False, options=options)


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


class _Compiling:
    """A compiled step that reports its first call, when it compiles (tens of seconds on a CPU), on
    one progress line shared by all steps of the process."""

    bar: tqdm | None = None

    def __init__(self, fn: Callable, name: str, device: torch.device) -> None:
        self.fn, self.name, self.compiled = fn, name, False
        self.config = CPU_INDUCTOR_CONFIG if device.type == "cpu" else {}
        self.cuda = device.type == "cuda"

    def __call__(self, *args):
        if self.cuda:  # the engine has read the last step's output: its graph memory may be reused
            torch.compiler.cudagraph_mark_step_begin()
        if self.compiled:
            return self.fn(*args)
        if _Compiling.bar is None:
            _Compiling.bar = tqdm(desc="hsd_fast: compiling steps", unit=" step", leave=False)
        _Compiling.bar.set_postfix_str(self.name)
        with torch._inductor.config.patch(self.config):  # traced and compiled in this call
            out = self.fn(*args)
        self.compiled = True
        _Compiling.bar.update()
        return out

    @classmethod
    def done(cls) -> None:
        """Close the progress line (at the end of a run that compiled something)."""
        if cls.bar is not None:
            cls.bar.close()
            cls.bar = None


CPP_WRAPPER = True
COMPILED_MAX_WIDTH = 16
"""The widest step that is compiled: decoding feeds a few tokens per step; a prefill feeds many."""
COMPILE_AFTER_USES = 3
"""A step shape is compiled at its third use: the shapes of every round (a verification of T
drafts, a draft step feeding one or two tokens) reach it in the first request, while shapes that
occur once per request (the flush at the end, an odd catch-up) run eagerly or in a covering graph."""
MAX_COVER_WASTE = 2
"""A compiled graph serves a narrower step if it is at most this many times as wide."""
# runner -> {(level, top, compile, point mass): step}
_STEPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


GRAPH_MEMORY_RESERVE = 2 * 2**30
"""Bytes of available memory a new CPU graph must leave, beyond twice the weights it copies
(compiling packs them while the previous buffers are still alive)."""


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


def _fingerprint(runner: Runner) -> tuple:
    """What a compiled step assumes of a model beyond tensor shapes: which parameter tensors it
    holds (a replaced or reallocated weight changes this), their contents (a compiled CPU step holds
    a frozen copy of the weights, so an in-place edit, which bumps a tensor's version counter, must
    rebuild it) and its attention implementation."""
    model = getattr(runner, "model", None)
    if not isinstance(model, torch.nn.Module):
        return ()
    params = tuple((id(p), p.data_ptr(), p._version) for p in model.parameters())
    return (getattr(model.config, "_attn_implementation", None), params)


class LevelStep:
    """One level of a run: its runner and its step functions, one per step *shape* (kind, fed width,
    output width or draft count). ``compile``: run steps through ``torch.compile`` (fullgraph,
    static shapes); a compiled graph costs tens of seconds on a CPU, so few are built
    (``choose``): a shape runs in an already compiled graph that covers it when one is at most
    ``MAX_COVER_WASTE`` times as wide, and is compiled itself only at its ``COMPILE_AFTER_USES``-th use;
    until then it runs eagerly (the same code). Prefills and steps wider than ``COMPILED_MAX_WIDTH``
    always run eagerly: a graph per prompt length would cost more to compile than it could save."""

    def __init__(
        self,
        runner: Runner,
        level: int,
        top: int,
        compile: bool = False,
        compile_after_uses: int = COMPILE_AFTER_USES,
        point_mass: bool = False,
        tree_below: Runner | None = None,
    ) -> None:
        self.runner, self.level, self.top, self.compile = runner, level, top, compile
        self.point_mass = point_mass  # it verifies a lookup level's proposals
        # A token tree at level 0 (docs/design.md, "Token trees in the engine"): level 0 drafts
        # trees; level 1 verifies them and moves the accepted path in level 0's cache too.
        self.tree_below = tree_below
        self.compile_after_uses = compile_after_uses  # 1: every shape compiles at once (profiling)
        self.functions: dict[tuple, Callable] = {}
        self.compiled: dict[tuple, list[tuple[int, int]]] = {}  # (kind, structure) -> compiled shapes
        self.uses: dict[tuple, int] = {}  # shape key -> uses so far
        self.fingerprint = _fingerprint(runner)
        self.memory_capped = False  # memory allowed no more graphs (_room_for_a_graph)

    @classmethod
    def of(
        cls,
        runner: Runner,
        level: int,
        top: int,
        compile: bool = False,
        point_mass: bool = False,
        tree_below: Runner | None = None,
    ) -> LevelStep:
        """The step of ``runner`` at this place in a hierarchy (``point_mass``: above a lookup
        level; ``tree_below``: level 1 verifying the token trees this level 0 runner drafts), kept
        with the runner so that what was built (and compiled) for it serves every later run, unless
        the model changed since."""
        steps = _STEPS.setdefault(runner, {})
        key = (level, top, compile, point_mass, None if tree_below is None else id(tree_below))
        if key not in steps or steps[key].fingerprint != _fingerprint(runner):
            steps[key] = cls(runner, level, top, compile, point_mass=point_mass, tree_below=tree_below)
        return steps[key]

    @staticmethod
    def compile_progress_done() -> None:
        _Compiling.done()

    def choose(self, kind: str, width: int, out_width: int, state: DecodeState, prefill: bool) -> Callable:
        """The function that runs a step of this shape (``width`` fed columns, ``out_width`` output
        columns or drafts): its own compiled graph, a compiled graph of the same kind at most
        ``MAX_COVER_WASTE`` times as wide that covers it (padding columns are invalid columns, and a
        verification with fewer drafts than columns leaves the first ones out), or eagerly until
        the shape has been used ``COMPILE_AFTER_USES`` times. A step that could compile runs in a
        wider covering graph rather than eagerly while it waits."""
        if not self.compile or prefill or width > COMPILED_MAX_WIDTH:
            return self.function(kind, width, out_width, state, compiled=False)
        family = (kind, *state.structure)
        compiled = self.compiled.setdefault(family, [])
        covering = sorted((w, o) for w, o in compiled if w >= width and o >= out_width)
        if covering and ((width, out_width) in compiled or covering[0][0] <= MAX_COVER_WASTE * width):
            return self.function(kind, *covering[0], state, compiled=True)  # its own graph comes first
        key = (*family, width, out_width)
        self.uses[key] = self.uses.get(key, 0) + 1
        if self.uses[key] >= self.compile_after_uses and self._room_for_a_graph(state.tokens.device):
            compiled.append((width, out_width))
            return self.function(kind, width, out_width, state, compiled=True)
        if covering:
            return self.function(kind, *covering[0], state, compiled=True)
        return self.function(kind, width, out_width, state, compiled=False)

    def _room_for_a_graph(self, device: torch.device) -> bool:
        """Whether memory allows one more compiled graph of this level. On a CPU each graph holds
        its own packed copy of the model's weights (``CPU_INDUCTOR_CONFIG``), so graphs of a large
        model can exhaust the memory; past ``graph_memory_ok``'s limit a new shape runs in a
        covering graph or eagerly (the same tokens), and the run warns once."""
        if self.memory_capped:
            return False
        if device.type != "cpu":
            return True
        model = getattr(self.runner, "model", None)
        if not isinstance(model, torch.nn.Module):
            return True
        weights = sum(p.numel() * p.element_size() for p in model.parameters())
        if graph_memory_ok(weights):
            return True
        self.memory_capped = True
        warnings.warn(
            f"hsd_fast: level {self.level}'s model ({weights / 2**30:.2f} GiB of weights) compiles no more "
            "step graphs: each holds its own copy of the weights on a CPU and memory is short; new step "
            "shapes run eagerly or in a wider graph (same tokens, slower)",
            RuntimeWarning,
            stacklevel=2,
        )
        return False

    def function(
        self, kind: str, width: int, out_width: int, state: DecodeState, compiled: bool = False
    ) -> Callable:
        """The step function for these widths, compiled or eager (built once, then kept)."""
        key = (kind, width, out_width, compiled, *state.structure)
        fn = self.functions.get(key)
        if fn is None:
            keep_q = state.q_logits is not None and self.level < self.top
            use_kernel = False if compiled else state.sampling.use_kernel  # compiled: traced torch
            if kind == "feed":
                fn = functools.partial(feed_step, self.runner, width=width)
            elif kind.startswith("tree"):  # imported here: tree_steps builds on this module
                from hsd_fast import tree_steps

                if kind == "tree draft":
                    fn = functools.partial(tree_steps.tree_draft_step, self.runner, width=width)
                else:
                    fn = functools.partial(
                        tree_steps.tree_verify_step, self.runner, self.tree_below, width=width, keep_q=keep_q
                    )
            elif kind == "draft":
                fn = functools.partial(
                    draft_step,
                    self.runner,
                    width=width,
                    count=out_width,
                    keep_q=keep_q,
                    use_kernel=use_kernel,
                )
            else:
                fn = functools.partial(
                    verify_step, self.runner, level=self.level, width=width, out_width=out_width,
                    keep_q=keep_q, use_kernel=use_kernel, point_mass=self.point_mass,
                )  # fmt: skip
            if compiled:
                device = state.tokens.device
                name = f"level {self.level} {kind} {width}x{out_width}"
                fn = _Compiling(_compiled(fn, device), name, device)
            self.functions[key] = fn
        return fn

    def __call__(
        self,
        state: DecodeState,
        rows: np.ndarray,  # [R] the rows that take part
        starts: np.ndarray,  # [R] what each feeds: [starts, ends) (the ledger's spans)
        ends: np.ndarray,  # [R]
        outs: np.ndarray,  # [R] a verification's drafts are [outs + 1, ends)
        wanted: np.ndarray | None = None,  # [R] drafts: tokens each row wants drawn
        count: int | None = None,  # drafts: the most tokens a draft step of this run draws (T_0)
    ) -> tuple[np.ndarray, float]:
        """Run the step for ``rows``. Returns ``[3, R]`` (a draft: tokens drawn and whether the last
        is an EOS; a verification: accepted counts and whether the new token is an EOS; and whether
        the row's logits held a NaN or +inf) and the seconds spent in forwards (a long span's head
        chunks, then the step function, its host sync included): a round's remaining time is the
        host's own work. A compiled draft step
        always draws ``count`` tokens' worth of forwards (rows stop at their ``wanted``): one graph
        serves the whole run, whatever is left of a row's budget."""
        full = np.zeros((5, state.num_rows), dtype=np.int64)  # starts, ends, outs, active, wanted
        full[:, rows] = np.stack(
            [starts, ends, outs, np.ones_like(rows), np.ones_like(rows) if wanted is None else wanted]
        )
        device = state.tokens.device
        started = time.perf_counter()  # the head chunks below are forwards too, not the engine's host work
        # What is fed in chunks: the span, or before a token tree's verification, the span up to
        # the tree (its nodes follow in the step).
        span_ends = full[2] + 1 if self.tree_below is not None else full[1]
        longest = int((span_ends - full[0]).max())
        if longest > MAX_WIDTH:  # long spans (prompts): their heads first, MAX_WIDTH at a time
            for head_start, head_end in head_chunks(full[0], span_ends, MAX_WIDTH):
                chunk = np.stack([head_start, head_end, head_end, head_end > head_start, head_end * 0])
                self.function("feed", MAX_WIDTH, 0, state)(state, torch.from_numpy(chunk).to(device))
                full[0] = np.maximum(full[0], head_end)
            longest = int((span_ends - full[0]).max())
        prefill = bool((full[0, rows] == 0).any())
        if state.tree is not None and self.level <= 1:  # a token tree: its shape is the tree's
            kind = "tree draft" if self.level == 0 else "tree verify"
            fn = self.choose(kind, bucket(max(longest, 1)), 0, state, prefill)
        elif self.level == 0:
            drawn = int(full[4].max())
            fixed = self.compile and count is not None and drawn <= count and not prefill
            fn = self.choose("draft", bucket(longest), count if fixed else drawn, state, prefill)
        else:
            out_width = bucket(int((full[1] - full[2]).max()))
            fn = self.choose("verify", bucket(longest), out_width, state, prefill)
        out = fn(state, torch.from_numpy(full).to(device)).cpu().numpy()  # the round's one host sync
        return out[:, rows], time.perf_counter() - started
