"""Two drafts against one, side by side: on the cost twin (the target costs about 100x ``xxs``,
``sm`` 5-20x), our no-draft decoding, each single draft (``xxs``, ``xs``, ``sm``, and the
model-free ``lookup``) at the block size earlier twin runs found best for it (the grid's, the
selector's or the headline run's), and the two-level chains that put a cheaper level under a
draft (``xxs > sm``, ``lookup > xs``, ``lookup > sm``), on three prompt sets, compiled, batch 1.
It answers how much the best two-level chain gains over the best single draft, with every
configuration measured in the same passes. Measured as ``hsd-fast bench`` measures (one process, a
warm-up pass, rotated interleaved passes, contended passes redone, greedy outputs compared with
HF's).

    python bench/bench_levels.py [--do-sample] [--prompt-sets code repetitive prose]
"""

from __future__ import annotations

from hsd_fast.bench import configs as cfg
from hsd_fast.bench.results import measure_script, script_arguments, write_compiled_cpu_run
from hsd_fast.bench.scenarios import SCENARIOS

SINGLE = {("xxs",): (4,), ("xs",): (3,), ("sm",): (4,), ("lookup",): (6,)}  # drafts -> T
TWO_LEVELS = {("xxs", "sm"): (3, 3), ("lookup", "xs"): (4, 3), ("lookup", "sm"): (4, 4)}


def main() -> None:
    prompt_sets = {"nargs": "+", "default": ["code", "repetitive", "prose"]}
    args = script_arguments(__doc__, batches=[1], passes=3, prompt_sets=prompt_sets)
    scenario = SCENARIOS["twin"]()
    n, target, drafts, sampling = args.max_new_tokens, scenario.target, scenario.drafts, args.sampling

    def configs_for(batch: int) -> list[cfg.Config]:
        hierarchies = {**SINGLE, **TWO_LEVELS}.items()
        return [
            cfg.hf_generate(target, sampling, n),
            cfg.ours(target, drafts, [], [], sampling, n, True, "ours, no draft"),
            *(cfg.ours(target, drafts, chain, T, sampling, n, True) for chain, T in hierarchies),
        ]

    rows, redone, recompiled = measure_script(scenario, args, configs_for, args.prompt_sets)
    stem = args.out / f"e2e_twin_levels{'_sampled' if args.do_sample else ''}_cpu"
    write_compiled_cpu_run(
        stem, "twin (two drafts against one)", scenario.description, args, sampling, rows, redone, recompiled
    )


if __name__ == "__main__":
    main()
