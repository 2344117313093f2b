"""Profiling what the latency model needs (DESIGN.md §3): forward costs and pairwise acceptance.

- ``forward_costs``: seconds of one forward over n fed tokens at the working context length, through
  the engine's own runner (slot cache, 4D mask), medians after warm-up, fitted as ``c(n) = a + b n``.
  The clock is injectable (tests use a fake one); on CUDA every timing is synchronised.
- ``acceptance``: alpha(j, m) = E_h[sum_x min(p_j(x|h), p_m(x|h))], teacher-forced on calibration
  token ids, after the sampling transform; greedy: how often the argmaxes agree. Symmetric: each
  unordered pair is measured once.
- ``select_hierarchy``: both, then ``selector.select``; optionally measured with the engine.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers.generation.logits_process import TemperatureLogitsWarper

from hsd_fast.engine import Feed
from hsd_fast.hf_runner import HFRunner
from hsd_fast.latency import AffineCost
from hsd_fast.processors import LogitsTransform
from hsd_fast.selector import Hierarchy, select


@dataclass(frozen=True)
class CostProfile:
    spans: tuple[int, ...]
    seconds: tuple[float, ...]  # median seconds of one forward over each span
    fit: AffineCost  # least-squares c(n) = fixed + per_token * n

    def __call__(self, n: int) -> float:
        return self.fit(n)


def forward_costs(
    model: torch.nn.Module,
    spans: Sequence[int] = (1, 2, 4, 8, 16),
    context: int = 128,
    repeats: int = 5,
    warmup: int = 2,
    clock: Callable[[], float] = time.perf_counter,
) -> CostProfile:
    """Time one forward of ``model`` over n new tokens after ``context`` cached ones, for each n."""
    runner = HFRunner(model, LogitsTransform(), model.get_output_embeddings().weight.shape[0])
    runner.prepare(1, context + max(spans) + 1)
    device = next(model.parameters()).device
    ids = torch.randint(3, runner.vocab_size, (context + max(spans),), device=device)
    runner.forward(_feed(ids, 0, context))  # prefill the context once
    medians = []
    for n in spans:
        times = []
        for i in range(warmup + repeats):
            _sync(device)
            start = clock()
            runner.forward(_feed(ids, context, context + n))  # rewrites the same slots each time
            _sync(device)
            elapsed = clock() - start
            if i >= warmup:
                times.append(elapsed)
        medians.append(statistics.median(times))
    per_token, fixed = (
        np.polyfit(np.asarray(spans, float), np.asarray(medians), 1) if len(spans) > 1 else (0, 0)
    )
    fit = AffineCost(float(fixed), float(per_token)) if len(spans) > 1 else AffineCost(medians[0])
    return CostProfile(tuple(spans), tuple(medians), fit)


def _feed(ids: torch.Tensor, start: int, end: int) -> Feed:
    one = np.array([1], dtype=np.int64)
    return Feed(np.array([0]), one * start, one * end, one * (end - 1), ids[start:end])


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def acceptance(
    models: Sequence[torch.nn.Module],
    calibration_ids: torch.Tensor,  # [N, L] token ids, teacher-forced
    processors: Sequence = (),
    greedy: bool = False,
    progress: bool = True,
) -> list[list[float]]:
    """The symmetric matrix alpha[j][m] over ``models`` (all sharing one vocabulary), after the HF
    logits ``processors`` (the sampling transform: temperature, top-k, ...)."""
    transform = LogitsTransform(processors)
    vocab = min(m.get_output_embeddings().weight.shape[0] for m in models)
    dists = []
    for model in tqdm(models, desc="teacher-forced forwards", disable=not progress):
        logits = model(calibration_ids.to(next(model.parameters()).device)).logits[..., :vocab]
        flat = transform(logits.reshape(-1, vocab)).float() / transform.temperature  # [N * L, V]
        dists.append(flat.argmax(-1) if greedy else torch.softmax(flat, -1))
    alpha = [[1.0] * len(models) for _ in models]
    for j, m in itertools.combinations(range(len(models)), 2):
        a, b = dists[j], dists[m].to(dists[j].device)
        value = (a == b).float().mean() if greedy else torch.minimum(a, b).sum(-1).mean()
        alpha[j][m] = alpha[m][j] = float(value)
    return alpha


def select_hierarchy(
    target: torch.nn.Module,
    candidates: Sequence[torch.nn.Module],
    prompts: torch.Tensor,  # [N, L] calibration token ids (no padding)
    measure: bool = False,
    do_sample: bool = False,
    temperature: float = 1.0,
    max_T: int = 8,
    max_new_tokens: int = 64,
) -> Hierarchy:
    """Profile ``candidates`` and ``target``, pick the latency-optimal hierarchy, and with
    ``measure=True`` run it with the engine and record the measured seconds per token."""
    models = [*candidates, target]
    costs = [forward_costs(m, context=prompts.shape[1]) for m in tqdm(models, desc="forward costs")]
    processors = [TemperatureLogitsWarper(temperature)] if do_sample and temperature != 1.0 else []
    alpha = acceptance(models, prompts, processors, greedy=not do_sample)
    pick = select(costs, alpha, max_T=max_T)
    pick = replace(pick, drafts=tuple(models[i] for i in pick.chain[:-1]))
    if measure:
        from hsd_fast.hf_generate import generate

        kwargs = {"do_sample": do_sample, "max_new_tokens": max_new_tokens, "eos_token_id": None}
        if do_sample:
            kwargs["temperature"] = temperature
        start = time.perf_counter()
        out = target.generate(prompts[:1], custom_generate=generate, hierarchy=pick, **kwargs)
        _sync(prompts.device)
        pick = replace(
            pick, measured_latency=(time.perf_counter() - start) / (out.shape[1] - prompts.shape[1])
        )
    return pick
