"""Measuring benchmark configurations: prompts as left-padded batches, every configuration run on
them in interleaved passes (``timing``), and one result row per configuration (tokens/s, tokens per
target forward, greedy output equal to the target's, the engine's host time per step).

Shared by the bench command (``command``) and the bench scripts' driver (``results.measure_script``).
"""

from __future__ import annotations

import torch

from hsd_fast.bench.configs import Config
from hsd_fast.bench.scenarios import Scenario
from hsd_fast.bench.timing import CpuMeter, interleaved


def batches(prompts: list[torch.Tensor], batch: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The prompts as left-padded batches of ``batch`` rows (repeated to fill one batch if fewer)."""
    rows = [prompts[i % len(prompts)] for i in range(max(len(prompts), batch))]
    rows = rows[: len(rows) - len(rows) % batch]
    out = []
    for start in range(0, len(rows), batch):
        group = rows[start : start + batch]
        width = max(len(p) for p in group)
        ids = torch.stack([torch.cat([torch.zeros(width - len(p), dtype=p.dtype), p]) for p in group])
        mask = torch.stack([torch.arange(width) >= width - len(p) for p in group]).long()
        out.append((ids, mask))
    return out


def run_all(config: Config, work) -> list:
    return [config.generate(ids, mask) for ids, mask in work]


class _ForwardCounter:
    """Counts the target's forward calls (HF's own methods report no statistics)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.calls = 0
        self.handle = model.register_forward_hook(self)

    def __call__(self, *args) -> None:
        self.calls += 1


def measure(
    configs: list[Config], work, args, meter: CpuMeter, sampling: dict, scenario: Scenario, on_pass
) -> tuple[list[dict], int, int]:
    """Time ``configs`` on ``work`` (``batches``) in interleaved passes (``timing.interleaved``) and
    return a table row per configuration, the passes redone for contention and those redone for
    compiling. ``args``: ``passes`` and ``max_new_tokens``; ``on_pass()`` after each counted pass.
    The first configuration is the reference: with greedy sampling every row says whether its
    outputs equal the first's, and ``x_hf`` is tokens/s over HF ``generate``'s (family "hf")."""
    outputs: dict[int, list] = {}

    def runner(i: int, config: Config):
        def go():
            outputs[i] = run_all(config, work)

        return go

    timings = interleaved(
        [runner(i, c) for i, c in enumerate(configs)], args.passes, meter, on_pass=lambda p: on_pass()
    )
    new_tokens = sum(ids.shape[0] for ids, _ in work) * args.max_new_tokens
    batch = work[0][0].shape[0]
    reference = [seq for seq, _ in outputs[0]]  # HF generate: the target's own output
    rows = []
    for i, config in enumerate(configs):
        seconds = sorted(timings.seconds[i])[len(timings.seconds[i]) // 2]
        row = {"config": config.name, "family": config.family, "tok_s": new_tokens / seconds}
        row |= {"chain": list(config.chain), "T": list(config.T), "seconds": timings.seconds[i]}
        if not sampling.get("do_sample"):
            row["same_output"] = all(
                torch.equal(a, s) for a, (s, _) in zip(reference, outputs[i], strict=True)
            )
        row["tokens_per_target_forward"] = _tokens_per_target_forward(
            config, outputs[i], work, args, scenario
        )
        if config.family == "ours":  # the engine's own time per step, outside the step functions
            stats = [st for _, st in outputs[i]]
            steps = sum(sum(st.forwards) for st in stats)
            row["host_us_per_step"] = 1e6 * sum(st.host_time for st in stats) / steps
        if batch in config.predicted:
            row["predicted_tok_s"] = batch / config.predicted[batch]
        rows.append(row)
    hf = next(r["tok_s"] for r in rows if r["family"] == "hf")
    ours_alone = next((r["tok_s"] for r in rows if r["config"] == "ours, no draft"), None)
    for row in rows:
        row["x_hf"] = row["tok_s"] / hf
        if ours_alone:
            row["x_ours_no_draft"] = row["tok_s"] / ours_alone
    return rows, timings.redone, timings.recompiled


def _tokens_per_target_forward(config, outputs, work, args, scenario) -> float | None:
    if config.family == "ours":
        committed = sum(int(stats.row_forwards[-1]) for _, stats in outputs)
        return sum(ids.shape[0] for ids, _ in work) * args.max_new_tokens / max(committed, 1)
    if config.family in ("hf", "hf compiled"):
        return 1.0
    if work[0][0].shape[0] != 1:
        return None
    counter = _ForwardCounter(scenario.target)  # one more run, counted (batch 1: a call is a row)
    try:
        run_all(config, work)
    finally:
        counter.handle.remove()
    return len(work) * args.max_new_tokens / max(counter.calls - len(work), 1)  # prefills excluded
