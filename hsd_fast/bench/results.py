"""The benchmark's result files: ``<stem>.json`` (everything), ``<stem>.md`` (the tables) and
``<stem>.png`` (tokens/s per configuration and batch size; needs matplotlib, the ``bench`` extra).
A configuration that runs at some batch sizes only (HF assisted generation and prompt lookup: batch 1)
is named at the others as not run there, in the tables and in the plot, never left blank.
Also the driver of the end-to-end suites (``bench/bench_e2e.py``): ``measure_script`` and
``write_compiled_cpu_run``."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from hsd_fast.bench import measuring
from hsd_fast.bench.timing import CpuMeter
from hsd_fast.report import markdown_table, run_metadata, write_report

if TYPE_CHECKING:
    from matplotlib.figure import Figure

COLUMNS = [
    ("config", "configuration"),
    ("tok_s", "tokens/s"),
    ("x_hf", "x HF generate"),
    ("x_ours_no_draft", "x ours, no draft"),
    ("tokens_per_target_forward", "tokens / target forward"),
    ("same_output", "greedy output = target's"),
    ("host_us_per_step", "engine host us / step"),
    ("predicted_tok_s", "predicted tokens/s"),
    ("measured_decode_tok_s", "measured decode tokens/s"),
]


def write(
    stem: Path, meta: dict, rows: list[dict], notes: list[str], extra: Sequence[str] = ()
) -> list[Path]:
    """Write the three files (``extra``: markdown sections after the tables); returns the paths
    written (the plot only where matplotlib is)."""
    sections = []
    for batch in sorted({r["batch"] for r in rows}):
        sections += [f"## Batch {batch}", ""]
        for prompt_set in sorted({r["prompt_set"] for r in rows if r["batch"] == batch}):
            chosen = [r for r in rows if r["batch"] == batch and r["prompt_set"] == prompt_set]
            sections += [f"### Prompt set `{prompt_set}`", ""]
            sections += markdown_table(
                [title for _, title in COLUMNS], [[r.get(k) for k, _ in COLUMNS] for r in chosen]
            )
            sections.append("")
        absent = _absent_at(rows, batch)
        if absent:
            named = ", ".join(f"`{config}` ({only})" for config, only in absent.items())
            sections += [f"Not run at batch {batch}: {named}.", ""]
    sections += [*extra, "## Notes", "", *[f"- {n}" for n in notes]]
    title = f"hsd-fast bench: {meta['scenario']}, {meta['sampling_label']}"
    write_report(stem, title, meta, sections, {"rows": rows})
    written = [stem.parent / f"{stem.name}.{ext}" for ext in ("json", "md")]
    if _plot(stem.parent / f"{stem.name}.png", title, rows):
        written.append(stem.parent / f"{stem.name}.png")
    return written


def _absent_at(rows: list[dict], batch: int) -> dict[str, str]:
    """The configurations of ``rows`` with no row at ``batch``, each with where it ran: "batch 1 only"."""
    ran_at: dict[str, set[int]] = {}
    for row in rows:
        ran_at.setdefault(row["config"], set()).add(row["batch"])
    absent = {}
    for config, batches in ran_at.items():
        if batch not in batches:
            sizes = ", ".join(str(b) for b in sorted(batches))
            absent[config] = f"batch{'es' if len(batches) > 1 else ''} {sizes} only"
    return absent


def write_compiled_cpu_run(
    stem: Path,
    scenario: str,
    models: str,
    args: argparse.Namespace,  # batch, prompts, max_new_tokens, passes, do_sample
    sampling: dict,
    rows: list[dict],
    redone: int,
    recompiled: int,
    notes: Sequence[str] = (),
) -> None:
    """The result files of a compiled, fp32 CPU run of an end-to-end suite (``bench/bench_e2e.py``):
    its metadata and the notes every such run states, then ``notes``; prints the paths written."""
    label = f"temperature {sampling['temperature']}" if args.do_sample else "greedy"
    meta = run_metadata(
        "cpu", scenario=scenario, models=models, sampling_label=label, sampling=sampling, compiled=True,
        dtype="float32", batches=args.batch, prompts=args.prompts, max_new_tokens=args.max_new_tokens,
        passes=args.passes, redone_passes=redone, recompiled_passes=recompiled,
        threads=torch.get_num_threads(),
    )  # fmt: skip
    common = [
        "tokens/s: new tokens of every row over wall time, prefill included, median of the counted passes.",
        f"Warm-up until a call compiles nothing, then {args.passes} counted passes, rotated; {redone} "
        f"passes redone because other processes took more than 10% of the CPU, {recompiled} because "
        "something compiled in them.",
    ]
    for path in write(stem, meta, rows, [*common, *notes]):
        print(f"wrote {path}")


def _plot(path: Path, title: str, rows: list[dict]) -> bool:
    try:
        fig = figure(title, rows)
    except ImportError:
        return False
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return True


def figure(title: str, rows: list[dict]) -> Figure:
    """Tokens/s per configuration, one panel per batch size, one bar per prompt set; a configuration
    that did not run at a panel's batch says where it ran ("batch 1 only"). Raises ImportError
    without matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    batches = sorted({r["batch"] for r in rows})
    configs = list(dict.fromkeys(r["config"] for r in rows))
    fig, axes = plt.subplots(
        1, len(batches), figsize=(6 * len(batches), 0.45 * len(configs) + 2), squeeze=False
    )
    for ax, batch in zip(axes[0], batches, strict=True):
        sets = sorted({r["prompt_set"] for r in rows if r["batch"] == batch})
        height = 0.8 / max(len(sets), 1)
        for k, prompt_set in enumerate(sets):
            values = {
                r["config"]: r["tok_s"] for r in rows if r["batch"] == batch and r["prompt_set"] == prompt_set
            }
            ys = [i + k * height for i, c in enumerate(configs) if c in values]
            ax.barh(ys, [values[c] for c in configs if c in values], height=height, label=prompt_set)
        centres = [i + 0.4 - height / 2 for i in range(len(configs))]
        absent = _absent_at(rows, batch)
        for config, only in absent.items():  # an empty row would read as "measured nothing"
            ax.text(0, centres[configs.index(config)], f" {only}", va="center", fontsize=8, color="0.4")
        ax.set_yticks(centres, configs, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("tokens/s")
        ax.set_title(f"batch {batch}")
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def measure_script(
    scenario,  # hsd_fast.bench.scenarios.Scenario
    args: argparse.Namespace,
    configs_for: Callable[[int], list],  # batch size -> the configurations (hsd_fast.bench.configs)
    prompt_sets: Sequence[str] = ("code",),
) -> tuple[list[dict], int, int]:
    """Measure a suite's configurations batch by batch and prompt set by prompt set, as
    ``hsd-fast bench`` does (interleaved passes, contended ones redone). Returns the rows and the
    passes redone for contention and for compiling."""
    rows, redone, recompiled, meter = [], 0, 0, CpuMeter()
    for batch in args.batch:
        configs = configs_for(batch)
        for prompt_set in prompt_sets:
            work = measuring.batches(scenario.prompt_sets[prompt_set][: args.prompts], batch)
            print(
                f"batch {batch}, {prompt_set}: {len(configs)} configurations, warm-up, {args.passes} passes"
            )
            batch_rows, busy, compiling = measuring.measure(
                configs, work, args, meter, args.sampling, scenario, lambda: None
            )
            redone, recompiled = redone + busy, recompiled + compiling
            rows += [{"batch": batch, "prompt_set": prompt_set, **row} for row in batch_rows]
    return rows, redone, recompiled
