"""Cost twins: a zoo model expanded to a larger shape without changing its function.

On a GPU, models this small are bound by kernel launches, so their cost ratios look nothing like a
real family's. ``cost_twin`` gives a model the cost of a larger one and the same logits:

- the hidden size is zero-padded: embeddings (and an untied head) get zero columns, so the residual
  stream's extra coordinates stay 0; every RMSNorm weight is scaled by sqrt(d/D) and the epsilon by
  d/D, which leaves ``x / rms(x)`` over the original coordinates unchanged;
- attention heads may grow (head dim ``d`` -> ``D``, a multiple) and be regrouped (more query heads
  per KV head, more KV heads). Source KV head ``h`` becomes twin KV head ``h``, and source query head
  ``r`` of its group becomes query head ``r`` of twin group ``h``. Inside a head, source coordinate
  ``i`` of each rotary half goes to ``i * D/d`` of the same half: RoPE rotates the pair
  ``(j, j + D/2)`` by ``theta^(-2j/D)``, which at ``j = i * D/d`` is the source's ``theta^(-2i/d)``,
  so the placed q and k rotate exactly as before. The placed query rows get every other coordinate 0
  (so k's random extra coordinates add nothing to a score) and are scaled by sqrt(D/d), which undoes
  the smaller softmax scale 1/sqrt(D);
- extra attention heads, extra MLP width and extra layers get random *read* weights (q, k, v, gate,
  up) and zero *write* weights (o_proj, down_proj): they compute something and add nothing;
- all written coordinates of the original blocks are copied as they are.

Random read weights keep the matmuls dense; in bf16 the zero write blocks may still run a little
faster than a trained model of that shape, and a different summation order can flip rare argmax
ties, so compare outputs in fp32. ``FAMILY_SHAPES`` names real models' shapes (Llama 3); with
``device="cuda"`` a twin is built and filled on the GPU (no host copy of its weights).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
from transformers import LlamaForCausalLM

from hsd_fast.zoo.models import SIZES, empty_model, normal_like

_WRITES = ("o_proj", "down_proj")  # outputs land in the residual stream
_EMBEDDINGS = ("model.embed_tokens.weight", "lm_head.weight")  # zero-padded: extra coordinates stay 0


@dataclass(frozen=True)
class TwinShape:
    """A transformer body's shape: what a cost twin grows to."""

    hidden_size: int
    num_layers: int
    intermediate_size: int
    num_heads: int
    head_dim: int
    num_kv_heads: int


FAMILY_SHAPES = {
    "llama-3-8b": TwinShape(4096, 32, 14336, 32, 128, 8),
    "llama-3.2-1b": TwinShape(2048, 16, 8192, 32, 64, 8),
}
"""Real models' body shapes (their configs on the hub). The zoo's 8,192-entry vocabulary stays: a
twin's embedding and head are far smaller than these models' 128,256 entries (docs/design.md,
"Cost twins")."""


def cost_twin(
    model: LlamaForCausalLM,
    hidden_size: int | None = None,
    num_layers: int | None = None,
    intermediate_size: int | None = None,
    num_heads: int | None = None,
    *,
    head_dim: int | None = None,
    num_kv_heads: int | None = None,
    shape: str | None = None,
    seed: int = 0,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
) -> LlamaForCausalLM:
    """Expand ``model`` (a Llama) to ``hidden_size`` / ``num_layers`` / ``intermediate_size`` /
    ``num_heads`` query heads of ``head_dim`` (default: the source's) over ``num_kv_heads`` KV heads
    (default: the source's GQA group kept), or to the shape named ``shape``: a zoo size (its hidden
    size, layers and MLP width; heads of the source's dim filling the hidden size) or one of
    ``FAMILY_SHAPES``. Built on ``device`` (default: the source's) in ``dtype`` (default: the source's).
    """
    src = model.config
    if type(model).__name__ != "LlamaForCausalLM":
        raise TypeError(f"cost_twin expands LlamaForCausalLM models, got {type(model).__name__}")
    if getattr(src, "attention_bias", False) or getattr(src, "mlp_bias", False):
        raise ValueError("cost_twin does not handle attention or MLP biases")
    if shape is not None:
        if shape in FAMILY_SHAPES:
            named = FAMILY_SHAPES[shape]
            num_heads, head_dim = num_heads or named.num_heads, head_dim or named.head_dim
            num_kv_heads = num_kv_heads or named.num_kv_heads
        elif shape in SIZES:
            named = SIZES[shape]
        else:
            raise ValueError(f"unknown shape {shape!r}; known: {sorted(SIZES)} and {sorted(FAMILY_SHAPES)}")
        hidden_size = hidden_size or named.hidden_size
        num_layers = num_layers or named.num_layers
        intermediate_size = intermediate_size or named.intermediate_size
    src_head_dim = getattr(src, "head_dim", None) or src.hidden_size // src.num_attention_heads
    head_dim = head_dim or src_head_dim
    hidden_size = hidden_size or src.hidden_size
    num_layers = num_layers or src.num_hidden_layers
    intermediate_size = intermediate_size or src.intermediate_size
    num_heads = num_heads or max(src.num_attention_heads, hidden_size // head_dim)
    group = src.num_attention_heads // src.num_key_value_heads
    if num_kv_heads is None:
        if num_heads % group:
            raise ValueError(f"num_heads={num_heads} must be a multiple of the source's GQA group {group}")
        num_kv_heads = num_heads // group
    smaller = [
        (name, new, old)
        for name, new, old in [
            ("hidden_size", hidden_size, src.hidden_size),
            ("num_layers", num_layers, src.num_hidden_layers),
            ("intermediate_size", intermediate_size, src.intermediate_size),
            ("num_heads", num_heads, src.num_attention_heads),
            ("head_dim", head_dim, src_head_dim),
            ("num_kv_heads", num_kv_heads, src.num_key_value_heads),
        ]
        if new < old
    ]
    if smaller:
        raise ValueError(f"a cost twin can only grow: {smaller} (name, asked, source)")
    if num_heads % num_kv_heads or num_heads // num_kv_heads < group:
        raise ValueError(
            f"{num_heads} query heads over {num_kv_heads} KV heads: need a whole group of at least the "
            f"source's {group} query heads per KV head"
        )
    if head_dim % src_head_dim or src_head_dim % 2:
        raise ValueError(f"head_dim={head_dim} must be a multiple of the source's (even) {src_head_dim}")
    if getattr(src, "partial_rotary_factor", 1.0) != 1.0:
        raise ValueError("cost_twin maps RoPE over the whole head: a partial rotary factor is not handled")

    config = copy.deepcopy(src)
    config.hidden_size, config.num_hidden_layers = hidden_size, num_layers
    config.intermediate_size, config.head_dim = intermediate_size, head_dim
    config.num_attention_heads, config.num_key_value_heads = num_heads, num_kv_heads
    config.rms_norm_eps = src.rms_norm_eps * src.hidden_size / hidden_size
    source_weight = model.get_input_embeddings().weight
    device = torch.device(device) if device is not None else source_weight.device
    twin = empty_model(config, dtype or source_weight.dtype, device)
    generator = torch.Generator(device).manual_seed(seed)
    norm_scale = math.sqrt(src.hidden_size / hidden_size)
    _fill(twin, model.state_dict(), _HeadMap(src, config), norm_scale, generator)
    twin.generation_config = copy.deepcopy(model.generation_config)
    return twin.eval()


class _HeadMap:
    """Where the source's attention rows land in the twin's projections (module doc): ``q_rows``
    (source query row -> twin query row), ``kv_rows`` (the same for k and v); ``q_scale`` undoes the
    twin's softmax scale for its larger head dim."""

    def __init__(self, src, twin) -> None:
        d, D = _head_dims(src, twin)
        group, twin_group = _group(src), _group(twin)
        in_head = rotary_positions(d, D)
        placed = [h * twin_group + r for h in range(src.num_key_value_heads) for r in range(group)]
        self.q_heads = q_heads = torch.tensor(placed)
        self.q_rows = (q_heads[:, None] * D + in_head).reshape(-1)
        self.kv_rows = (torch.arange(src.num_key_value_heads)[:, None] * D + in_head).reshape(-1)
        self.head_dim = D
        self.q_scale = math.sqrt(D / d)


def rotary_positions(d: int, D: int) -> torch.Tensor:
    """[d] where a source head's coordinates go in a twin head of dim ``D``: coordinate ``i`` of each
    rotary half to ``i * D/d`` of the same half, where RoPE turns it at the source's frequency."""
    coordinate = torch.arange(d)
    half = coordinate >= d // 2  # the second rotary half: rotated with the first, D/2 further on
    return (coordinate - half * (d // 2)) * (D // d) + half * (D // 2)


def _head_dims(src, twin) -> tuple[int, int]:
    """The source's and the twin's head dims."""

    def dim(config) -> int:
        return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads

    return dim(src), dim(twin)


def _group(config) -> int:
    return config.num_attention_heads // config.num_key_value_heads


@torch.no_grad()
def _fill(
    twin: LlamaForCausalLM,
    source: dict[str, torch.Tensor],
    heads: _HeadMap,
    norm_scale: float,
    generator: torch.Generator,
) -> None:
    """Every weight of ``twin``: its block of the source's values where the source has it, and around
    it random reads, zero writes and embeddings, norm weights ``norm_scale``. Attention projections
    place the source's heads by ``heads``. Random values are drawn from ``generator`` (HF's
    normal(0, initializer_range)), never from torch's global generator."""
    std = twin.config.initializer_range
    for name, param in twin.named_parameters():
        if name.endswith("norm.weight"):
            param.fill_(norm_scale)
        elif name.endswith(tuple(f"{w}.weight" for w in _WRITES)) or name in _EMBEDDINGS:
            param.zero_()
        else:  # q, k, v, gate, up: the new heads, MLP columns and layers must compute something
            param.copy_(_normal(param, std, generator))
        if name not in source:
            continue
        old = source[name].to(param.device, param.dtype)
        columns = slice(0, old.shape[-1]) if old.dim() == 2 else None
        if name.endswith("q_proj.weight"):
            for h in heads.q_heads.tolist():  # a placed head's other rows would add to its scores
                param[h * heads.head_dim : (h + 1) * heads.head_dim] = 0
            param[heads.q_rows, columns] = old * heads.q_scale
        elif name.endswith(("k_proj.weight", "v_proj.weight")):
            param[heads.kv_rows, columns] = old
        elif name.endswith("o_proj.weight"):
            param[: old.shape[0], heads.q_rows] = old
        else:
            block = tuple(slice(0, n) for n in old.shape)
            param[block] = old * norm_scale if name.endswith("norm.weight") else old
    twin.tie_weights()


def _normal(param: torch.Tensor, std: float, generator: torch.Generator) -> torch.Tensor:
    """normal(0, std) values for ``param``: on the CPU through ``normal_like`` (the same values for a
    seed whatever the dtype); on a GPU drawn there, in ``param``'s dtype (no host copy)."""
    if param.device.type == "cpu":
        return normal_like(param, std, generator)
    return torch.empty_like(param).normal_(0.0, std, generator=generator)
