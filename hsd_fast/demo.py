"""`hsd-fast demo --tables`: HSD over table models, sampled continuations vs the exact distribution."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from hsd_fast.testing.exactness import TableCheck, table_check


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
