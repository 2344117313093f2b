"""Train one zoo model: AdamW on random 256-token windows of the token corpus, with a log.

CPU or CUDA (bf16 autocast and ``torch.compile`` on CUDA). Windows are drawn uniformly over the
concatenated training streams, so every source is seen in proportion to its size. The log
(JSON lines) records tokens seen, learning rate and loss, and every ``eval_every`` steps the
validation loss per source on fixed held-out windows. With ``exit_weights`` the loss is LayerSkip's
early-exit loss (``exit_loss``) and the validation also records the loss at every exit.
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
    # Early-exit loss (LayerSkip-style): a weight per layer 1..L (summing to 1) for the cross-entropy of
    # that layer's output through the model's own final norm and head; None: the plain LM loss.
    exit_weights: tuple[float, ...] | None = None
    # The early exits' losses (every layer's but the last) taken on every exit_stride-th position only,
    # the first one rotating with the step: an unbiased estimate of their mean at 1/exit_stride of the
    # cost of their heads (each exit runs the whole 8192-entry head; with six of them a step costs 2.3x
    # a plain one, with stride 4 about 1.35x).
    exit_stride: int = 1

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.seq_len


def config_record(config: TrainConfig) -> dict:
    """``config`` as the log and the manifest record it: every field, but ``exit_weights`` and
    ``exit_stride`` only where set (so models trained before the options existed keep their records)."""
    record = asdict(config)
    if record["exit_weights"] is None:
        del record["exit_weights"]
    if record["exit_stride"] == 1:
        del record["exit_stride"]
    return record


def linear_exit_weights(num_layers: int, final: float) -> tuple[float, ...]:
    """Exit weights growing with depth: the last layer gets ``final``, layers l = 1..L-1 share the
    rest in proportion to l."""
    if not 0 < final <= 1:
        raise ValueError(f"the last layer's weight must be in (0, 1], got {final}")
    early = sum(range(1, num_layers))
    return (*(round((1 - final) * depth / early, 6) for depth in range(1, num_layers)), final)


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


def exit_logits(model: torch.nn.Module, ids: torch.Tensor, layers: list[int]) -> torch.Tensor:
    """[len(layers), B, T, V] the logits of ``ids`` [B, T] at the exit after each of ``layers``
    (1..L): that layer's output through the final norm and the head (at L: the model's own logits).
    HF's hidden states are the embeddings, then each layer's output, the last one after the norm."""
    hidden = model.model(input_ids=ids, output_hidden_states=True).hidden_states
    last = len(hidden) - 1
    normed = torch.stack([hidden[k] if k == last else model.model.norm(hidden[k]) for k in layers])
    return model.lm_head(normed)


def exit_losses(model: torch.nn.Module, batch: torch.Tensor, layers: list[int]) -> torch.Tensor:
    """[len(layers)] mean next-token cross-entropy of ``batch`` [B, T + 1] at the exit after each of
    ``layers`` (``exit_logits``)."""
    logits = exit_logits(model, batch[:, :-1], layers).float()  # [K, B, T, V]
    targets = batch[:, 1:].flatten().repeat(len(layers))
    losses = F.cross_entropy(logits.flatten(0, 2), targets, reduction="none")
    return losses.view(len(layers), -1).mean(-1)


def exit_loss(
    model: torch.nn.Module,
    batch: torch.Tensor,
    weights: tuple[float, ...],
    stride: int = 1,
    offset: int = 0,
) -> torch.Tensor:
    """The early-exit training loss: sum over layers l of ``weights[l - 1]`` times the cross-entropy
    at exit l (layers with weight 0 are not computed). With ``stride`` > 1 the exits before the last
    layer are scored at positions ``offset, offset + stride, ...`` of ``batch`` [B, T + 1] only."""
    num_layers = model.config.num_hidden_layers
    if len(weights) != num_layers:
        raise ValueError(f"{len(weights)} exit weights for {num_layers} layers")
    if stride == 1:
        layers = [depth for depth, w in enumerate(weights, start=1) if w]
        losses = exit_losses(model, batch, layers)
        return sum(weights[depth - 1] * loss for depth, loss in zip(layers, losses, strict=True))
    ids, targets = batch[:, :-1], batch[:, 1:]  # [B, T] each
    hidden = model.model(input_ids=ids, output_hidden_states=True).hidden_states
    loss = weights[-1] * F.cross_entropy(model.lm_head(hidden[-1]).float().flatten(0, 1), targets.flatten())
    used = [(depth, w) for depth, w in enumerate(weights[:-1], start=1) if w]
    if used:
        early = torch.stack([hidden[depth][:, offset::stride] for depth, _ in used])  # [E, B, T/stride, H]
        logits = model.lm_head(model.model.norm(early)).float()  # [E, B, T/stride, V]
        picked = targets[:, offset::stride].flatten().repeat(len(used))
        per_exit = F.cross_entropy(logits.flatten(0, 2), picked, reduction="none").view(len(used), -1)
        loss = loss + (per_exit.new_tensor([w for _, w in used]) * per_exit.mean(-1)).sum()
    return loss


@torch.no_grad()
def validation_loss(model: torch.nn.Module, windows: dict[str, torch.Tensor], device) -> dict[str, float]:
    was_training = model.training
    model.eval()
    losses = {name: float(lm_loss(model, w.to(device))) for name, w in windows.items()}
    model.train(was_training)
    return losses


@torch.no_grad()
def validation_exit_losses(
    model: torch.nn.Module, windows: dict[str, torch.Tensor], device
) -> dict[str, list[float]]:
    """Per source, the validation loss at every exit 1..L (the last: the model's own)."""
    was_training = model.training
    model.eval()
    layers = list(range(1, model.config.num_hidden_layers + 1))
    losses = {name: exit_losses(model, w.to(device), layers).tolist() for name, w in windows.items()}
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

    emit({"config": config_record(config), "vocab_size": vocab_size, "device": device})
    start, smoothed = clock(), None
    bar = tqdm(range(config.steps), desc=f"train {config.size}", disable=not progress)
    for step in bar:
        for group in optimizer.param_groups:
            group["lr"] = lr_at(config, step)
        starts = rng.integers(0, len(stream) - config.seq_len - 1, config.batch_size)
        batch = torch.from_numpy(np.stack([stream[s : s + config.seq_len + 1] for s in starts])).to(device)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=on_cuda):
            if config.exit_weights is None:
                loss = lm_loss(step_model, batch)
            else:
                offset = step % config.exit_stride
                loss = exit_loss(step_model, batch, config.exit_weights, config.exit_stride, offset)
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
            if config.exit_weights is not None:
                exits = validation_exit_losses(model, windows, device)
                record["val_exits"] = {k: [round(x, 4) for x in v] for k, v in exits.items()}
            record["seconds"] = round(clock() - start, 1)
        emit(record)
    if log is not None:
        log.close()
    return model.eval(), records
