"""What the early-exit test files share: a six-layer target, prompts, and a greedy HSD call."""

from __future__ import annotations

import torch
from hf_models import tiny_model

import hsd_fast

NEW = 24


def deep_model() -> torch.nn.Module:
    """A tiny Llama with six layers: room for exits at 1..5."""
    return tiny_model("llama", layers=6)


def prompts(model: torch.nn.Module, count: int = 3, seed: int = 3) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, model.config.vocab_size, (1, 8), generator=gen) for _ in range(count)]


def hsd(model: torch.nn.Module, ids: torch.Tensor, **kwargs):
    """``model.generate`` through hsd_fast: greedy, ``NEW`` tokens, eager, unless ``kwargs`` say."""
    kwargs = {"do_sample": False, "max_new_tokens": NEW, "compile": False, **kwargs}
    return model.generate(ids, custom_generate=hsd_fast.generate, **kwargs)
