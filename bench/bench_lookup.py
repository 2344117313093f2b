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

from hsd_fast.bench import configs as cfg
from hsd_fast.bench.results import measure_script, script_arguments, write_compiled_cpu_run
from hsd_fast.bench.scenarios import SCENARIOS

HIERARCHIES = {("xxs",): (3,), ("lookup",): (4,), ("lookup", "xxs"): (3, 3)}  # drafts -> T


def main() -> None:
    prompt_sets = {"nargs": "+", "default": ["code", "repetitive", "prose"]}
    args = script_arguments(__doc__, batches=[1, 4], passes=3, prompt_sets=prompt_sets)
    scenario = SCENARIOS["zoo"]()
    n, target, drafts, sampling = args.max_new_tokens, scenario.target, scenario.drafts, args.sampling

    def configs_for(batch: int) -> list[cfg.Config]:
        configs = [cfg.hf_generate(target, sampling, n)]
        if batch == 1:
            configs.append(cfg.hf_lookup(target, sampling, n))
            configs.append(cfg.hf_assisted(target, "xxs", drafts["xxs"], sampling, n))
        return configs + [
            cfg.ours(target, drafts, chain, T, sampling, n, True) for chain, T in HIERARCHIES.items()
        ]

    rows, redone, recompiled = measure_script(scenario, args, configs_for, args.prompt_sets)
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
