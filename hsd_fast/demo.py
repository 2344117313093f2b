"""`hsd-fast demo`: HSD on table models, sampled continuations vs the exact target distribution."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from hsd_fast.engine import HSDResult, run_hsd
from hsd_fast.exactness import ChiSquare, pooled_chi_square
from hsd_fast.table_model import TableRunner, table_family


@dataclass
class TableCheck:
    samples: list[tuple[int, ...]]  # continuation of every row
    exact: dict[tuple[int, ...], float]
    chi_square: ChiSquare
    result: HSDResult


def table_check(
    *,
    block_sizes: Sequence[int],
    num_samples: int = 40_000,
    steps: int = 4,
    vocab_size: int = 4,
    order: int = 2,
    spread: float = 2.0,
    temperature: float = 1.0,
    eos_token_id: int | None = None,
    family_seed: int = 1,
    seed: int = 0,
    policy: str = "most_rows",
    _residual_as_q: bool = False,
) -> TableCheck:
    """Sample ``num_samples`` continuations of ``steps`` tokens, as rows of one batch, with a
    hierarchy of ``len(block_sizes) + 1`` table models; test them against the exact distribution."""
    family = table_family(vocab_size, order, len(block_sizes) + 1, spread=spread, seed=family_seed)
    prompt = torch.arange(order) % vocab_size
    result = run_hsd(
        [TableRunner(m) for m in family],
        [prompt] * num_samples,
        block_sizes=block_sizes,
        max_new_tokens=steps,
        eos_token_id=eos_token_id,
        seeds=seed,
        temperature=temperature,
        policy=policy,
        _residual_as_q=_residual_as_q,
    )
    samples = [tuple(s[order:].tolist()) for s in result.sequences]
    exact = family[-1].continuation_probs(prompt.tolist(), steps, temperature, eos_token_id)
    return TableCheck(samples, exact, pooled_chi_square(samples, exact), result)


def format_check(check: TableCheck, top: int = 8) -> str:
    n = len(check.samples)
    counts = Counter(check.samples)
    lines = [f"{'continuation':<16}{'empirical':>10}{'exact':>10}"]
    for cont, p in sorted(check.exact.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"{' '.join(map(str, cont)):<16}{counts[cont] / n:>10.4f}{p:>10.4f}")
    lines.append(f"... {len(check.exact) - top} more continuations")
    c = check.chi_square
    lines.append(
        f"chi-square {c.statistic:.1f} on {c.dof} dof ({c.cells} cells after pooling): p = {c.p_value:.3f}"
    )
    return "\n".join(lines)


def main(
    num_samples: int = 40_000, block_sizes: Sequence[int] = (2, 3), steps: int = 4, seed: int = 0
) -> int:
    k = len(block_sizes)
    print(f"HSD on table models: {k} draft level(s) + target, T = {list(block_sizes)}, vocabulary 4,")
    print(f"{num_samples} sampled {steps}-token continuations as rows of one batch.\n")
    check = table_check(block_sizes=block_sizes, num_samples=num_samples, steps=steps, seed=seed)
    print(format_check(check))
    print()
    print(check.result.stats.summary())
    verdict = "matches" if check.chi_square.p_value >= 1e-3 else "DOES NOT match"
    print(f"\nThe sampled distribution {verdict} the exact target distribution (alpha = 1e-3).")
    return 0 if check.chi_square.p_value >= 1e-3 else 1
