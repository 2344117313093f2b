"""What the early-exit test files share: a six-layer target, prompts, a greedy HSD call, a counter of
the tokens through a layer and through an exit level's forwards, and step costs of a given shape."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from unittest import mock

import torch
from hf_models import tiny_model

import hsd_fast
from hsd_fast.hf_runner import HFRunner

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


@contextlib.contextmanager
def counted(layer: torch.nn.Module, exit_level: torch.nn.Module) -> Iterator[dict[str, int]]:
    """Counts the block columns fed through ``layer`` and through the runner forwards of
    ``exit_level``, while active."""
    counts = {"layer": 0, "exit": 0}
    forward = HFRunner.forward

    def count_exit(runner, block, *args, **kwargs):
        if runner.model is exit_level:
            counts["exit"] += block.input_ids.numel()
        return forward(runner, block, *args, **kwargs)

    def count_layer(module, args, kwargs) -> None:
        states = next(v for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor))
        counts["layer"] += states.shape[0] * states.shape[1]  # [B, L, H]

    handle = layer.register_forward_pre_hook(count_layer, with_kwargs=True)
    try:
        with mock.patch.object(HFRunner, "forward", count_exit):
            yield counts
    finally:
        handle.remove()


def affine_cost(fixed: float, per_token: float):
    """A ``CostProfile`` whose steps cost ``fixed + per_token * n`` (a draft of k: k such one-token
    steps)."""
    from hsd_fast.profile.costs import CostProfile

    sizes = (1, 2, 4, 8)
    seconds = tuple(fixed + per_token * n for n in sizes)
    return CostProfile(sizes, seconds, sizes, tuple(k * (fixed + per_token) for k in sizes))
