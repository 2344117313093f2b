"""The headline end-to-end comparison on the zoo, cheaply: HF ``generate``, HF assisted generation
with ``xxs``, our compiled no-draft decoding, one draft (``xxs > s``, T=3) and two
(``xxs > xs > s``, T=[2, 3]), on the code prompts, with ``hsd-fast bench``'s measuring (one
process, a warm-up pass, rotated interleaved passes, contended passes redone, greedy outputs
compared with HF's). The full ``hsd-fast bench`` adds profiling, a grid search and every baseline:
on 2 CPU cores its compilation alone takes over an hour.

    python bench/bench_e2e_headline.py [--scenario zoo|twin] [--do-sample] [--batch 1 16]
"""

from __future__ import annotations

from hsd_fast.bench import configs as cfg
from hsd_fast.bench.results import measure_script, script_arguments, write_compiled_cpu_run
from hsd_fast.bench.scenarios import SCENARIOS

HIERARCHIES = {  # scenario -> {drafts: T}
    "zoo": {("xxs",): (3,), ("xxs", "xs"): (2, 3)},
    # the target costs ~100x xxs there, sm 5-20x: one draft of each kind, and both stacked
    "twin": {("xxs",): (4,), ("sm",): (4,), ("xxs", "sm"): (3, 3)},
}


def main() -> None:
    scenarios = {"choices": sorted(HIERARCHIES), "default": "zoo"}
    args = script_arguments(__doc__, batches=[1, 16], passes=3, scenario=scenarios)
    scenario = SCENARIOS[args.scenario]()
    n, target, drafts, sampling = args.max_new_tokens, scenario.target, scenario.drafts, args.sampling

    def configs_for(batch: int) -> list[cfg.Config]:
        configs = [cfg.hf_generate(target, sampling, n)]
        if batch == 1:
            configs.append(cfg.hf_assisted(target, "xxs", drafts["xxs"], sampling, n))
        configs.append(cfg.ours(target, drafts, [], [], sampling, n, True, "ours, no draft"))
        hierarchies = HIERARCHIES[args.scenario].items()
        return configs + [cfg.ours(target, drafts, chain, T, sampling, n, True) for chain, T in hierarchies]

    rows, redone, recompiled = measure_script(scenario, args, configs_for)
    stem = args.out / f"e2e_{args.scenario}_headline{'_sampled' if args.do_sample else ''}_cpu"
    scenario_label = f"{args.scenario} (headline)"
    write_compiled_cpu_run(
        stem, scenario_label, scenario.description, args, sampling, rows, redone, recompiled
    )


if __name__ == "__main__":
    main()
