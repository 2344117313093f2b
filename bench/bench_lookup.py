"""The lookup level on the zoo: HF ``generate``, HF prompt lookup and HF assisted generation (batch 1
only: HF refuses larger batches), our best model-only hierarchy (``xxs > s``, T=3), and hierarchies
with the lookup level at the bottom (``lookup > s``, ``lookup > xxs > s``), compiled, on three prompt
sets: code (source continued), repetitive (a passage of documentation repeated three times, so that
its continuation is in the prompt) and prose (fresh text, few matches). Measured as ``hsd-fast
bench`` measures (one process, a warm-up pass, rotated interleaved passes, contended passes redone,
greedy outputs compared with HF's).

    python bench/bench_lookup.py [--do-sample] [--batch 1 4] [--prompt-sets code repetitive prose]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from hsd_fast.bench import configs as cfg
from hsd_fast.bench.command import _batches, _measure
from hsd_fast.bench.results import write_compiled_cpu_run
from hsd_fast.bench.scenarios import SCENARIOS
from hsd_fast.bench.timing import CpuMeter

HIERARCHIES = {("xxs",): (3,), ("lookup",): (4,), ("lookup", "xxs"): (3, 3)}  # drafts -> T


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--do-sample", action="store_true", help="temperature 0.8 (default: greedy)")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--prompt-sets", nargs="+", default=["code", "repetitive", "prose"])
    parser.add_argument("--prompts", type=int, default=4, help="prompts per set (repeated to fill a batch)")
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args()
    scenario = SCENARIOS["zoo"]()
    sampling = {"do_sample": True, "temperature": 0.8} if args.do_sample else {"do_sample": False}
    n, target, drafts = args.max_new_tokens, scenario.target, scenario.drafts
    rows, redone, recompiled, meter = [], 0, 0, CpuMeter()
    for batch in args.batch:
        configs = [cfg.hf_generate(target, sampling, n)]
        if batch == 1:
            configs.append(cfg.hf_lookup(target, sampling, n))
            configs.append(cfg.hf_assisted(target, "xxs", drafts["xxs"], sampling, n))
        configs += [cfg.ours(target, drafts, chain, T, sampling, n, True) for chain, T in HIERARCHIES.items()]
        for prompt_set in args.prompt_sets:
            work = _batches(scenario.prompt_sets[prompt_set][: args.prompts], batch)
            print(
                f"batch {batch}, {prompt_set}: {len(configs)} configurations, warm-up, {args.passes} passes"
            )
            batch_rows, busy, compiling = _measure(
                configs, work, args, meter, sampling, scenario, lambda: None
            )
            redone, recompiled = redone + busy, recompiled + compiling
            rows += [{"batch": batch, "prompt_set": prompt_set, **row} for row in batch_rows]
    stem = args.out / f"e2e_zoo_lookup{'_sampled' if args.do_sample else ''}_cpu"
    hf_lookup = (
        "HF prompt lookup: prompt_lookup_num_tokens=10 (HF's matching n-gram sizes, default 2 down to 1)."
    )
    write_compiled_cpu_run(
        stem,
        "zoo (lookup level)",
        scenario.description,
        args,
        sampling,
        rows,
        redone,
        recompiled,
        [hf_lookup],
    )


if __name__ == "__main__":
    main()
