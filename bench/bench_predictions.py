"""The latency model against the committed end-to-end measurements: every hierarchy in the "selector's
predictions, measured" tables of ``hsd-fast bench`` (zoo greedy and at temperature 0.8, twin
greedy), predicted again now from the committed profiles (``zoo/profile*_cpu.json``), next to what
that run measured and what it predicted then.

    python bench/bench_predictions.py

No timing: the measured decode speeds are the tables' own (each table names its commit), and the
costs are the committed profiles', which those runs measured. What changes a prediction is the
profiling code, e.g. acceptance measured on the target's own continuations instead of held-out
text (docs/design.md, "Acceptance on the run's own text"). Writes
bench/results/predictions_cpu.{json,md}.
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import tempfile
from pathlib import Path

from kernel_bench import run_meta, write_results

from hsd_fast.batch_latency import chain_latency
from hsd_fast.bench import command
from hsd_fast.bench.scenarios import SCENARIOS

RESULTS = Path(__file__).parent / "results"
ZOO = Path(__file__).parents[1] / "zoo"
TABLES = [  # (results file, scenario, committed profile, sampling)
    ("e2e_zoo_cpu.md", "zoo", "profile_cpu.json", {"do_sample": False}),
    ("e2e_zoo_sampled_cpu.md", "zoo", "profile_cpu.json", {"do_sample": True, "temperature": 0.8}),
    ("e2e_twin_cpu.md", "twin", "profile_twin_cpu.json", {"do_sample": False}),
]


def measured_rows(markdown: str) -> list[tuple[list[str], tuple[int, ...], float, float]]:
    """(chain names, T, predicted then, measured) of a results file's predictions table."""
    section = markdown.split("## The selector's predictions")[1].split("\n## ")[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[1].startswith("["):
            chain = cells[0].removesuffix(" (the pick)").split(" > ")
            rows.append(
                (chain, tuple(int(t) for t in re.findall(r"\d+", cells[1])), float(cells[2]), float(cells[3]))
            )
    return rows


def main() -> None:
    rows = []
    for table, scenario_name, profile, sampling in TABLES:
        scenario = SCENARIOS[scenario_name]()
        with tempfile.TemporaryDirectory() as scratch:  # whatever is missing is measured, not saved
            cache = Path(scratch) / profile
            shutil.copy(ZOO / profile, cache)
            args = argparse.Namespace(cache=cache, eager=False, max_new_tokens=128)
            costs, alpha, names, _ = command._profile(scenario, sampling, args)
        for chain, T, then, measured in measured_rows((RESULTS / table).read_text()):
            now = 1 / chain_latency(costs, alpha, tuple(names.index(n) for n in chain), T)
            rows.append({
                "table": table, "hierarchy": " > ".join(chain), "T": list(T), "measured_tok_s": measured,
                "predicted_then_tok_s": then, "measured_over_predicted_then": round(measured / then, 3),
                "predicted_now_tok_s": round(now, 1), "measured_over_predicted_now": round(measured / now, 3),
            })  # fmt: skip
    notes = ["Median |measured / predicted - 1|, then and now:", ""]
    groups = {table: [r for r in rows if r["table"] == table] for table, *_ in TABLES}
    groups["rows without the lookup level (model drafts only)"] = [
        r for r in rows if "lookup" not in r["hierarchy"]
    ]
    for label, mine in groups.items():
        then, now = (
            statistics.median(abs(r[key] - 1) for r in mine)
            for key in ("measured_over_predicted_then", "measured_over_predicted_now")
        )
        notes.append(f"- {label} ({len(mine)} rows): {then:.3f} then, {now:.3f} now")
    write_results(
        "predictions_cpu", "Latency model vs committed measurements", notes, ["table"], rows, run_meta("cpu")
    )


if __name__ == "__main__":
    main()
