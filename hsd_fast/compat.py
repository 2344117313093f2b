"""What hsd_fast accepts from Hugging Face: architectures, attention, vocabularies, devices.

Every check raises ``ValueError`` naming the model and what to change; ``hsd_fast.request`` runs them
once per request, before anything is allocated. Which architectures run is a
rule, not a list (``architectures.py``; docs/design.md, "Architectures by rule"): the runner's masks
apply sliding windows by position and its cache keeps plain K/V, so linear-attention, state-space and
other models whose state cannot be rolled back are refused, not approximated.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hsd_fast.architectures import model_refusal

SUPPORTED_ATTENTION = ("sdpa", "eager")
VOCAB_PADDING_TOLERANCE = 0.01
"""Vocabulary sizes may differ by embedding padding: at most this fraction of the smaller one."""


def _name(model: torch.nn.Module, role: str) -> str:
    return f"{role} ({type(model).__name__})"


def check_model(model: torch.nn.Module, role: str) -> None:
    """Refuse a model hsd_fast cannot run exactly (``ValueError`` naming the role, the class and why)."""
    config = model.config
    name = _name(model, role)
    reason = model_refusal(model)
    if reason is not None:
        raise ValueError(f"{name}: architecture not supported: {reason}")
    attn = getattr(config, "_attn_implementation", None)
    if attn not in SUPPORTED_ATTENTION:
        raise ValueError(
            f"{name}: attention implementation {attn!r} not supported; load the model with "
            f"attn_implementation= one of {SUPPORTED_ATTENTION}"
        )


def hierarchy_vocab_size(target: torch.nn.Module, drafts: Sequence[torch.nn.Module]) -> int:
    """The vocabulary every level samples over: the target's logit size, whole (docs/design.md,
    "Vocabularies"). Drafts must share the target's tokenizer: equal logit sizes, or sizes that differ
    only by embedding padding (within VOCAB_PADDING_TOLERANCE, identical special-token ids inside the
    smaller size). A draft's logits are then padded with -inf (q = 0 beyond its vocabulary) or cut
    to the target's size (``fit_logits``), and an id it cannot embed is fed to it as a stand-in
    (``embeddable_ids``): the target's distribution is never touched."""
    sizes = [m.get_output_embeddings().weight.shape[0] for m in (target, *drafts)]
    smallest = min(sizes)
    if max(sizes) == smallest:
        return smallest
    special = ("bos_token_id", "eos_token_id", "pad_token_id")
    ids = [tuple(_as_tuple(getattr(m.config, s, None)) for s in special) for m in (target, *drafts)]
    padded = max(sizes) - smallest <= VOCAB_PADDING_TOLERANCE * smallest
    same_special = all(i == ids[0] for i in ids)
    inside = all(t < smallest for group in ids[0] for t in group)
    if not (padded and same_special and inside):
        raise ValueError(
            f"target and drafts have different vocabularies (logit sizes {sizes}, special-token ids "
            f"{ids}); model levels must share one tokenizer: equal sizes, or sizes differing only by "
            f"embedding padding (<= {VOCAB_PADDING_TOLERANCE:.0%}) with identical special tokens. The "
            "first draft may have a tokenizer of its own: pass draft_tokenizers=[its tokenizer, None, "
            "...] with target_tokenizer= (hsd_fast.wrap: tokenizer=); HF's tokenizer= and "
            "assistant_tokenizer= do not reach hsd_fast.generate"
        )
    return sizes[0]


def fit_logits(logits: torch.Tensor, vocab: int) -> torch.Tensor:
    """[..., V_model] -> [..., vocab]: extra logits cut (a draft's beyond the target's vocabulary),
    missing ones -inf (a draft that cannot emit the target's extra ids: q = 0 there)."""
    size = logits.shape[-1]
    if size >= vocab:
        return logits[..., :vocab]
    return torch.nn.functional.pad(logits, (0, vocab - size), value=float("-inf"))


def stand_in_id(model: torch.nn.Module) -> int:
    """The id fed to ``model`` in place of one it cannot embed: its pad id, else its first EOS id,
    else 0 (any fixed id in its vocabulary keeps the hierarchy exact; a draft fed it only accepts
    less often)."""
    size = model.get_input_embeddings().weight.shape[0]
    for name in ("pad_token_id", "eos_token_id"):
        ids = _as_tuple(getattr(model.config, name, None))
        if ids and 0 <= ids[0] < size:
            return ids[0]
    return 0


def embeddable_ids(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """``ids`` with every id that ``model`` cannot embed (its input vocabulary is smaller than the
    target's) replaced by ``stand_in_id(model)``; ``ids`` itself when all fit."""
    size = model.get_input_embeddings().weight.shape[0]
    return torch.where(ids < size, ids, stand_in_id(model))


def _as_tuple(value: int | list[int] | None) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(value) if isinstance(value, (list, tuple)) else (int(value),)


def check_devices(target: torch.nn.Module, drafts: Sequence[torch.nn.Module], ids: torch.Tensor) -> None:
    """Every model on the prompt's device, or a ``ValueError`` listing where each one is."""
    devices = [next(m.parameters()).device for m in (target, *drafts)]
    if any(d != ids.device for d in devices):
        raise ValueError(
            f"all models and input_ids must be on one device; got models on {[str(d) for d in devices]}"
            f" and input_ids on {ids.device}"
        )
