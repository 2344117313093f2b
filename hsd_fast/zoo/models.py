"""Zoo model shapes, and their compact storage: int8 weights per output row with bf16 scales.

Every zoo model is a ``LlamaForCausalLM`` with tied embeddings over the zoo tokenizer's vocabulary.
On disk a model is ``config.json`` plus ``model.safetensors`` holding, for every matrix ``W``, the
int8 ``W.q8`` and the bf16 per-row ``W.scale`` (``W ~ q8 * scale``); vectors (norm weights) stay fp32.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig, LlamaForCausalLM


@dataclass(frozen=True)
class Shape:
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


SIZES: dict[str, Shape] = {
    "xxs": Shape(64, 2, 2, 192),
    "xs": Shape(128, 4, 4, 384),
    "sm": Shape(192, 5, 3, 576),
    "s": Shape(256, 6, 4, 768),
    "m": Shape(384, 8, 6, 1024),
    "l": Shape(512, 10, 8, 1536),
}

MAX_POSITIONS = 1024  # RoPE table size; the zoo trains on 256-token windows


def llama_config(shape: Shape, vocab_size: int, eos_id: int = 0) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_heads,
        head_dim=shape.head_dim,
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=True,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
        attn_implementation="sdpa",
    )


def empty_model(
    config: LlamaConfig, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> LlamaForCausalLM:
    """A ``LlamaForCausalLM`` in ``dtype`` on ``device`` with uninitialised weights. It is built on the
    meta device, so HF's own initialisation draws nothing from torch's global generator (the caller
    fills every weight) and no full-size copy is made anywhere else; RoPE's non-persistent inverse
    frequencies are then rebuilt for real, in fp32 as HF computes them."""
    with torch.device("meta"):
        model = LlamaForCausalLM(config).to(dtype)
    model.to_empty(device=device)
    model.tie_weights()
    with torch.device(device):
        model.model.rotary_emb = type(model.model.rotary_emb)(config=config)
    return model


def normal_like(param: torch.Tensor, std: float, generator: torch.Generator) -> torch.Tensor:
    """normal(0, std) values in fp32 on the CPU (so a seed gives the same values whatever the
    parameter's dtype or device), cast to ``param``'s."""
    values = torch.empty(param.shape, dtype=torch.float32).normal_(0.0, std, generator=generator)
    return values.to(dtype=param.dtype, device=param.device)


@torch.no_grad()
def init_weights(model: LlamaForCausalLM, generator: torch.Generator) -> None:
    """HF's initialisation of a Llama, drawn from ``generator``: every matrix (embeddings and linear
    layers) normal(0, ``initializer_range``) with the padding token's embedding row zeroed, every
    RMSNorm weight 1. Tied weights are drawn once."""
    config = model.config
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            param.fill_(1.0)
        elif param.dim() == 2:
            param.copy_(normal_like(param, config.initializer_range, generator))
        else:  # zoo models have no biases: anything else would keep to_empty's garbage
            raise ValueError(f"init_weights does not know how to initialise {name} {tuple(param.shape)}")
    if config.pad_token_id is not None:
        model.get_input_embeddings().weight[config.pad_token_id].zero_()


def new_model(shape: Shape, vocab_size: int, seed: int = 0) -> LlamaForCausalLM:
    """A freshly initialised zoo model of ``shape``. The weights depend on ``seed`` only, and torch's
    global random state is left as it was."""
    model = empty_model(llama_config(shape, vocab_size))
    init_weights(model, torch.Generator().manual_seed(seed))
    return model


def num_params(model: torch.nn.Module) -> int:
    """Parameters counted once (tied embeddings are one matrix)."""
    return sum(p.numel() for p in model.parameters())


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per output row; the bf16 scale is rounded before quantising, so dequantising
    with it reproduces exactly what was rounded."""
    weight = weight.detach().float()
    scale = (weight.abs().amax(dim=1, keepdim=True) / 127).clamp_min(1e-12).bfloat16()  # [R, 1]
    q = torch.round(weight / scale.float()).clamp(-127, 127).to(torch.int8)  # [R, C]
    return q, scale


def save_int8(model: LlamaForCausalLM, directory: Path, metadata: dict | None = None) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and model.config.tie_word_embeddings:
            continue
        if tensor.dim() == 2:
            tensors[f"{name}.q8"], tensors[f"{name}.scale"] = quantize_int8(tensor)
        else:
            tensors[name] = tensor.detach().float().contiguous()
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "int8-rows"})
    config = model.config.to_dict()
    (directory / "config.json").write_text(json.dumps(config, indent=1, sort_keys=True) + "\n")
    if metadata is not None:
        (directory / "card.json").write_text(json.dumps(metadata, indent=1) + "\n")


def load_int8(
    directory: Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> LlamaForCausalLM:
    if not (directory / "model.safetensors").is_file():
        raise FileNotFoundError(f"no zoo model under {directory}")
    config = LlamaConfig.from_dict(json.loads((directory / "config.json").read_text()))
    config._attn_implementation = "sdpa"
    stored = load_file(str(directory / "model.safetensors"))
    state = {}
    for name, tensor in stored.items():
        if name.endswith(".q8"):
            base = name[: -len(".q8")]
            state[base] = tensor.float() * stored[f"{base}.scale"].float()
        elif not name.endswith(".scale"):
            state[name] = tensor
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model.load_state_dict(state, strict=False, assign=True)
    model.tie_weights()
    missing = [n for n, p in model.named_parameters() if p.is_meta]
    if missing:
        raise ValueError(f"{directory}: weights missing from model.safetensors: {missing}")
    # RoPE's inv_freq is a non-persistent buffer: rebuild it off the meta device.
    model.model.rotary_emb = type(model.model.rotary_emb)(config=config)
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = config.pad_token_id
    return model.to(device=device, dtype=dtype).eval()
