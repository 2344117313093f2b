"""Token trees against chains on the zoo, end to end: for one draft (``xxs > s``) and for two
(``xxs > xs > s``), the chain the bench measured fastest and a few trees drafted by ``xxs``, with HF
``generate`` and our no-draft decoding as references, all compiled, on the code prompts.
``hsd-fast bench``'s measuring: one process, a warm-up pass, rotated interleaved passes, contended
passes redone, greedy outputs compared with HF's. Tokens per target forward is what a tree gains
before its cost.

    python bench/bench_trees.py [--do-sample] [--batch 1 4]
"""

from __future__ import annotations

from hsd_fast.bench import configs as cfg
from hsd_fast.bench.results import measure_script, script_arguments, write_compiled_cpu_run
from hsd_fast.bench.scenarios import SCENARIOS
from hsd_fast.tree import Tree

TREES = {"spine(3, 2)": Tree.spine(3, 2), "full([2, 2])": Tree.full([2, 2]), "spine(4, 2)": Tree.spine(4, 2)}
HIERARCHIES = {("xxs",): (3,), ("xxs", "xs"): (2, 3)}  # drafts: the chain's T (a tree keeps T[1:])


def main() -> None:
    args = script_arguments(__doc__, batches=[1, 4], passes=2)
    scenario = SCENARIOS["zoo"]()
    n, target, drafts, sampling = args.max_new_tokens, scenario.target, scenario.drafts, args.sampling

    def configs_for(batch: int) -> list[cfg.Config]:
        configs = [cfg.hf_generate(target, sampling, n)]
        configs.append(cfg.ours(target, drafts, [], [], sampling, n, True, "ours, no draft"))
        for chain, T in HIERARCHIES.items():
            configs.append(cfg.ours(target, drafts, chain, T, sampling, n, True))
            for label, tree in TREES.items():
                name = f"ours, {' > '.join([*chain, 'target'])}, tree {label} T={list(T[1:])}"
                configs.append(cfg.ours(target, drafts, chain, T, sampling, n, True, name, tree))
        return configs

    rows, redone, recompiled = measure_script(scenario, args, configs_for)
    notes = [
        "A tree is drafted by xxs, one forward per depth, and verified by the level above it in one "
        "forward over all its nodes. `spine(3, 2)`: 3 deep, 2 candidates per depth (the top-ranked one "
        "continues); `full([2, 2])`: 2 children per node, 2 deep; T is that of the levels above.",
    ]
    stem = args.out / f"e2e_zoo_trees{'_sampled' if args.do_sample else ''}_cpu"
    write_compiled_cpu_run(
        stem, "zoo (token trees)", scenario.description, args, sampling, rows, redone, recompiled, notes
    )


if __name__ == "__main__":
    main()
