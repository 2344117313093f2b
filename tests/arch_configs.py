"""One tiny random configuration per causal-LM family of the installed transformers, for the
conformance suite (tests/test_architectures.py): 2 layers, hidden 64, 4 heads over 2 K/V heads where
the family has grouped-query attention, vocabulary 100, fp32, and a sliding window of 4 positions
(shorter than every test sequence, so a window that is not applied changes the output) with one full
and one sliding layer where the family has both kinds.

The registry of families comes from transformers (``architectures.families``); the shapes are set by
field name where a config has the field, so a new family usually needs nothing here. ``OVERRIDES``
holds what a family's own validation or shape rules need besides."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import inspect
from typing import Any

import torch

from hsd_fast.architectures import FULL, SLIDING

VOCAB = 100
WINDOW = 4
PAD, BOS, EOS = 0, 1, 2
MAX_PARAMETERS = 3_000_000

SHAPE = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 128,
    "ffn_dim": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 256,
    "tie_word_embeddings": False,
    "pad_token_id": PAD,
    "bos_token_id": BOS,
    "eos_token_id": EOS,
    # encoder families used as decoders (BERT, RoBERTa, ...): causal self-attention
    "is_decoder": True,
    # mixtures of experts
    "num_experts": 4,
    "num_local_experts": 4,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "n_shared_experts": 1,
    "n_group": 1,
    "topk_group": 1,
    # multi-head latent attention (DeepSeek V2/V3): K and V head dims differ
    "kv_lora_rank": 16,
    "q_lora_rank": 16,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8,
    "v_head_dim": 16,
    # per-layer input embeddings (Gemma 3n, Gemma 4)
    "vocab_size_per_layer_input": VOCAB,
    "hidden_size_per_layer_input": 8,
    # sliding windows: Qwen2/Qwen3-style flags slide the layers from max_window_layers on
    "sliding_window": WINDOW,
    "use_sliding_window": True,
    "max_window_layers": 1,
}

OVERRIDES: dict[str, dict[str, Any]] = {
    # its config leaves the rotary parameters of its one layer type empty; 5.17 reads an mrope section
    # sized for its default head dim
    "cohere_compass_text": {
        "rope_parameters": {FULL: {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 2, 4]}}
    },
    # their default rotary_dim (64) is wider than the tiny heads (16), which fails in 5.24's forward:
    # a partial rotation, as in their checkpoints
    "codegen": {"rotary_dim": 8},
    "gptj": {"rotary_dim": 8},
    # looped (recurrent-depth) layers: one layer before the looped one, as its checkpoints have a
    # few (the runner refuses it at its first forward)
    "dory": {"n_input_layers": 1, "n_recurrent_layers": 1, "n_output_layers": 0},
    "dbrx": {
        "d_model": 64,
        "n_heads": 4,
        "n_layers": 2,
        "max_seq_len": 256,
        "attn_config": {"kv_n_heads": 2, "rope_theta": 10000.0, "clip_qkv": 8.0},
        "ffn_config": {"ffn_hidden_size": 128, "moe_num_experts": 4, "moe_top_k": 2},
    },
    # K/V shared across layers, as its checkpoints do (the runner refuses it at the first forward)
    "gemma3n_text": {
        "num_hidden_layers": 4,
        "layer_types": [SLIDING, FULL, SLIDING, FULL],
        "num_kv_shared_layers": 2,
        "laurel_rank": 8,
    },
    "longcat_flash": {
        "ffn_hidden_size": 128,
        "expert_ffn_hidden_size": 32,
        "zero_expert_num": 2,
        "moe_topk": 2,
        "q_lora_rank": 16,
        "head_dim": 8,
    },
    # convolution layers between the attention layers, as in its checkpoints
    "lfm2": {"layer_types": ["conv", FULL]},
    "lfm2_moe": {"layer_types": ["conv", FULL], "num_dense_layers": 1},
    "roc_bert": {
        "pronunciation_vocab_size": 100,
        "pronunciation_embed_dim": 16,
        "shape_vocab_size": 100,
        "shape_embed_dim": 16,
    },
    "xmod": {"default_language": "en_XX"},
    # its default config fails its own validation
    "gemma4_assistant": {"text_config": {"hidden_size_per_layer_input": 0, "vocab_size_per_layer_input": 0}},
    # Its generate keeps only the last `sliding_window` positions in its cache while its masks stay
    # full (its code never applies the window): with a window shorter than the sequence its own greedy
    # disagrees with its own forward. A window longer than the test sequences.
    "moshi": {"sliding_window": 256},
    # (transformers 5.25) its first dense block and its shared expert keep their checkpoint widths
    "ergo": {"first_dense_intermediate_size": 128, "shared_intermediate_size": 32},
}


def _fields(config_cls: type) -> set[str]:
    try:
        names = {f.name for f in dataclasses.fields(config_cls)}
    except TypeError:  # a config that is not a dataclass: its constructor's parameters
        names = set(inspect.signature(config_cls.__init__).parameters)
    return names | set(getattr(config_cls, "attribute_map", {}))


def tiny_config(model_type: str, **overrides: Any) -> Any:
    """The family's tiny configuration (a hybrid of one sliding and one full layer where the family
    has sliding layers and per-layer types); ``overrides`` replace fields."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    config_cls = CONFIG_MAPPING[model_type]
    fields = _fields(config_cls)
    kwargs = {k: v for k, v in SHAPE.items() if k in fields}
    if "kv_lora_rank" in fields:  # multi-head latent attention has as many K/V heads as query heads
        kwargs["num_key_value_heads"] = kwargs["num_attention_heads"]
    kwargs |= OVERRIDES.get(model_type, {}) | overrides
    config = config_cls(**kwargs)
    given = getattr(config, "layer_types", None) or []
    if "layer_types" in fields and set(given) == {SLIDING}:
        # Make it hybrid, so that the dict of masks by layer type is exercised (a family that fixes
        # its layer pattern keeps it).
        with contextlib.suppress(Exception):
            config = config_cls(**kwargs | {"layer_types": [SLIDING, FULL]})
    return config


def tiny_model(
    model_type: str, lm_head_scale: float = 6.0, seed: int = 0, attn: str | None = None, **overrides: Any
) -> torch.nn.Module:
    """The family's tiny model in fp32, with ``attn`` (default SDPA where the family has it, eager
    otherwise) and widened logit gaps (docs/design.md, "Tiny random models are near-uniform")."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    model_cls = getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type])
    attn = attn or ("sdpa" if model_cls._supports_sdpa else "eager")
    torch.manual_seed(seed)
    config = tiny_config(model_type, **overrides)
    with torch.device("meta"):  # sized before it is built: a default left large could fill the memory
        size = sum(p.numel() for p in model_cls._from_config(config, attn_implementation=attn).parameters())
    if size > MAX_PARAMETERS:
        raise ValueError(f"{model_type}: the tiny config has {size:,} parameters: add an override")
    model = model_cls._from_config(config, attn_implementation=attn, dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(lm_head_scale)
    return model


def family_drafts(target: torch.nn.Module, scales: tuple[float, float] = (0.2, 0.1)) -> list[torch.nn.Module]:
    """Two drafts of the target's family, smallest (least faithful) first: copies with Gaussian noise
    of relative size 0.2 and 0.1 on every weight matrix (enough for rejections in every family).
    Vectors and scalars (norms, biases, learned activation parameters) stay: noise on some of them
    (Apertus' xIELU) breaks the model."""
    drafts = []
    for scale, seed in zip(scales, (2, 3), strict=True):
        draft = copy.deepcopy(target)
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in draft.parameters():
                if p.dim() >= 2:
                    p.add_(scale * p.std() * torch.randn(p.shape, generator=gen))
        drafts.append(draft)
    return drafts
