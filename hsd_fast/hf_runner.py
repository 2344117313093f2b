"""A runner for a Hugging Face causal LM: static preallocated KV cache written at explicit slots.

One forward feeds a fed block (``layout.py``: ``[B, L]`` right-aligned, a validity mask) and returns
the logits of its last O columns (``logits_to_keep``). Slots equal positions: row r's token at
position t lives in cache slot t; padding, and rows that sit this forward out, write their K/V to
a scratch slot and attend only to it (docs/design.md, "Padding and rows that sit out"), so they
change no state. The 4D masks are built here from the block's positions (additive, which SDPA and
eager both read correctly; eager misreads a bool mask: docs/design.md, "4D masks are used as is;
the eager + bool trap"), one per attention window: sliding-window layers get their window applied by
position, since the cache keeps every position (docs/design.md, "Sliding windows by position"). Explicit
``position_ids`` keep RoPE and learned positions right. All of it is tensor code at the block's
shapes, so a compiled step traces through it.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import threading
import weakref
from collections.abc import Iterable, Iterator, Sequence

import torch
from transformers.cache_utils import Cache

from hsd_fast import attention, exit_reuse
from hsd_fast.architectures import layer_types, module_source, window
from hsd_fast.attached import attached
from hsd_fast.buffer_pool import graph_buffer
from hsd_fast.compat import embeddable_ids, fit_logits
from hsd_fast.early_exit import exit_of, with_hidden_tap
from hsd_fast.layout import FedBlock, capacity_bucket, capacity_buffer
from hsd_fast.positions import check_positions, max_positions
from hsd_fast.triton_kernels.ops import triton_installed
from hsd_fast.triton_kernels.tree_attention_torch import attention_meta


class SlotCache(Cache):
    """K/V buffers ``[B, H_kv, S, D]`` per layer; ``update`` scatters at ``self.slots`` ([B, L]).

    A layer's buffers are allocated at its first ``update``, from the K and V it is given: head counts,
    head dims and dtypes may differ per layer and between K and V (docs/design.md, "Caches that follow
    the model"). ``HFRunner.prepare`` makes that first call happen in a probe forward, outside any
    compiled step. Overrides the ``Cache`` level only (``update``, ``get_seq_length``, ``__len__``):
    the layer internals differ between transformers releases (docs/design.md, "A Cache subclass at
    the Cache level")."""

    def __init__(self, num_layers: int, rows: int, slots: int, device: torch.device) -> None:
        super().__init__(layers=[])
        self.rows, self.num_slots = rows, slots
        # [S] the slot ids: a step reads the slot count from this tensor's size, a symbol on a CPU
        self.slot_ids = capacity_buffer(graph_buffer(torch.arange(slots, device=device)), 0)
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers
        self.slots = torch.zeros(rows, 0, dtype=torch.int64)  # [B, L]
        self.calls: list[int] | None = None  # update calls per layer index, counted while probing
        # An early-exit level's layer-k hidden states [B, 1, S, H] by slot, kept as its K/V are
        # (HiddenTap, docs/design.md, "Early-exit levels"): allocated at the first keep_hidden.
        self.hidden: torch.Tensor | None = None

    @property
    def scratch(self) -> int | torch.SymInt:
        """The last slot, where padding columns write and which they alone see: read from
        ``slot_ids``' size, a symbol in a step compiled on a CPU."""
        return self.slot_ids.shape[0] - 1

    def reset(self) -> None:
        """Zero every buffer for a new run (docs/design.md, "Zero-initialised buffers": a NaN in a
        masked slot would still poison SDPA)."""
        for buffer in (*self.keys, *self.values, self.hidden):
            if buffer is not None:
                buffer.zero_()

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # key_states: [B, H_k, L, D_k], value_states: [B, H_v, L, D_v]
        if self.calls is not None:  # the probe forward: count, and skip an index beyond the layers
            if not 0 <= layer_idx < len(self.keys):
                self.calls.append(layer_idx)
                return key_states, value_states
            self.calls[layer_idx] += 1
        if self.keys[layer_idx] is None:
            self.keys[layer_idx] = self._zeros(key_states)
            self.values[layer_idx] = self._zeros(value_states)
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        # An index_put_ (rows and slots as advanced indices, so the written block is [B, L, H, D])
        # rather than a scatter_: a compiled step writes it in place, where a scatter_ made it copy
        # the whole cache twice per layer.
        rows = torch.arange(self.slots.shape[0], device=self.slots.device)[:, None]  # [B, 1]
        keys[rows, :, self.slots] = key_states.transpose(1, 2)
        values[rows, :, self.slots] = value_states.transpose(1, 2)
        return keys, values  # [B, H_k, S, D_k], [B, H_v, S, D_v]

    def keep_hidden(self, hidden_states: torch.Tensor) -> None:
        """Keep an exit view's layer-k output ``[B, L, H]`` at the slots this forward writes its K/V
        to: valid exactly where those K/V are, moved with them, so the ledger's cached length of the
        level says which are valid."""
        if self.hidden is None:
            self.hidden = self._zeros(hidden_states[:, None])  # [B, 1, S, H]
        rows = torch.arange(self.slots.shape[0], device=self.slots.device)[:, None]  # [B, 1]
        self.hidden[rows, :, self.slots] = hidden_states[:, :, None]

    def _zeros(self, states: torch.Tensor) -> torch.Tensor:
        # Zero-initialised: a NaN in a masked slot would still poison SDPA.
        batch, heads, _, dim = states.shape
        return capacity_buffer(graph_buffer(states.new_zeros(batch, heads, self.num_slots, dim)), 2)

    def move(self, rows: torch.Tensor, sources: torch.Tensor, targets: torch.Tensor) -> None:
        """Copy every layer's K/V at slots ``sources`` to slots ``targets`` ([R, M] each, for the
        rows ``rows`` [R]): all gathered first, then scattered, so moves that overlap (an accepted
        tree path moving down onto slots it read from) are safe. Unused entries may name the same
        slot as source and target."""
        for buffer in (*self.keys, *self.values, self.hidden):
            if buffer is not None:  # [B, H, S, D]
                moved = buffer[rows[:, None], :, sources]  # [R, M, H, D]
                buffer[rows[:, None], :, targets] = moved

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0  # never consulted: every forward passes explicit position_ids and 4D masks

    def __len__(self) -> int:
        return len(self.keys)


ATTENTION_VARIABLE = "HSD_FAST_ATTENTION"
"""Where a user picks the attention path of the runners ``generate`` makes ("dense" or "auto")."""

_LOCKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> _ModelLock
_LOCKS_GUARD = threading.Lock()  # makes a model's lock exactly once


class _ModelLock:
    """A model's lock (docs/design.md, "Caches and slots"): held by one ``generate`` call at a time.
    A second call from the thread that holds it (a streamer that calls ``generate`` on a model of
    the running call) would wait for itself forever: it is refused instead."""

    def __init__(self) -> None:
        self.lock, self.owner = threading.Lock(), None

    def __enter__(self) -> None:
        if self.owner == threading.get_ident():
            raise RuntimeError(
                "generate was called on a model that a generate call of this same thread is using (from "
                "a streamer or a logits processor?): a model serves one call at a time"
            )
        self.lock.acquire()
        self.owner = threading.get_ident()

    def __exit__(self, *exc) -> None:
        self.owner = None
        self.lock.release()


class HFRunner:
    """One level of the hierarchy backed by an HF causal LM."""

    def __init__(self, model: torch.nn.Module, vocab_size: int, attention_path: str | None = None) -> None:
        """``attention_path``: "dense" (SDPA or eager with a dense 4D mask), "fused" (the
        tree-attention kernel, ``hsd_fast.attention``; refused for a model it cannot serve) or
        "auto" (fused on CUDA where Triton is installed and the model qualifies, dense elsewhere).
        None: the environment variable ``HSD_FAST_ATTENTION`` ("dense" or "auto"), "dense" if unset
        (docs/design.md, "Tree attention": why dense is the default for now)."""
        self.model = model
        # The hierarchy's vocabulary: the target's. A draft's logits are cut or padded to it, and ids
        # it cannot embed are fed as a stand-in (docs/design.md, "Vocabularies").
        self.vocab_size = vocab_size
        self.stand_in = model.get_input_embeddings().weight.shape[0] < vocab_size
        self.dtype = next(model.parameters()).dtype
        self.cache: SlotCache | None = None
        config = model.config
        # One mask per layer type, each with its window (None: full attention). A model with one
        # layer type gets one 4D mask; a hybrid one a dict keyed by layer type, which its forward uses
        # as is (admitted only then: architectures.refusal).
        types = layer_types(config, module_source(type(model)))
        self.windows = {t: window(config, t) for t in dict.fromkeys(types)}
        parameters = inspect.signature(model.forward).parameters
        self.keeps_logits = "logits_to_keep" in parameters
        # transformers 5.24 renamed the forward's cache argument `past_key_values` to `cache` (the old
        # name stays a deprecated alias on most classes, not all: a class without the alias would drop
        # the cache into **kwargs unread).
        self.cache_keyword = "cache" if "cache" in parameters else "past_key_values"
        self.fused = self._fused(attention_path)
        if self.fused:
            attention.use_fused(model)
        self.from_hidden: dict[HFRunner, exit_reuse.FromHidden] = {}  # lower runner -> reuse_of's runner
        # What forward calls: the model, or for an early exit whose hidden states the level above
        # reads, a copy of it that keeps them (_keep_hidden_states).
        self.forward_model = model

    @property
    def scratch(self) -> int:
        """The cache's scratch slot (``SlotCache.scratch``); ``prepare()`` first."""
        assert self.cache is not None, "prepare() first"
        return self.cache.scratch

    def _fused(self, path: str | None) -> bool:
        if path is None:
            path = os.environ.get(ATTENTION_VARIABLE, "dense")
            if path not in ("auto", "dense"):
                raise ValueError(f"{ATTENTION_VARIABLE} must be 'auto' or 'dense', got {path!r}")
        if path not in ("auto", "fused", "dense"):
            raise ValueError(f"attention_path must be 'auto', 'fused' or 'dense', got {path!r}")
        if path == "dense":
            return False  # the default: no need to read the modeling source for a refusal
        refusal = attention.refusal(self.model, self.windows)
        if exit_of(self.model) is not None:
            # Its attention modules are the target's and read the target's config: switching the
            # view's config would not reach them (docs/design.md, "Early-exit levels").
            refusal = "an early-exit level shares the target's attention modules; it runs the dense path"
        if path == "fused" and refusal is not None:
            raise ValueError(f"{type(self.model).__name__} cannot take the fused attention kernel: {refusal}")
        if path == "auto":
            on_cuda = next(self.model.parameters()).is_cuda
            return on_cuda and triton_installed() and refusal is None
        return True

    @classmethod
    def of(cls, model: torch.nn.Module, vocab_size: int, copy: int = 0) -> HFRunner:
        """The runner of ``model``, kept while the model lives: its cache buffers and compiled steps
        serve every later ``generate`` call (a new runner would compile anew). ``copy``: which of the
        runners of a model that a request uses at several levels (each level needs its own cache).
        The caller holds the model's lock (``models_held``): the runner is not thread-safe."""
        runners = attached(model, "runners")  # {(vocab, copy): runner}
        key = (vocab_size, copy)
        if key not in runners:
            runners[key] = cls(model, vocab_size)
        return runners[key]

    def prepare(self, num_rows: int, capacity: int, tree_slots: int = 0) -> None:
        config = self.model.config
        limit = max_positions(config)
        check_positions(  # the request checked already: this guards run_hsd called directly
            capacity,
            [(f"model ({type(self.model).__name__})", limit)],
            asked="prompt + max_new_tokens",
            remedy="lower max_new_tokens",
        )
        needed = capacity + tree_slots  # a token tree's nodes stand in slots past a row's prefix
        slots = capacity_bucket(needed)  # in the compiled steps' shapes: a few sizes only
        if limit is not None:
            slots = max(needed, min(slots, limit))
        cache = self.cache
        if cache is not None and (cache.rows, cache.num_slots) == (num_rows, slots + 1):
            cache.reset()  # same shapes: reuse the buffers (and what was compiled for them)
        else:
            device = next(self.model.parameters()).device
            self.cache = SlotCache(config.num_hidden_layers, num_rows, slots + 1, device)
            self._keep_hidden_states()
            self._probe()

    def _keep_hidden_states(self) -> None:
        """An early-exit level whose target can start from its hidden states runs a copy of its
        model that keeps them (``keep_hidden``); its probe forward allocates their buffer."""
        origin = exit_of(self.model)
        reusable = origin is not None and exit_reuse.refusal(self.model, origin[0]) is None
        if reusable and self.forward_model is self.model:
            self.forward_model = with_hidden_tap(self.model, self)

    def keep_hidden(self, hidden_states: torch.Tensor) -> None:
        """The ``HiddenTap`` sink: layer k's output ``[B, L, H]`` of this forward, into the cache."""
        assert self.cache is not None
        self.cache.keep_hidden(hidden_states)

    def reuse_of(self, lower: object) -> exit_reuse.FromHidden | None:
        """The runner this level verifies with when ``lower`` (the level below) is an early exit of
        this model whose hidden states it can start from, else None. Its forward reads the hidden
        states at the block's positions: the caller feeds ``lower`` every position of a block first
        (docs/design.md, "Early-exit levels")."""
        model = getattr(lower, "model", None)
        if not isinstance(model, torch.nn.Module) or exit_reuse.refusal(model, self.model) is not None:
            return None
        if getattr(lower.cache, "hidden", None) is None:
            return None  # its cache keeps none (prepared before its target could take them)
        if lower not in self.from_hidden:
            depth = exit_reuse.shared_depth(model, self.model)
            self.from_hidden[lower] = exit_reuse.FromHidden(self, lower, depth)
        return self.from_hidden[lower]

    def _probe(self) -> None:
        """The cache's first forward: one padding token per row (scratch slot only, no state), which
        allocates every layer's buffers at its first ``update``. A model must call ``update`` exactly
        once per layer: one that shares K/V across layers (or skips the cache) would read K/V this
        cache does not hold (docs/design.md, "Caches that follow the model")."""
        cache = self.cache
        assert cache is not None
        device = next(self.model.parameters()).device
        zeros = torch.zeros(cache.rows, 1, dtype=torch.int64, device=device)  # [B, 1]
        cache.calls = [0] * len(cache)
        try:
            with torch.no_grad():
                self.forward(FedBlock(zeros, zeros, zeros.bool()), 1)
            calls = cache.calls
        except torch.OutOfMemoryError:
            self.cache = None
            raise
        except (RuntimeError, IndexError, TypeError, AttributeError) as err:
            # A forward that manages its cache its own way (copies of cache layers for looped layers,
            # a cache object of its own) breaks on this one before it can be counted.
            self.cache = None
            first_line = (str(err).strip().splitlines() or [""])[0]
            raise ValueError(
                f"{type(self.model).__name__}: its forward fails on hsd_fast's slot cache "
                f"({type(err).__name__}: {first_line}): models whose layers do not each write one "
                "cache layer once per forward are not supported"
            ) from err
        finally:
            cache.calls = None
        if self.fused and any(
            k.shape[-1] != v.shape[-1] for k, v in zip(cache.keys, cache.values, strict=True)
        ):
            self.fused = False  # keys and values of different head dims (MLA): the dense path
        if calls != [1] * len(cache):
            self.cache = None
            raise ValueError(
                f"{type(self.model).__name__}: its forward called Cache.update {calls} times per layer "
                f"index (expected once for each of its {len(cache)} layers): models that share K/V "
                "across layers or keep other state are not supported"
            )

    def forward(
        self,
        block: FedBlock,
        num_outputs: int,
        *,
        model: torch.nn.Module | None = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Feed ``block`` and return the logits ``[B, O, V]`` of its last ``num_outputs`` columns.
        ``model`` and ``inputs_embeds`` ``[B, L, H]``: run that view of this runner's model (its
        layers from some k on, ``exit_reuse.FromHidden``) from those hidden states instead."""
        cache = self.cache
        assert cache is not None, "prepare() first"
        written = block.positions if block.slots is None else block.slots  # [B, L]
        cache.slots = torch.where(block.valid, written, cache.scratch)  # [B, L] write slots
        if self.fused:  # the kernel's metadata [B, 1, L, F] instead of a mask (hsd_fast.attention)
            last_seen = torch.where(block.valid, block.positions, -1)  # [B, L]
            mask = attention_meta(last_seen, block.tree_start, block.tree_sees)[:, None]
        else:
            masks = {t: self._mask(block, cache.slot_ids, w) for t, w in self.windows.items()}  # [B, 1, L, S]
            mask = masks if len(masks) > 1 else next(iter(masks.values()))
        if inputs_embeds is not None:
            inputs = {"inputs_embeds": inputs_embeds}
        else:
            ids = embeddable_ids(self.model, block.input_ids) if self.stand_in else block.input_ids
            inputs = {"input_ids": ids}
        out = (model or self.forward_model)(
            **inputs,
            attention_mask=mask,
            position_ids=block.positions,
            use_cache=True,
            **{self.cache_keyword: cache},
            **({"logits_to_keep": self._logits_to_keep(num_outputs, block)} if self.keeps_logits else {}),
        )
        logits = out.logits  # [B, O, V_model] (all L columns for a model that keeps every logit)
        return fit_logits(logits[:, logits.shape[1] - num_outputs :], self.vocab_size)  # [B, O, V]

    @staticmethod
    def _logits_to_keep(num_outputs: int, block: FedBlock) -> int | torch.Tensor:
        """HF's ``logits_to_keep``: the last ``num_outputs`` columns; none (an empty index, since 0
        means all to HF) for a step that only caches its block (a prompt's chunk, an exit caught up),
        which then runs no LM head."""
        if num_outputs > 0:
            return num_outputs
        return torch.zeros(0, dtype=torch.int64, device=block.positions.device)

    def move(self, tree_start: torch.Tensor, nodes: torch.Tensor, lengths: torch.Tensor) -> None:
        """A verified tree's path to the slots of its positions (``Runner.move``): one gather and
        one scatter per layer; entries past a row's length move a slot onto itself."""
        assert self.cache is not None, "prepare() first"
        depth = torch.arange(nodes.shape[1], device=nodes.device)  # [K]
        targets = tree_start[:, None] + depth  # [B, K]
        sources = torch.where(depth < lengths[:, None], tree_start[:, None] + nodes, targets)
        self.cache.move(torch.arange(len(tree_start), device=nodes.device), sources, targets)

    def _mask(self, block: FedBlock, slot_ids: torch.Tensor, window: int | None) -> torch.Tensor:
        """The additive mask ``[B, 1, L, S]`` of one attention window (None: full): a real token at
        position q sees the slots k <= q (k > q - window too, for a sliding window); padding sees the
        scratch slot only. A tree block's own slots are seen as its ``tree_sees`` says."""
        query = block.positions[..., None]  # [B, L, 1]
        sees = slot_ids <= query  # [B, L, S]
        if window is not None:
            sees = sees & (slot_ids > query - window)
        if block.tree_sees is not None:  # a tree's slots are seen as tree_sees says, not by position
            size = block.tree_sees.shape[-1]  # n
            offset = slot_ids - block.tree_start[:, None]  # [B, S]
            in_tree = (offset >= 0) & (offset < size)  # [B, S]
            index = offset.clamp(0, size - 1)[:, None, :].expand(*block.tree_sees.shape[:2], -1)  # [B, L, S]
            sees = torch.where(in_tree[:, None, :], block.tree_sees.gather(2, index), sees)
        scratch = slot_ids.shape[0] - 1
        sees = torch.where(block.valid[..., None], sees, slot_ids == scratch)
        mask = torch.zeros(sees.shape, dtype=self.dtype, device=sees.device)
        return mask.masked_fill(~sees, torch.finfo(self.dtype).min)[:, None]


@contextlib.contextmanager
def models_held(models: Iterable[torch.nn.Module]) -> Iterator[None]:
    """Hold the lock of every model in ``models`` (each once, however often it is named) while the
    block runs: the runners of a model (its caches) serve one call at a time. Locks are taken in one
    global order, by ``id``, so two calls that share models in different orders cannot deadlock."""
    distinct = sorted({id(m): m for m in models}.items())
    with _LOCKS_GUARD:
        locks = [_LOCKS.setdefault(m, _ModelLock()) for _, m in distinct]
    with contextlib.ExitStack() as stack:
        for lock in locks:
            stack.enter_context(lock)
        yield


def level_runners(models: Sequence[torch.nn.Module], vocab_size: int) -> list[HFRunner]:
    """One runner per level for ``models`` (bottom up), under ``models_held``: a model named at two
    levels gets a runner (a cache) per level. Sharing one would let the levels overwrite each
    other's K/V (a token tree's verified path is moved twice in one cache)."""
    seen: dict[int, int] = {}
    runners = []
    for model in models:
        copy = seen[id(model)] = seen.get(id(model), -1) + 1
        runners.append(HFRunner.of(model, vocab_size, copy))
    return runners
