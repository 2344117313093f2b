"""The fused tree-attention kernel as a transformers attention implementation (docs/design.md,
"Tree attention").

On the fused path the HF runner passes, in place of the dense ``[B, 1, L, S]`` additive mask, the
compact metadata of ``triton_kernels/tree_attention_torch.py`` as a 4D int64 tensor
``[B, 1, L, META_FIXED + W]``. transformers uses any 4D ``attention_mask`` as it is (it builds no
mask of its own then), every model routes it untouched to its attention function, and the function
registered here under ``IMPLEMENTATION`` runs the kernel when the mask is such metadata and SDPA,
with the SDPA mask builder, for every other call: a model switched to it behaves as before
everywhere else (the user's own ``model.generate``, say).

Which models qualify (``refusal`` says why one does not): attention through transformers'
``AttentionInterface`` (the modeling code looks it up), SDPA as the model's implementation (the one
this path stands in for), full attention in every layer (sliding windows keep the dense path, which
applies them by position), no attention-logit soft-capping and no attention sinks, one head dim for
keys and values. Nothing here imports Triton: the kernel module is imported at the first fused call.
"""

from __future__ import annotations

import functools

import torch

from .architectures import module_source

IMPLEMENTATION = "hsd_fast"
"""The name registered with transformers' AttentionInterface and AttentionMaskInterface."""


@torch.library.custom_op("hsd_fast::tree_attention", mutates_args=())
def tree_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, meta: torch.Tensor, scale: float
) -> torch.Tensor:
    """``tree_attention_triton`` as an opaque torch op: a compiled step calls it as it is (inductor
    does not re-generate the kernel's code, and a CUDA graph captures its launches)."""
    from .triton_kernels.tree_attention import tree_attention_triton

    return tree_attention_triton(query, key, value, meta, scale)


@tree_attention.register_fake
def _(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, meta: torch.Tensor, scale: float
) -> torch.Tensor:
    batch, heads, width, dim = query.shape
    return query.new_empty(batch, width, heads, dim)  # [B, L, H_q, D]


@functools.cache
def register() -> str:
    """Register ``IMPLEMENTATION`` with transformers (once per process); returns the name."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    from transformers.modeling_utils import AttentionInterface

    def forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        # query [B, H_q, L, D]; key, value: the slot cache [B, H_kv, S, D] as Cache.update returned it
        if attention_mask is None or attention_mask.dtype != torch.int64:  # not the runner's metadata
            return sdpa_attention_forward(
                module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
            )
        scale = query.shape[-1] ** -0.5 if scaling is None else scaling  # SDPA's default
        return tree_attention(query, key, value, attention_mask[:, 0], scale), None  # [B, L, H_q, D]

    AttentionInterface.register(IMPLEMENTATION, forward)
    AttentionMaskInterface.register(IMPLEMENTATION, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    return IMPLEMENTATION


def refusal(model: torch.nn.Module, windows: dict) -> str | None:
    """Why ``model`` keeps the dense-mask path (None: it can take the fused kernel). ``windows``: the
    runner's attention window per layer type."""
    config = model.config
    if getattr(config, "_attn_implementation", None) not in ("sdpa", IMPLEMENTATION):
        return f"its attention implementation is {config._attn_implementation!r}, not 'sdpa'"
    if any(w is not None for w in windows.values()):
        return "it has sliding-window layers"
    if getattr(config, "attn_logit_softcapping", None) is not None:
        return "it soft-caps attention logits"
    source = module_source(type(model))
    if "ALL_ATTENTION_FUNCTIONS" not in source:
        return "its attention does not go through transformers' AttentionInterface"
    if "sinks" in source or "s_aux" in source:
        return "it has attention sinks"
    weight = next(model.parameters(), None)
    if weight is not None and not weight.is_cuda and weight.dtype == torch.bfloat16:
        # design §15.12: the interpreter's bf16 tl.dot is off by orders of magnitude (garbage tokens)
        return "off CUDA the kernel runs in Triton's interpreter, whose bf16 dot products are wrong"
    return None


def use_fused(model: torch.nn.Module) -> None:
    """Switch ``model`` to ``IMPLEMENTATION`` (registered first). Calls that carry no metadata still
    run SDPA, so the switch is safe to leave in place."""
    model.config._attn_implementation = register()
