"""Train one zoo model: AdamW on random 256-token windows of the token corpus, with a log.

CPU or CUDA (bf16 autocast and ``torch.compile`` on CUDA). Windows are drawn uniformly over the
concatenated training streams, so every source is seen in proportion to its size. The log
(JSON lines) records tokens seen, learning rate and loss, and every ``eval_every`` steps the
validation loss per source on fixed held-out windows.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from hsd_fast.zoo.corpus import TokenCorpus
from hsd_fast.zoo.models import SIZES, new_model


@dataclass
class TrainConfig:
    size: str
    steps: int
    batch_size: int = 16
    seq_len: int = 256
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup: int = 50
    weight_decay: float = 0.1  # on matrices only
    betas: tuple[float, float] = (0.9, 0.95)  # AdamW's
    grad_clip: float = 1.0
    eval_every: int = 250
    eval_windows: int = 16  # held-out windows of seq_len tokens per source
    seed: int = 0
    grown_from: str | None = None  # the zoo model this one starts from (cost_twin), if any

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.seq_len


def precision(device: str) -> str:
    """What ``train`` computes in on ``device``: fp32, under bf16 autocast on CUDA."""
    return "bf16 autocast" if device.startswith("cuda") else "fp32"


def lr_at(config: TrainConfig, step: int) -> float:
    """Linear warm-up, then cosine down to ``min_lr_ratio * lr``."""
    if step < config.warmup:
        return config.lr * (step + 1) / config.warmup
    progress = (step - config.warmup) / max(1, config.steps - config.warmup)
    floor = config.min_lr_ratio
    return config.lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def held_out_windows(corpus: TokenCorpus, count: int, span: int) -> dict[str, torch.Tensor]:
    """Up to ``count`` evenly spaced windows of ``span`` tokens from each source's validation stream,
    first and last window flush with the stream's ends: [n, span] int64 each. Sources too short for
    one window are left out. Used for validation during training and for the committed calibration
    windows (``hsd_fast.zoo.build.calibration_windows``)."""
    windows = {}
    for source, stream in corpus.val.items():
        n = min(count, len(stream) // span)
        if n == 0:
            continue
        starts = np.linspace(0, len(stream) - span, n).astype(np.int64)
        windows[source] = torch.from_numpy(np.stack([stream[s : s + span] for s in starts]).astype(np.int64))
    return windows


def validation_windows(corpus: TokenCorpus, config: TrainConfig) -> dict[str, torch.Tensor]:
    """Fixed held-out windows per source: [eval_windows, seq_len + 1] each."""
    return held_out_windows(corpus, config.eval_windows, config.seq_len + 1)


def lm_loss(model: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of ``batch`` [B, L + 1]."""
    logits = model(input_ids=batch[:, :-1]).logits  # [B, L, V]
    return F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())


@torch.no_grad()
def validation_loss(model: torch.nn.Module, windows: dict[str, torch.Tensor], device) -> dict[str, float]:
    was_training = model.training
    model.eval()
    losses = {name: float(lm_loss(model, w.to(device))) for name, w in windows.items()}
    model.train(was_training)
    return losses


def train(
    corpus: TokenCorpus,
    config: TrainConfig,
    vocab_size: int,
    device: str = "cpu",
    log_path: Path | None = None,
    progress: bool = True,
    clock: Callable[[], float] = time.perf_counter,
    init: torch.nn.Module | None = None,
):
    """Train ``init`` (e.g. a smaller zoo model grown by ``cost_twin``), or a fresh model of
    ``config.size``; returns (model, log records)."""
    rng = np.random.default_rng(config.seed)
    if init is None:
        init = new_model(SIZES[config.size], vocab_size, seed=config.seed)
    model = init.float().to(device).train()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=config.lr,
        betas=config.betas,
        fused=device.startswith("cuda"),
    )
    on_cuda = device.startswith("cuda")
    step_model = torch.compile(model) if on_cuda else model
    stream = np.concatenate(list(corpus.train.values())).astype(np.int64)  # [N]
    windows = validation_windows(corpus, config)
    records: list[dict] = []
    log = log_path.open("w") if log_path is not None else None

    def emit(record: dict) -> None:
        records.append(record)
        if log is not None:
            log.write(json.dumps(record) + "\n")
            log.flush()

    emit({"config": asdict(config), "vocab_size": vocab_size, "device": device})
    start, smoothed = clock(), None
    bar = tqdm(range(config.steps), desc=f"train {config.size}", disable=not progress)
    for step in bar:
        for group in optimizer.param_groups:
            group["lr"] = lr_at(config, step)
        starts = rng.integers(0, len(stream) - config.seq_len - 1, config.batch_size)
        batch = torch.from_numpy(np.stack([stream[s : s + config.seq_len + 1] for s in starts])).to(device)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=on_cuda):
            loss = lm_loss(step_model, batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()
        value = float(loss.detach())  # one sync per step: the log wants the number
        smoothed = value if smoothed is None else 0.95 * smoothed + 0.05 * value
        bar.set_postfix(loss=f"{smoothed:.3f}")
        record = {"step": step + 1, "tokens": (step + 1) * config.tokens_per_step, "loss": round(value, 4)}
        last = step + 1 == config.steps
        if (step + 1) % config.eval_every == 0 or last:
            record["val"] = {k: round(v, 4) for k, v in validation_loss(model, windows, device).items()}
            record["seconds"] = round(clock() - start, 1)
        emit(record)
    if log is not None:
        log.close()
    return model.eval(), records
