"""Cost twins: a zoo model expanded to a larger shape without changing its function.

On a GPU, models this small are bound by kernel launches, so their cost ratios look nothing like a
real family's. ``cost_twin`` gives a model the cost of a larger one and the same logits:

- the hidden size is zero-padded: embeddings (and an untied head) get zero columns, so the residual
  stream's extra coordinates stay 0; every RMSNorm weight is scaled by sqrt(d/D) and the epsilon by
  d/D, which leaves ``x / rms(x)`` over the original coordinates unchanged;
- extra attention heads (same head dim, so RoPE and the softmax scale are unchanged), extra MLP
  width and extra layers get random *read* weights (q, k, v, gate, up) and zero *write* weights
  (o_proj, down_proj): they compute something and add nothing;
- all written coordinates of the original blocks are copied as they are.

Random read weights keep the matmuls dense; in bf16 the zero write blocks may still run a little
faster than a trained model of that shape, and a different summation order can flip rare argmax
ties, so compare outputs in fp32.
"""

from __future__ import annotations

import copy
import math

import torch
from transformers import LlamaForCausalLM

from hsd_fast.zoo.models import SIZES, empty_model, normal_like

_WRITES = ("o_proj", "down_proj")  # outputs land in the residual stream
_EMBEDDINGS = ("model.embed_tokens.weight", "lm_head.weight")  # zero-padded: extra coordinates stay 0


def cost_twin(
    model: LlamaForCausalLM,
    hidden_size: int | None = None,
    num_layers: int | None = None,
    intermediate_size: int | None = None,
    num_heads: int | None = None,
    *,
    shape: str | None = None,
    seed: int = 0,
) -> LlamaForCausalLM:
    """Expand ``model`` (a Llama) to ``hidden_size`` / ``num_layers`` / ``intermediate_size`` /
    ``num_heads`` (heads of the source's head dim; default ``hidden_size // head_dim``), or to the zoo
    shape named ``shape`` (its hidden size, layers and MLP width; heads derived the same way)."""
    src = model.config
    if type(model).__name__ != "LlamaForCausalLM":
        raise TypeError(f"cost_twin expands LlamaForCausalLM models, got {type(model).__name__}")
    if getattr(src, "attention_bias", False) or getattr(src, "mlp_bias", False):
        raise ValueError("cost_twin does not handle attention or MLP biases")
    if shape is not None:
        if shape not in SIZES:
            raise ValueError(f"unknown zoo shape {shape!r}; known: {sorted(SIZES)}")
        named = SIZES[shape]
        hidden_size = hidden_size or named.hidden_size
        num_layers = num_layers or named.num_layers
        intermediate_size = intermediate_size or named.intermediate_size
    head_dim = getattr(src, "head_dim", None) or src.hidden_size // src.num_attention_heads
    hidden_size = hidden_size or src.hidden_size
    num_layers = num_layers or src.num_hidden_layers
    intermediate_size = intermediate_size or src.intermediate_size
    num_heads = num_heads or max(src.num_attention_heads, hidden_size // head_dim)
    group = src.num_attention_heads // src.num_key_value_heads
    smaller = [
        (name, new, old)
        for name, new, old in [
            ("hidden_size", hidden_size, src.hidden_size),
            ("num_layers", num_layers, src.num_hidden_layers),
            ("intermediate_size", intermediate_size, src.intermediate_size),
            ("num_heads", num_heads, src.num_attention_heads),
        ]
        if new < old
    ]
    if smaller:
        raise ValueError(f"a cost twin can only grow: {smaller} (name, asked, source)")
    if num_heads % group:
        raise ValueError(f"num_heads={num_heads} must be a multiple of the source's GQA group {group}")

    config = copy.deepcopy(src)
    config.hidden_size, config.num_hidden_layers = hidden_size, num_layers
    config.intermediate_size, config.head_dim = intermediate_size, head_dim
    config.num_attention_heads, config.num_key_value_heads = num_heads, num_heads // group
    config.rms_norm_eps = src.rms_norm_eps * src.hidden_size / hidden_size
    dtype = model.get_input_embeddings().weight.dtype
    twin = empty_model(config).to(dtype)
    _fill(
        twin,
        model.state_dict(),
        math.sqrt(src.hidden_size / hidden_size),
        torch.Generator().manual_seed(seed),
    )
    twin.generation_config = copy.deepcopy(model.generation_config)
    return twin.eval()


@torch.no_grad()
def _fill(
    twin: LlamaForCausalLM, source: dict[str, torch.Tensor], norm_scale: float, generator: torch.Generator
) -> None:
    """Every weight of ``twin``: its block of the source's values where the source has it, and around
    it random reads, zero writes and embeddings, norm weights ``norm_scale``. Random values are drawn
    from ``generator`` (HF's normal(0, initializer_range)), never from torch's global generator."""
    std = twin.config.initializer_range
    for name, param in twin.named_parameters():
        if name.endswith("norm.weight"):
            param.fill_(norm_scale)
        elif name.endswith(tuple(f"{w}.weight" for w in _WRITES)) or name in _EMBEDDINGS:
            param.zero_()
        else:  # q, k, v, gate, up: the new heads, MLP columns and layers must compute something
            param.copy_(normal_like(param, std, generator))
        if name in source:
            old = source[name]
            block = tuple(slice(0, n) for n in old.shape)
            param[block] = old * norm_scale if name.endswith("norm.weight") else old
    twin.tie_weights()
