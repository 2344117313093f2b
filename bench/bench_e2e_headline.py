"""The headline end-to-end comparison on the zoo, cheaply: HF ``generate``, HF assisted generation
with ``xxs``, our compiled no-draft decoding, one draft (``xxs > s``, T=3) and two
(``xxs > xs > s``, T=[2, 3]), on the code prompts, with ``hsd-fast bench``'s measuring (one
process, a warm-up pass, rotated interleaved passes, contended passes redone, greedy outputs
compared with HF's). The full ``hsd-fast bench`` adds profiling, a grid search and every baseline:
on 2 CPU cores its compilation alone takes over an hour.

    python bench/bench_e2e_headline.py [--scenario zoo|twin] [--do-sample] [--batch 1 16]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from hsd_fast.bench import configs as cfg
from hsd_fast.bench.command import _batches, _measure
from hsd_fast.bench.results import write_compiled_cpu_run
from hsd_fast.bench.scenarios import SCENARIOS
from hsd_fast.bench.timing import CpuMeter

HIERARCHIES = {  # scenario -> {drafts: T}
    "zoo": {("xxs",): (3,), ("xxs", "xs"): (2, 3)},
    # the target costs ~100x xxs there, sm 5-20x: one draft of each kind, and both stacked
    "twin": {("xxs",): (4,), ("sm",): (4,), ("xxs", "sm"): (3, 3)},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", choices=sorted(HIERARCHIES), default="zoo")
    parser.add_argument("--do-sample", action="store_true", help="temperature 0.8 (default: greedy)")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--prompts", type=int, default=4, help="code prompts (repeated to fill a batch)")
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args()
    scenario = SCENARIOS[args.scenario]()
    sampling = {"do_sample": True, "temperature": 0.8} if args.do_sample else {"do_sample": False}
    n, target, drafts = args.max_new_tokens, scenario.target, scenario.drafts
    rows, redone, recompiled, meter = [], 0, 0, CpuMeter()
    for batch in args.batch:
        configs = [cfg.hf_generate(target, sampling, n)]
        if batch == 1:
            configs.append(cfg.hf_assisted(target, "xxs", drafts["xxs"], sampling, n))
        configs.append(cfg.ours(target, drafts, [], [], sampling, n, True, "ours, no draft"))
        hierarchies = HIERARCHIES[args.scenario].items()
        configs += [cfg.ours(target, drafts, chain, T, sampling, n, True) for chain, T in hierarchies]
        work = _batches(scenario.prompt_sets["code"][: args.prompts], batch)
        print(f"batch {batch}: {len(configs)} configurations, warm-up (compiles) then {args.passes} passes")
        batch_rows, busy, compiling = _measure(configs, work, args, meter, sampling, scenario, lambda: None)
        redone, recompiled = redone + busy, recompiled + compiling
        rows += [{"batch": batch, "prompt_set": "code", **row} for row in batch_rows]
    stem = args.out / f"e2e_{args.scenario}_headline{'_sampled' if args.do_sample else ''}_cpu"
    scenario_label = f"{args.scenario} (headline)"
    write_compiled_cpu_run(
        stem, scenario_label, scenario.description, args, sampling, rows, redone, recompiled
    )


if __name__ == "__main__":
    main()
