"""Tiny randomly initialised HF models for the tests, and drafts derived from them.

docs/design.md, "Tiny random models are near-uniform": random tiny models have near-uniform logits and
independent random drafts almost never agree with a random target. So logits are widened (``lm_head``
scaled) and drafts are derived from the target: noisy copies and layer-dropped copies, which accept
often but not always."""

from __future__ import annotations

import copy

import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    GPTNeoXConfig,
    GPTNeoXForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

ARCHS = {
    "llama": (LlamaConfig, LlamaForCausalLM),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    "gpt2": (GPT2Config, GPT2LMHeadModel),
    "gpt_neox": (GPTNeoXConfig, GPTNeoXForCausalLM),
}


def tiny_model(
    arch: str = "llama",
    *,
    vocab_size: int = 96,
    layers: int = 4,
    attn: str = "sdpa",
    lm_head_scale: float = 6.0,
    seed: int = 0,
    max_positions: int = 256,
    **overrides,
) -> torch.nn.Module:
    config_cls, model_cls = ARCHS[arch]
    shape = {
        "llama": {"intermediate_size": 128, "num_key_value_heads": 2},
        "qwen2": {"intermediate_size": 128, "num_key_value_heads": 2},
        "gpt2": {},
        "gpt_neox": {"intermediate_size": 128},
    }[arch]
    config = config_cls(
        vocab_size=vocab_size,
        hidden_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        max_position_embeddings=max_positions,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        attn_implementation=attn,
        **(shape | overrides),
    )
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(lm_head_scale)
        # A quiet last layer: a copy without it (layer_dropped_copy) still agrees often.
        for name, p in _layers(model)[-1].named_parameters():
            if name.endswith(_OUTPUT_PROJECTIONS):
                p.mul_(0.2)
    return model


# The projections that write a layer's output into the residual stream, per architecture.
_OUTPUT_PROJECTIONS = (
    "o_proj.weight",
    "down_proj.weight",
    "c_proj.weight",
    "dense.weight",
    "dense_4h_to_h.weight",
)


def _layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    base = getattr(model, model.base_model_prefix)
    return getattr(base, "layers", None) or base.h


def peaked_family(vocab_size: int) -> list[torch.nn.Module]:
    """Two drafts (noisy copies) and a peaked target over a tiny vocabulary, smallest first: the
    sampled exactness tests' models."""
    target = tiny_model("llama", vocab_size=vocab_size, lm_head_scale=4.0)
    return [noisy_copy(target, 0.4, seed=1), noisy_copy(target, 0.2, seed=2), target]


def noisy_copy(model: torch.nn.Module, scale: float, seed: int) -> torch.nn.Module:
    """The model with Gaussian noise of relative size ``scale`` on every weight."""
    draft = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(scale * p.std() * torch.randn(p.shape, generator=gen))
    return draft


def layer_dropped_copy(model: torch.nn.Module, keep: int) -> torch.nn.Module:
    """The model's first ``keep`` decoder layers with its embeddings, final norm and head."""
    draft = copy.deepcopy(model)
    base = getattr(draft, draft.base_model_prefix)
    if hasattr(base, "layers"):
        base.layers = base.layers[:keep]
    else:
        base.h = base.h[:keep]
    draft.config.num_hidden_layers = keep
    return draft


def derived_drafts(target: torch.nn.Module, count: int) -> list[torch.nn.Module]:
    """``count`` drafts, smallest (least faithful) first: a layer-dropped copy, then noisy copies
    with less and less noise."""
    pool = [
        layer_dropped_copy(noisy_copy(target, 0.05, seed=1), keep=3),
        noisy_copy(target, 0.1, seed=2),
        noisy_copy(target, 0.05, seed=3),
    ]
    return pool[len(pool) - count :] if count else []


def left_padded(prompts: list[list[int]], pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask)`` of ``prompts`` left padded with ``pad`` to the longest."""
    width = max(map(len, prompts))
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


def padded_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Two rows of 9 columns, the first left padded by 3 (pad id 0): ``(input_ids, attention_mask)``."""
    ids = torch.tensor([[0, 0, 0, 5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16, 17, 18, 19]])
    return ids, (torch.arange(9)[None] >= torch.tensor([[3], [0]])).long()


def level_configs(drafts: list[torch.nn.Module]) -> dict[str, dict]:
    """The hierarchies the processor tests run over two drafts (smallest first): a chain of both,
    the lookup level under the larger, and a token tree."""
    import hsd_fast

    return {
        "two drafts": {"drafts": drafts, "T": [2, 2]},
        "lookup": {"drafts": ["lookup", drafts[1]], "T": [3, 2]},
        "tree": {"drafts": drafts, "T": [3, 2], "tree": hsd_fast.Tree.spine(3, 2)},
    }
