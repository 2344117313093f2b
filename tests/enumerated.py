"""The exact distribution of short continuations under a tiny HF model, by enumeration: what the
sampled tests compare HSD's samples with (a chi-square test)."""

from __future__ import annotations

import itertools

import torch


def exact_distribution(
    target: torch.nn.Module,
    prompt: torch.Tensor,  # [P]
    vocab: int,
    steps: int,
    temperature: float = 1.0,
    top_k: int | None = None,
) -> dict[tuple[int, ...], float]:
    """P(continuation) of every continuation of ``steps`` tokens under the sampling transform (the
    logits divided by ``temperature``, then all but the ``top_k`` largest masked), in float64, from
    one full forward of the target over each whole sequence (its own masks: no cache, no 4D mask)."""
    conts = torch.tensor(list(itertools.product(range(vocab), repeat=steps)))  # [V**steps, steps]
    with torch.no_grad():
        logits = target(torch.cat([prompt.expand(len(conts), -1), conts], 1)).logits.double() / temperature
    if top_k is not None:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, -float("inf"))
    logp = torch.log_softmax(logits, -1)
    at = len(prompt) - 1
    total = sum(logp[torch.arange(len(conts)), at + k, conts[:, k]] for k in range(steps))
    return {tuple(c.tolist()): float(p) for c, p in zip(conts, total.exp(), strict=True)}
