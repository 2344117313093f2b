"""One table over the committed end-to-end runs of ``hsd-fast bench``: per scenario, sampling and
batch size, HF ``generate``, the best HF baseline, our no-draft decoding and our best speculative
configuration, as ranges over the three prompt sets.

    python bench/summarize_e2e.py

No timing: it reads the result files (each names its commit and machine) and writes
bench/results/e2e_summary_cpu.md, the table the README shows. "Best" is the configuration with the
highest geometric mean over the prompt sets, chosen after the fact: a grid's best is an upper
bound on what a selector could have picked, and the files say what the selector did pick.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
RUNS = [  # the full ``hsd-fast bench`` runs, one file per scenario, sampling and batch set
    "e2e_zoo_cpu",
    "e2e_zoo_sampled_cpu",
    "e2e_twin_cpu",
    "e2e_twin_batch4_cpu",
    "e2e_twin_batch16_cpu",
    "e2e_twin_sampled_cpu",
    "e2e_twin_batch4_sampled_cpu",
    "e2e_twin_batch16_sampled_cpu",
]
HEADER = (
    "| scenario | sampling | batch | HF `generate` tok/s | best HF baseline, x HF | ours no draft, x HF "
    "| best speculative | its x HF | its x our no draft | file (commit) |\n"
    "|---|---|---|---|---|---|---|---|---|---|"
)


def span(values: list[float], digits: int = 2) -> str:
    """``low-high`` of ``values`` (one number when they round alike)."""
    low, high = f"{min(values):.{digits}f}", f"{max(values):.{digits}f}"
    return low if low == high else f"{low}-{high}"


def best(configs: dict[str, dict[str, float]]) -> str:
    """The configuration whose tokens/s over the prompt sets has the highest geometric mean."""
    return max(configs, key=lambda name: statistics.geometric_mean(list(configs[name].values())))


def short_name(config: str) -> str:
    """``ours, xs > target T=[3] (selector's pick)`` -> ``xs > target T=[3] (selector's pick)``."""
    return config.removeprefix("ours, ")


def ratios(faster: dict[str, float], base: dict[str, float]) -> list[float]:
    """``faster``'s tokens/s over ``base``'s, prompt set by prompt set."""
    return [faster[prompt_set] / base[prompt_set] for prompt_set in sorted(base)]


def summary_rows(run: str) -> list[str]:
    """The table's rows for one result file, one per batch size in it."""
    data = json.loads((RESULTS / f"{run}.json").read_text())
    meta = data["meta"]
    # batch -> configuration -> prompt set -> tokens/s
    by_batch: dict[int, dict[str, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
    family: dict[str, str] = {}
    speculative: dict[str, bool] = {}
    for row in data["rows"]:
        by_batch[row["batch"]][row["config"]][row["prompt_set"]] = row["tok_s"]
        family[row["config"]] = row["family"]
        speculative[row["config"]] = bool(row["chain"])
    lines = []
    for batch, configs in sorted(by_batch.items()):
        hf, no_draft = configs["HF generate"], configs["ours, no draft"]
        hf_best = best({c: v for c, v in configs.items() if family[c] not in ("hf", "ours")})
        ours_best = best({c: v for c, v in configs.items() if family[c] == "ours" and speculative[c]})
        cells = [
            meta["scenario"],
            meta["sampling_label"],
            str(batch),
            span(list(hf.values()), 1),
            f"{hf_best}: {span(ratios(configs[hf_best], hf))}",
            span(ratios(no_draft, hf)),
            short_name(ours_best),
            span(ratios(configs[ours_best], hf)),
            span(ratios(configs[ours_best], no_draft)),
            f"`{run}` ({meta['commit']})",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main() -> None:
    rows = [line for run in RUNS for line in summary_rows(run)]
    text = (
        "# hsd-fast bench: the end-to-end runs in one table\n\n"
        "CPU (2 cores), fp32, compiled, 4 prompts of 64 tokens per set (code, prose, repetitive), "
        "128 new tokens; ranges over the three prompt sets. Made by `python bench/summarize_e2e.py` "
        "from the files named in the last column.\n\n" + HEADER + "\n" + "\n".join(rows) + "\n"
    )
    (RESULTS / "e2e_summary_cpu.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
