"""The exact distribution of short continuations under a tiny HF model, by enumeration, and HSD's
samples of the same continuations: what the sampled tests compare (a chi-square test)."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import torch

import hsd_fast
from hsd_fast.stats import HSDStats


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


def processed_distribution(
    target: torch.nn.Module,
    prompt: torch.Tensor,  # [P]
    process: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    vocab: int,
    steps: int,
) -> dict[tuple[int, ...], float]:
    """P(continuation) of every continuation of ``steps`` tokens with ``process(input_ids, scores)``
    (a logits processor) applied at each position to the prompt and the continuation before it, on
    float32 logits as HF's ``generate`` hands them, the softmax in float64."""
    conts = torch.tensor(list(itertools.product(range(vocab), repeat=steps)))  # [V**steps, steps]
    seqs = torch.cat([prompt.expand(len(conts), -1), conts], 1)
    with torch.no_grad():
        logits = target(seqs).logits.float()
    rows, at, total = torch.arange(len(conts)), len(prompt) - 1, 0.0
    for k in range(steps):
        scores = process(seqs[:, : at + k + 1], logits[:, at + k].clone())
        total = total + torch.log_softmax(scores.double(), -1)[rows, conts[:, k]]
    return {tuple(c.tolist()): float(p) for c, p in zip(conts, total.exp(), strict=True)}


def hsd_samples(
    target: torch.nn.Module, drafts: list[torch.nn.Module], prompt: torch.Tensor, samples: int, steps: int
) -> tuple[list[tuple[int, ...]], HSDStats]:
    """``samples`` continuations of ``steps`` tokens after ``prompt`` ([P]) drawn by HSD in one batch
    (T = 2 at every level, HF's default top-k off, seed 0, eager: a planted bug may not compile),
    and the run's statistics."""
    out = target.generate(
        prompt.expand(samples, -1), custom_generate=hsd_fast.generate, drafts=drafts, T=[2] * len(drafts),
        do_sample=True, top_k=None, max_new_tokens=steps, eos_token_id=None, seed=0, compile=False,
        output_hsd_stats=True,
    )  # fmt: skip
    return [tuple(row) for row in out.sequences[:, len(prompt) :].tolist()], out.hsd_stats
