"""Verifying from an early exit's hidden states: the level above an exit of its own model (the target
over ``EarlyExit(target, k)``, or a deeper exit over a shallower one) runs only its layers ``>= k``,
starting from the hidden states the exit computed, instead of recomputing layers ``< k``
(LayerSkip's reuse, in a hierarchy; docs/design.md, "Early-exit levels").

Terms. The *lower* level is the exit ``EarlyExit(t, k)``; the *upper* level is ``t`` or
``EarlyExit(t, k2)`` with ``k2 > k``: its first ``k`` layers are the lower level's. The exit's
runner calls a copy of it whose final norm is a ``HiddenTap`` (``early_exit.with_hidden_tap``): it
keeps layer ``k``'s output in the runner's cache (``SlotCache.hidden``, by slot, written and moved
exactly as its K/V are), so the ledger's cached length of the exit says where
they are valid. The *top view* is the upper model cut to its layers ``>= k``
(``early_exit.layer_view``): fed those hidden states as ``inputs_embeds``, it gives the upper
level's logits and writes its K/V for layers ``>= k``.

Before the upper level verifies a block, the engine catches the exit up: it feeds the exit the
block's positions past the exit's cached length (usually one token per row: the exit's last draft,
drawn but never fed). The upper level's layers ``< k`` then never run after its prefill; their K/V
is not kept, so reuse holds for a whole run with a fixed hierarchy (an adaptive run recomputes).

Whether a pair can reuse is decided once per pair by a probe (``refusal``): the top view, fed the
exit's hidden states, must give the upper model's own logits. A model whose forward transforms
``inputs_embeds`` (GPT-2 adds learned positions, Gemma 2 scales them) fails it and recomputes.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from hsd_fast.early_exit import (
    exit_of,
    final_norm_name,
    layer_view,
    num_layers,
    reuses_hidden,
    with_hidden_tap,
)

# upper model -> {k: what the probe decided (None: reuse holds)}; upper model -> {k: its top view}
_REFUSALS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_TOP_VIEWS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

PROBE_LENGTH = 8
"""Tokens of the probe that decides whether a pair can reuse."""


def shared_depth(lower: torch.nn.Module, upper: torch.nn.Module) -> int | None:
    """``k`` when ``lower`` is ``EarlyExit(t, k)`` and ``upper`` is ``t`` or a deeper exit of ``t``
    (their first ``k`` layers are the same modules), else None."""
    origin = exit_of(lower)
    if origin is None:
        return None
    target, k = origin
    if upper is target:
        return k
    above = exit_of(upper)
    return k if above is not None and above[0] is target and above[1] > k else None


def top_view(upper: torch.nn.Module, k: int) -> torch.nn.Module:
    """``upper`` from layer ``k`` on (kept per model and ``k``, so its compiled steps are reused).
    For an upper level that is an exit itself, ``upper`` is its runner's tapped copy, so that the
    top view keeps the hidden states the level above it reads."""
    views = _TOP_VIEWS.setdefault(upper, {})
    if k not in views:
        views[k] = layer_view(upper, k, num_layers(upper))
    return views[k]


def refusal(lower: torch.nn.Module, upper: torch.nn.Module) -> str | None:
    """Why ``upper`` cannot verify from ``lower``'s hidden states (None: it can), decided once per
    pair: ``lower`` must be an exit sharing ``upper``'s first layers, made with ``reuse=True``, with a
    final norm to take them from, and on a probe the top view fed ``lower``'s hidden states must
    give ``upper``'s own logits."""
    k = shared_depth(lower, upper)
    if k is None:
        return "the level below is not an early exit of this model"
    if not reuses_hidden(lower):
        return "the exit was made with reuse=False"
    if final_norm_name(lower) is None:
        return f"{type(lower).__name__} has no final norm under a known name to take hidden states from"
    known = _REFUSALS.setdefault(upper, {})
    if k not in known:
        known[k] = _probe(lower, upper, k)
    return known[k]


class _Recorder:
    """A ``HiddenTap`` sink outside a run: keeps the last hidden states."""

    hidden: torch.Tensor | None = None

    def keep_hidden(self, hidden_states: torch.Tensor) -> None:
        self.hidden = hidden_states


def _probe(lower: torch.nn.Module, upper: torch.nn.Module, k: int) -> str | None:
    param = next(upper.parameters())
    vocab = upper.get_input_embeddings().weight.shape[0]
    ids = (torch.arange(PROBE_LENGTH, device=param.device)[None] * 7919 + 11) % vocab  # [1, P]
    recorder = _Recorder()
    try:
        with torch.no_grad():
            expected = upper(input_ids=ids, use_cache=False).logits.float()
            with_hidden_tap(lower, recorder)(input_ids=ids, use_cache=False)
            top = layer_view(upper, k, num_layers(upper))
            got = top(inputs_embeds=recorder.hidden, use_cache=False).logits.float()
    except Exception as err:  # a forward that does not take inputs_embeds this way: recompute
        first_line = (str(err).strip().splitlines() or [""])[0]
        return f"its layers >= {k} cannot start from hidden states ({type(err).__name__}: {first_line})"
    tolerance = 1e-4 if param.dtype == torch.float32 else 3e-2
    error = (got - expected).abs().max().item() / max(1.0, expected.abs().max().item())
    if not error <= tolerance:
        return (
            f"its forward transforms inputs_embeds (layers >= {k} from the exit's hidden states differ from "
            f"the full model by {error:.1e} relative)"
        )
    return None


class FromHidden:
    """The runner the upper level verifies with when the level below is its exit: ``forward`` feeds
    the top view the exit's hidden states at the block's slots; everything else is the upper
    runner's (its cache, masks and logits). The block's positions must be in the exit's cache: the
    engine catches the exit up before each step (``Runner.reuse_of``'s contract)."""

    def __init__(self, upper: Any, lower: Any, k: int) -> None:
        self.upper, self.lower = upper, lower
        self.top = top_view(upper.forward_model, k)
        self.model = upper.model  # what compile fingerprints and memory checks read
        self.vocab_size, self.dtype = upper.vocab_size, upper.dtype

    def prepare(self, num_rows: int, capacity: int, tree_slots: int = 0) -> None:
        self.upper.prepare(num_rows, capacity, tree_slots)

    def forward(self, block, num_outputs: int) -> torch.Tensor:
        hidden = self.lower.cache.hidden  # [B, 1, S, H]
        assert hidden is not None, "the exit runner keeps no hidden states (prepare it first)"
        slots = block.positions if block.slots is None else block.slots  # [B, L]
        rows = torch.arange(slots.shape[0], device=slots.device)[:, None]  # [B, 1]
        embeds = hidden[rows, 0, slots]  # [B, L, H]: padding columns read slot 0, and see only scratch
        return self.upper.forward(block, num_outputs, model=self.top, inputs_embeds=embeds)

    def move(self, tree_start: torch.Tensor, nodes: torch.Tensor, lengths: torch.Tensor) -> None:
        self.upper.move(tree_start, nodes, lengths)
