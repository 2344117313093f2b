"""Profiling what the latency model needs (DESIGN.md §3): forward costs and pairwise acceptance.

- ``forward_costs``: seconds of one forward over n fed tokens at the working context length, through
  the engine's own runner (slot cache, 4D mask), medians after warm-up, fitted as ``c(n) = a + b n``.
  The clock is injectable (tests use a fake one); on CUDA every timing is synchronised.
- ``acceptance``: alpha(j, m) = E_h[sum_x min(p_j(x|h), p_m(x|h))], teacher-forced on calibration
  token ids, after the sampling transform; greedy: how often the argmaxes agree. Symmetric: each
  unordered pair is measured once.
- ``ProfileCache``: both, stored in JSON keyed by model identity (a weight hash), device, dtype,
  context, sampling settings and calibration ids.
- ``select_hierarchy``: both, then ``selector.select``; optionally measured with the engine
  (``measured_latency``: seconds per token, prefill excluded).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers.generation.logits_process import (
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

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
    return CostProfile(tuple(spans), tuple(medians), _fit(spans, medians))


def _fit(spans: Sequence[int], seconds: Sequence[float]) -> AffineCost:
    """Least-squares c(n) = fixed + per_token * n (a constant with a single span)."""
    if len(spans) == 1:
        return AffineCost(seconds[0])
    per_token, fixed = np.polyfit(np.asarray(spans, float), np.asarray(seconds), 1)
    return AffineCost(float(fixed), float(per_token))


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


SAMPLING_KWARGS = ("do_sample", "temperature", "top_k", "top_p")


def sampling_transform(
    do_sample: bool = False, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None
) -> tuple[list, str]:
    """HF processors for the sampling settings (empty for greedy) and a key naming them."""
    if not do_sample:
        return [], "greedy"
    processors = []
    if temperature != 1.0:
        processors.append(TemperatureLogitsWarper(temperature))
    if top_k is not None:
        processors.append(TopKLogitsWarper(top_k))
    if top_p is not None and top_p < 1.0:
        processors.append(TopPLogitsWarper(top_p))
    return processors, f"sample temperature={temperature} top_k={top_k} top_p={top_p}"


def model_identity(model: torch.nn.Module) -> str:
    """A short hash of the weights as loaded (class, parameter names, shapes, dtype and a strided
    sample of every parameter): the same checkpoint gives the same key on every machine."""
    digest = hashlib.sha256(type(model).__name__.encode())
    for name, p in sorted(model.named_parameters()):
        flat = p.detach().flatten()
        sample = flat[:: max(1, flat.numel() // 4096)].float().cpu().numpy()
        digest.update(f"{name}{tuple(p.shape)}{p.dtype}".encode())
        digest.update(sample.tobytes())
    return digest.hexdigest()[:16]


def ids_hash(ids: torch.Tensor) -> str:
    return hashlib.sha256(ids.to(torch.int64).cpu().numpy().tobytes()).hexdigest()[:16]


class ProfileCache:
    """Measured forward costs and acceptance rates in a JSON file. A cost is keyed by model
    identity, device, dtype and context length; an acceptance rate by the unordered pair of
    identities, the sampling settings and the hash of the calibration ids. ``fallbacks`` are read
    too (e.g. the zoo's committed CPU profile) but only ``path`` is written."""

    def __init__(self, path: Path | None = None, fallbacks: Sequence[Path] = ()) -> None:
        self.path, self.entries = path, {}
        for source in [*fallbacks, path]:
            if source is not None and Path(source).is_file():
                self.entries.update(json.loads(Path(source).read_text())["entries"])

    def save(self) -> None:
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text(json.dumps({"entries": self.entries}, indent=1, sort_keys=True) + "\n")

    def costs(self, model: torch.nn.Module, context: int, **kwargs) -> CostProfile:
        p = next(model.parameters())
        key = f"cost {model_identity(model)} {p.device.type} {str(p.dtype).removeprefix('torch.')} {context}"
        if key not in self.entries:
            profile = forward_costs(model, context=context, **kwargs)
            self.entries[key] = {"spans": list(profile.spans), "seconds": list(profile.seconds)}
        entry = self.entries[key]
        return CostProfile(
            tuple(entry["spans"]), tuple(entry["seconds"]), _fit(entry["spans"], entry["seconds"])
        )

    def acceptance(
        self, models: Sequence[torch.nn.Module], ids: torch.Tensor, processors, sampling: str, progress: bool
    ) -> list[list[float]]:
        names = [model_identity(m) for m in models]
        keys = {
            (j, m): f"alpha {' '.join(sorted((names[j], names[m])))} {sampling} {ids_hash(ids)}"
            for j, m in itertools.combinations(range(len(models)), 2)
        }
        if any(key not in self.entries for key in keys.values()):
            alpha = acceptance(models, ids, processors, greedy=sampling == "greedy", progress=progress)
            self.entries.update({key: alpha[j][m] for (j, m), key in keys.items()})
        alpha = [[1.0] * len(models) for _ in models]
        for (j, m), key in keys.items():
            alpha[j][m] = alpha[m][j] = self.entries[key]
        return alpha


def select_hierarchy(
    target: torch.nn.Module,
    candidates: Sequence[torch.nn.Module],
    prompts: torch.Tensor,  # [N, L] calibration token ids (no padding)
    measure: bool = False,
    *,
    context: int | None = None,
    cache: ProfileCache | None = None,
    max_T: int = 8,
    max_new_tokens: int = 64,
    progress: bool = True,
    **generation_kwargs,
) -> Hierarchy:
    """Profile ``candidates`` and ``target`` (costs at ``context`` cached tokens, default the prompt
    length; acceptance teacher-forced on ``prompts`` under the sampling settings in
    ``generation_kwargs``: do_sample, temperature, top_k, top_p), pick the latency-optimal hierarchy,
    and with ``measure=True`` time it with the engine on ``prompts[:1]``. Every returned
    ``Hierarchy`` (the pick and its runner-ups) carries its draft models."""
    unknown = set(generation_kwargs) - set(SAMPLING_KWARGS)
    if unknown:
        raise ValueError(f"select_hierarchy: unsupported {sorted(unknown)}; supported: {SAMPLING_KWARGS}")
    cache = cache if cache is not None else ProfileCache()
    models = [*candidates, target]
    context = context or prompts.shape[1]
    costs = [cache.costs(m, context) for m in tqdm(models, desc="forward costs", disable=not progress)]
    processors, sampling = sampling_transform(**generation_kwargs)
    alpha = cache.acceptance(models, prompts, processors, sampling, progress)
    cache.save()
    pick = with_models(select(costs, alpha, max_T=max_T), models)
    if measure:
        seconds = measured_latency(target, pick, prompts[:1], max_new_tokens, **generation_kwargs)
        pick = replace(pick, measured_latency=seconds)
    return pick


def with_models(hierarchy: Hierarchy, models: Sequence[torch.nn.Module]) -> Hierarchy:
    """``hierarchy`` and its runner-ups with their draft models filled in from the candidate list."""
    return replace(
        hierarchy,
        drafts=tuple(models[i] for i in hierarchy.chain[:-1]),
        runner_ups=tuple(with_models(h, models) for h in hierarchy.runner_ups),
    )


def measured_latency(
    target: torch.nn.Module,
    hierarchy: Hierarchy | None,
    prompts: torch.Tensor,  # [N, L]: each row is generated alone (batch 1)
    max_new_tokens: int = 64,
    clock: Callable[[], float] = time.perf_counter,
    **generation_kwargs,
) -> float:
    """Seconds per generated token with the engine (``hierarchy=None``: autoregressive, K = 0), the
    prefill excluded: (time for ``max_new_tokens`` - time for 1 token) / (``max_new_tokens`` - 1),
    summed over the prompt rows. EOS is ignored so every run has the same length."""
    from hsd_fast.hf_generate import generate

    levels = {"hierarchy": hierarchy} if hierarchy is not None else {"drafts": [], "T": []}
    kwargs = {"eos_token_id": None, "seed": 0, **generation_kwargs, **levels}
    if kwargs.get("do_sample") and kwargs.get("top_k") is None:
        kwargs["top_k"] = 0  # as sampling_transform: no top-k unless asked (HF's default would be 50)
    device = next(target.parameters()).device

    def timed(row: torch.Tensor, new_tokens: int) -> float:
        _sync(device)
        start = clock()
        target.generate(row, custom_generate=generate, max_new_tokens=new_tokens, **kwargs)
        _sync(device)
        return clock() - start

    timed(prompts[:1], 2)  # warm-up
    total = sum(timed(row[None], max_new_tokens) - timed(row[None], 1) for row in prompts)
    return total / (len(prompts) * (max_new_tokens - 1))
