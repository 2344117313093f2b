"""The benchmark's result files: ``<stem>.json`` (everything), ``<stem>.md`` (the tables) and
``<stem>.png`` (tokens/s per configuration and batch size; needs matplotlib, the ``bench`` extra)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from hsd_fast.bench import measuring
from hsd_fast.bench.timing import CpuMeter
from hsd_fast.report import markdown_table, run_metadata, write_report

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
    sections += [*extra, "## Notes", "", *[f"- {n}" for n in notes]]
    title = f"hsd-fast bench: {meta['scenario']}, {meta['sampling_label']}"
    write_report(stem, title, meta, sections, {"rows": rows})
    written = [stem.parent / f"{stem.name}.{ext}" for ext in ("json", "md")]
    if _plot(stem.parent / f"{stem.name}.png", title, rows):
        written.append(stem.parent / f"{stem.name}.png")
    return written


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
    """The result files of a compiled, fp32 CPU run of the bench scripts (``bench/bench_*.py``):
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
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    batches = sorted({r["batch"] for r in rows})
    configs = list(dict.fromkeys(r["config"] for r in rows))
    fig, axes = plt.subplots(
        1, len(batches), figsize=(6 * len(batches), 0.45 * len(configs) + 2), squeeze=False
    )
    for ax, batch in zip(axes[0], batches, strict=True):
        # tokens/s per configuration, summed over prompt sets as a harmonic mean would hide nothing:
        # one bar per (configuration, prompt set)
        sets = sorted({r["prompt_set"] for r in rows if r["batch"] == batch})
        height = 0.8 / max(len(sets), 1)
        for k, prompt_set in enumerate(sets):
            values = {
                r["config"]: r["tok_s"] for r in rows if r["batch"] == batch and r["prompt_set"] == prompt_set
            }
            ys = [i + k * height for i, c in enumerate(configs) if c in values]
            ax.barh(ys, [values[c] for c in configs if c in values], height=height, label=prompt_set)
        ax.set_yticks([i + 0.4 - height / 2 for i in range(len(configs))], configs, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("tokens/s")
        ax.set_title(f"batch {batch}")
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def script_arguments(doc: str, batches: Sequence[int], passes: int, **extra: dict) -> argparse.Namespace:
    """The command line every end-to-end bench script takes (``bench/bench_*.py``): sampling,
    batch sizes, prompts, passes, new tokens and the output folder; ``extra``: more options, by
    name (``--name``), each with its ``add_argument`` keywords. ``.sampling`` holds the sampling
    arguments of ``generate`` they ask for."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    for name, options in extra.items():
        parser.add_argument(f"--{name.replace('_', '-')}", **options)
    parser.add_argument("--do-sample", action="store_true", help="temperature 0.8 (default: greedy)")
    parser.add_argument("--batch", type=int, nargs="+", default=list(batches))
    parser.add_argument("--prompts", type=int, default=4, help="prompts per set (repeated to fill a batch)")
    parser.add_argument("--passes", type=int, default=passes)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args()
    args.sampling = {"do_sample": True, "temperature": 0.8} if args.do_sample else {"do_sample": False}
    return args


def measure_script(
    scenario,  # hsd_fast.bench.scenarios.Scenario
    args: argparse.Namespace,
    configs_for: Callable[[int], list],  # batch size -> the configurations (hsd_fast.bench.configs)
    prompt_sets: Sequence[str] = ("code",),
) -> tuple[list[dict], int, int]:
    """Measure a bench script's configurations batch by batch and prompt set by prompt set, as
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
