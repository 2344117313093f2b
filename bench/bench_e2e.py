"""End-to-end suites: fixed configurations side by side, measured as ``hsd-fast bench`` measures (one
process, a warm-up until nothing compiles, rotated interleaved passes, contended passes redone,
greedy outputs compared with HF's), compiled, fp32, on the CPU. ``hsd-fast bench`` chooses its
hierarchies (the selector, a grid) and runs every baseline; a suite answers one question with the
configurations named here, in a fraction of its time.

    python bench/bench_e2e.py SUITE [--do-sample] [--batch B ...] [--prompt-sets NAME ...]
                                    [--prompts 4] [--passes P] [--max-new-tokens 128] [--out DIR]

- ``lookup``: the lookup level on the zoo. HF ``generate``, HF prompt lookup and HF assisted
  generation with ``xxs`` (batch 1 only: HF refuses larger batches), our best model-only hierarchy
  (``xxs > s``, T=3) and the lookup level at the bottom (``lookup > s``, ``lookup > xxs > s``); code,
  repetitive and prose prompts; batch 1 and 4. Writes ``e2e_zoo_lookup[_sampled]_cpu``.
- ``trees``: token trees against chains on the zoo. For one draft (``xxs > s``) and two
  (``xxs > xs > s``), the chain and three trees drafted by ``xxs``, with HF ``generate`` and our
  no-draft decoding as references; code prompts; batch 1 and 4. Writes ``e2e_zoo_trees[_sampled]_cpu``.
- ``levels``: two drafts against one on the cost twin (the target costs about 100x ``xxs``, ``sm``
  5-20x): our no-draft decoding, each single draft (``xxs``, ``xs``, ``sm``, ``lookup``) at the block
  size earlier twin runs found best for it, and the chains that put a cheaper level under a draft
  (``xxs > sm``, ``lookup > xs``, ``lookup > sm``); three prompt sets; batch 1. About 50 minutes on
  the 2-core CPU, 40 of them compiling. Writes ``e2e_twin_levels[_sampled]_cpu``.
- ``pairs``: a draft and its verification launched back to back and read once (the default) against
  every step read before the next (``round_steps.PAIRED_ROUNDS`` off) on the zoo: ``xxs > s`` T=3,
  ``xs > s`` T=4, ``xxs > xs > s`` T=[2, 3], with HF ``generate`` and our no-draft decoding; code
  prompts; batch 1 and 4. Writes ``e2e_zoo_pairs[_sampled]_cpu``.

Result files go to ``--out`` (default bench/results/) as ``<stem>.{json,md,png}``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hsd_fast.bench import configs as cfg
from hsd_fast.bench.results import measure_script, write_compiled_cpu_run
from hsd_fast.bench.scenarios import SCENARIOS, Scenario
from hsd_fast.tree import Tree

ALL_SETS = ("code", "repetitive", "prose")


@dataclass(frozen=True)
class Suite:
    scenario: str  # a key of SCENARIOS
    label: str  # the report's scenario line
    stem: str  # the result files' name, before "[_sampled]_cpu"
    batches: tuple[int, ...]  # defaults of the command line
    passes: int
    prompt_sets: tuple[str, ...]
    configs: Callable[[Scenario, int, dict, int], list[cfg.Config]]  # (scenario, batch, sampling, tokens)
    notes: tuple[str, ...] = ()


def _ours(scenario: Scenario, hierarchies: dict, sampling: dict, n: int) -> list[cfg.Config]:
    """Our compiled engine with each ``{drafts: T}`` of ``hierarchies``."""
    target, drafts = scenario.target, scenario.drafts
    return [cfg.ours(target, drafts, chain, T, sampling, n, True) for chain, T in hierarchies.items()]


def _no_draft(scenario: Scenario, sampling: dict, n: int) -> cfg.Config:
    return cfg.ours(scenario.target, scenario.drafts, [], [], sampling, n, True, "ours, no draft")


LOOKUP_HIERARCHIES = {("xxs",): (3,), ("lookup",): (4,), ("lookup", "xxs"): (3, 3)}


def lookup_configs(scenario: Scenario, batch: int, sampling: dict, n: int) -> list[cfg.Config]:
    target = scenario.target
    configs = [cfg.hf_generate(target, sampling, n)]
    if batch in cfg.BATCH_ONE:  # HF refuses larger batches
        configs.append(cfg.hf_lookup(target, sampling, n))
        configs.append(cfg.hf_assisted(target, "xxs", scenario.drafts["xxs"], sampling, n))
    return configs + _ours(scenario, LOOKUP_HIERARCHIES, sampling, n)


TREES = {"spine(3, 2)": Tree.spine(3, 2), "full([2, 2])": Tree.full([2, 2]), "spine(4, 2)": Tree.spine(4, 2)}
TREE_CHAINS = {("xxs",): (3,), ("xxs", "xs"): (2, 3)}  # drafts: the chain's T (a tree keeps T[1:])


def trees_configs(scenario: Scenario, batch: int, sampling: dict, n: int) -> list[cfg.Config]:
    target, drafts = scenario.target, scenario.drafts
    configs = [cfg.hf_generate(target, sampling, n), _no_draft(scenario, sampling, n)]
    for chain, T in TREE_CHAINS.items():
        configs += _ours(scenario, {chain: T}, sampling, n)
        for label, tree in TREES.items():
            name = f"ours, {' > '.join([*chain, 'target'])}, tree {label} T={list(T[1:])}"
            configs.append(cfg.ours(target, drafts, chain, T, sampling, n, True, name, tree))
    return configs


SINGLE = {("xxs",): (4,), ("xs",): (3,), ("sm",): (4,), ("lookup",): (6,)}  # drafts -> T
TWO_LEVELS = {("xxs", "sm"): (3, 3), ("lookup", "xs"): (4, 3), ("lookup", "sm"): (4, 4)}


def levels_configs(scenario: Scenario, batch: int, sampling: dict, n: int) -> list[cfg.Config]:
    references = [cfg.hf_generate(scenario.target, sampling, n), _no_draft(scenario, sampling, n)]
    return references + _ours(scenario, {**SINGLE, **TWO_LEVELS}, sampling, n)


PAIRED = {("xxs",): (3,), ("xs",): (4,), ("xxs", "xs"): (2, 3)}  # level 1 verifies level 0's draft


def pairs_configs(scenario: Scenario, batch: int, sampling: dict, n: int) -> list[cfg.Config]:
    """Each hierarchy with its draft and verification launched back to back (the default), then
    with every step read by the host first."""
    references = [cfg.hf_generate(scenario.target, sampling, n), _no_draft(scenario, sampling, n)]
    paired = _ours(scenario, PAIRED, sampling, n)
    return references + [c for config in paired for c in (config, cfg.steps_read_one_at_a_time(config))]


SUITES = {
    "lookup": Suite(
        "zoo", "zoo (lookup level)", "e2e_zoo_lookup", (1, 4), 3, ALL_SETS, lookup_configs,
        ("HF prompt lookup: prompt_lookup_num_tokens=10 (HF's matching n-gram sizes, default 2 down to 1).",),
    ),
    "trees": Suite(
        "zoo", "zoo (token trees)", "e2e_zoo_trees", (1, 4), 2, ("code",), trees_configs,
        (
            "A tree is drafted by xxs, one forward per depth, and verified by the level above it in one "
            "forward over all its nodes. `spine(3, 2)`: 3 deep, 2 candidates per depth (the top-ranked one "
            "continues); `full([2, 2])`: 2 children per node, 2 deep; T is that of the levels above.",
        ),
    ),
    "levels": Suite(
        "twin", "twin (two drafts against one)", "e2e_twin_levels", (1,), 3, ALL_SETS, levels_configs
    ),
    "pairs": Suite(
        "zoo", "zoo (a draft and its verification read once)", "e2e_zoo_pairs", (1, 4), 3, ("code",),
        pairs_configs,
        (
            "Paired (the default): level 0's draft and level 1's verification launched back to back, the "
            "host reading both once; 'steps read one at a time': the host reads each step before launching "
            "the next. On a CPU every step runs as it is launched: what pairing can save here is host work, "
            "not idle time of the device.",
        ),
    ),
}  # fmt: skip


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    """The suite and its options (defaults: the suite's). ``.sampling``: ``generate``'s sampling
    arguments."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    suites = parser.add_subparsers(dest="suite", required=True)
    for name, suite in SUITES.items():
        sub = suites.add_parser(name)
        sub.add_argument("--do-sample", action="store_true", help="temperature 0.8 (default: greedy)")
        sub.add_argument("--batch", type=int, nargs="+", default=list(suite.batches))
        sub.add_argument("--prompt-sets", nargs="+", choices=ALL_SETS, default=list(suite.prompt_sets))
        sub.add_argument("--prompts", type=int, default=4, help="prompts per set (repeated to fill a batch)")
        sub.add_argument("--passes", type=int, default=suite.passes)
        sub.add_argument("--max-new-tokens", type=int, default=128)
        sub.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args(argv)
    args.sampling = {"do_sample": True, "temperature": 0.8} if args.do_sample else {"do_sample": False}
    return args


def main(argv: list[str] | None = None) -> None:
    args = arguments(argv)
    suite = SUITES[args.suite]
    scenario = SCENARIOS[suite.scenario]()

    def configs_for(batch: int) -> list[cfg.Config]:
        return suite.configs(scenario, batch, args.sampling, args.max_new_tokens)

    rows, redone, recompiled = measure_script(scenario, args, configs_for, args.prompt_sets)
    stem = args.out / f"{suite.stem}{'_sampled' if args.do_sample else ''}_cpu"
    write_compiled_cpu_run(
        stem, suite.label, scenario.description, args, args.sampling, rows, redone, recompiled, suite.notes
    )


if __name__ == "__main__":
    main()
