"""``hsd-fast bench``: every configuration of ``configs.py`` on a scenario, side by side in one
process, interleaved, after warm-up, with the machine checked for contention; greedy outputs are
compared with the target's own. Writes ``bench/results/e2e_<scenario>[_sampled]_<device>.{json,md,png}``.

Which hierarchies run: ours with no draft; the selector's pick (``select_hierarchy`` with compiled
step costs, the lookup level among the candidates) for batch 1, at every batch, and for each larger
batch its own pick (``select_for_batch`` on step costs timed at that batch), at that batch only
(docs/design.md, "Selecting for a batch"); the best single draft and the best hierarchy of
a grid: every chain of one or two drafts (the lookup level only at the bottom) with T up to
``DEFAULT_MAX_T`` (what ``select_hierarchy`` considers by default), ranked by the latency model, its
``GRID_MEASURED`` best measured once each (a tuning pass) and the fastest kept. HF assisted
generation runs with each draft, with its default schedule and with the fixed number of draft
tokens that measured best in the tuning pass.
"""

from __future__ import annotations

import argparse
import itertools
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

import torch
from tqdm.auto import tqdm

from hsd_fast.batch_latency import chain_latency, select_for_batch
from hsd_fast.bench import configs as cfg
from hsd_fast.bench import measuring
from hsd_fast.bench.mixed import measure_mixed, mixed_grid, mixed_requests, write_mixed
from hsd_fast.bench.results import write
from hsd_fast.bench.scenarios import SCENARIOS, Scenario, checkpoints_scenario, draft_models, on_text
from hsd_fast.bench.text_sets import TEXT_SETS, TextSet, available
from hsd_fast.bench.timing import CpuMeter
from hsd_fast.cli_args import output_folder, positive_float, positive_int
from hsd_fast.controller import LatencyController
from hsd_fast.early_exit import EarlyExit, exit_of
from hsd_fast.hf_generate import generate
from hsd_fast.hierarchy import (
    keyed_by_ids,
    spread_over,
    through_over,
    with_proposal_level,
    with_recomputing_exits,
)
from hsd_fast.hierarchy_types import DEFAULT_MAX_T, Hierarchy, Profile, Selection
from hsd_fast.latency import Through, decode_seconds, reindexed
from hsd_fast.lookup import LOOKUP, LookupDraft, as_lookup
from hsd_fast.other_tokenizer import OtherTokenizerDraft
from hsd_fast.positions import COMMAND_FORM, check_positions, fewest_positions
from hsd_fast.processors import generation_sampling
from hsd_fast.profile import ProfileCache, measured_latency
from hsd_fast.profile.costs import crowd_bytes
from hsd_fast.report import markdown_table, run_metadata
from hsd_fast.row_spread import Spread
from hsd_fast.select_levels import RECOMPUTED
from hsd_fast.selector import level_zero_only, select

GRID_MEASURED = 6
ASSISTED_FIXED = (2, 4, 8)
DEFAULT_CACHE = Path.home() / ".cache" / "hsd_fast" / "profiles.json"
GRID_KINDS = {  # the kinds of hierarchy a report compares, by their chains of candidate indices
    "best single draft": lambda chain: len(chain) == 2 and chain[0] != 0,
    "best model-only": lambda chain: 0 not in chain,
    "best with the lookup level": lambda chain: chain[0] == 0,
}


def add_parser(sub) -> argparse.ArgumentParser:
    """``hsd-fast bench``: the sub-command and its arguments."""
    parser = sub.add_parser("bench", help="every way to generate, side by side (writes bench/results/)")
    add_arguments(parser)
    return parser


GENERATION_CONFIGS = {
    "qwen2.5-instruct": {
        "do_sample": True,
        "temperature": 0.7,
        "top_p": 0.8,
        "top_k": 20,
        "repetition_penalty": 1.05,
    },
}
"""Sampling defaults real checkpoints ship in their ``generation_config.json`` (``--generation-config``)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--scenario", choices=sorted(SCENARIOS),
        help="zoo: target s, drafts xxs xs sm and the lookup level (default); twin: the same at the cost of "
        "wider models (zoo.cost_twin); exits: a target trained for early exits (sx) with its exits; "
        "tokenizers: a draft on another tokenizer; tiny: a random family built in a second (smoke tests)",
    )  # fmt: skip
    p.add_argument(
        "--target", help="instead of a scenario: your target, a checkpoint directory (or a zoo name)"
    )
    p.add_argument(
        "--drafts", nargs="+", default=[],
        help="with --target: its drafts, smallest first: checkpoint directories, zoo names or 'exitK' (the "
        "target's first K layers); one may have another tokenizer (default: none; the lookup level is "
        "always a candidate)",
    )  # fmt: skip
    p.add_argument(
        "--text", nargs="+", choices=list(TEXT_SETS), metavar="SET",
        help=f"measure on these text sets found on the machine ({', '.join(TEXT_SETS)}; default: the "
        "scenario's own prompts; with --target, every set the machine has)",
    )  # fmt: skip
    p.add_argument(
        "--prompts", nargs="+", type=Path, metavar="FILE",
        help="measure on your own text files (UTF-8), each a prompt set named by its file name, cut into "
        "64-token prompts and calibration windows (with --text: both)",
    )  # fmt: skip
    p.add_argument(
        "--quick", action="store_true", help="a smoke test: eager, one pass, 2 prompts per set, 32 new tokens"
    )
    p.add_argument("--eager", action="store_true", help="our configurations uncompiled (and no HF compiled)")
    p.add_argument("--batch", type=positive_int, nargs="+", help="batch sizes (default: 1 4 16; --quick: 1)")
    p.add_argument("--do-sample", action="store_true", help="sample (default: greedy)")
    p.add_argument("--temperature", type=positive_float, default=0.8, help="with --do-sample (default 0.8)")
    p.add_argument(
        "--generation-config", choices=sorted(GENERATION_CONFIGS),
        help="sample as a checkpoint's shipped defaults do (instead of --do-sample / --temperature)",
    )  # fmt: skip
    p.add_argument("--max-new-tokens", type=positive_int, help="default 128 (--quick: 32)")
    p.add_argument(
        "--passes", type=positive_int, help="counted passes after the warm-up (default 3; --quick: 1)"
    )
    p.add_argument("--prompts-per-set", type=positive_int, help="default 8 (--quick: 2)")
    p.add_argument("--out", type=output_folder, default="bench/results", help="folder for the result files")
    p.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="profile cache for the selector")
    p.add_argument(
        "--mixed", action="store_true",
        help="serve the prompt sets as one stream of requests, static hierarchies against adaptive ones "
        "(batch default: 1)",
    )  # fmt: skip
    p.add_argument(
        "--profile-only", action="store_true",
        help="measure and cache the selector's step costs and acceptance for every batch, then exit",
    )  # fmt: skip


def check(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Usage errors (``parser.error``) for arguments that cannot work together, before any model is
    loaded: a scenario and your own models at once, drafts without a target, names that are not
    levels, text for a scenario without a tokenizer, text sets or files this machine lacks."""
    from hsd_fast.select_levels import name_errors

    if args.target is None:
        if args.drafts:
            parser.error("--drafts: name their target too (--target)")
    else:
        if args.scenario is not None:
            parser.error(f"--scenario {args.scenario} and --target: a scenario brings its own models")
        errors = name_errors(args.target, args.drafts, flags=("--target", "--drafts"))
        if errors:
            parser.error(errors[0])
        if len(set(args.drafts)) < len(args.drafts):
            parser.error("--drafts: name each draft once")
    if (args.text or args.prompts) and args.scenario == "tiny":
        parser.error("--text/--prompts: the tiny scenario's random models have no tokenizer")
    missing = [name for name in args.text or [] if name not in available()]
    if missing:
        parser.error(f"--text {missing[0]}: no file of it on this machine ({TEXT_SETS[missing[0]].kind})")
    for path in args.prompts or []:
        if not path.is_file():
            parser.error(f"--prompts {path}: no such file")
    names = _set_names(args)
    if len(set(names)) < len(names):
        parser.error("--text/--prompts: two prompt sets of one name (a file is named by its stem)")


def _defaults(args: argparse.Namespace) -> argparse.Namespace:
    """What was not given, by ``--quick``; the values given were checked by their argparse types
    (``cli_args``: bad ones are usage errors, never replaced by a default)."""
    quick = args.quick
    if args.scenario is None:
        args.scenario = "zoo" if args.target is None else "checkpoints"
    args.eager = args.eager or quick
    chosen = {
        "batch": [1] if quick or args.mixed else [1, 4, 16],
        "max_new_tokens": 32 if quick else 128,
        "passes": 1 if quick else 3,
        "prompts_per_set": 2 if quick else 8,
    }
    for name, default in chosen.items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    return args


def run(args: argparse.Namespace) -> int:
    args = _defaults(args)
    scenario = _scenario(args)
    sampling = _sampling(args)
    notes: list[str] = []
    tuning_prompts = scenario.prompt_sets[next(iter(scenario.prompt_sets))][: args.prompts_per_set]

    _check_positions(scenario, args.max_new_tokens)
    print(f"scenario {scenario.name}: {scenario.description}")
    if args.eager:
        notes.append(
            "Eager: our configurations ran uncompiled (and HF's compiled static cache was left out)."
        )
    if not args.eager and not args.profile_only:
        _profile_in_child(args)
    profiles = {batch: _profile(scenario, sampling, args, batch) for batch in dict.fromkeys([1, *args.batch])}
    if args.profile_only:
        print(f"profiles cached in {args.cache}")
        return 0
    if args.mixed:
        return _mixed(scenario, sampling, args, profiles)
    costs, alpha, names, _, through = profiles[1]
    pick = select(costs, alpha, through=through)
    hierarchies = {"selector's pick": (pick, None)}
    extra_sections: list[str] = []
    if not args.quick:
        measured = _grid(scenario, profiles[1], sampling, args, tuning_prompts)
        extra_sections = _selector_check(pick, measured, names)
        hierarchies["grid's best"] = (min(measured, key=measured.get), None)
        for label, kind in _grid_kinds(scenario, names).items():
            of_kind = {s: t for s, t in measured.items() if kind(s.chain)}
            if of_kind:
                hierarchies[label] = (min(of_kind, key=of_kind.get), None)
        notes.append(
            "Grid: chains of one or two drafts (the lookup level only at the bottom) with "
            f"T <= {DEFAULT_MAX_T}, ranked by the latency model; the {GRID_MEASURED} best predicted, and "
            f"the best predicted of each kind ({', '.join(_grid_kinds(scenario, names))}), measured once "
            "each at batch 1 on "
            "the first prompt set; 'grid's best' is the fastest of those, and so on."
        )
    for batch in args.batch:  # after the others: a batch's pick that is one of them runs as that one
        if batch != 1:
            costs_b, alpha_b, _, spread, through_b = profiles[batch]
            batch_pick = select_for_batch(
                costs_b, alpha_b, batch, DEFAULT_MAX_T, args.max_new_tokens, spread, through_b
            )
            hierarchies[f"selector's pick for batch {batch}"] = (batch_pick, (batch,))

    configs = _configs(scenario, sampling, args, hierarchies, names, profiles, tuning_prompts, notes)
    rows = []
    meter = CpuMeter()
    redone = recompiled = 0
    groups = [(batch, name) for batch in args.batch for name in scenario.prompt_sets]
    bar = tqdm(total=len(groups) * args.passes, desc="measuring (counted passes)", unit=" pass")
    for batch, set_name in groups:
        bar.set_postfix_str(f"batch {batch}, {set_name}")
        chosen = [c for c in configs if c.runs_at(batch)]
        work = measuring.batches(scenario.prompt_sets[set_name][: args.prompts_per_set], batch)
        batch_rows, busy, compiling = measuring.measure(
            chosen, work, args, meter, sampling, scenario, bar.update
        )
        redone += busy
        recompiled += compiling
        rows += [{"batch": batch, "prompt_set": set_name, **row} for row in batch_rows]
    bar.close()
    _measured_decode(rows, configs, scenario, sampling, args, tuning_prompts)

    notes += [
        "tokens/s: new tokens of every row over wall time, prefill included, median of the counted passes.",
        f"Passes: 1 warm-up + {args.passes} counted, configurations in rotated order; {redone} passes "
        f"redone because other processes took more than 10% of the CPU"
        + ("" if meter.available else " (not checked: no /proc/stat)")
        + f", {recompiled} because something compiled in them (each configuration is warmed up "
        "until a call compiles nothing).",
        "predicted tokens/s: the latency model's prediction (prefill excluded) from step costs timed at "
        "the table's batch, for all its rows; measured decode tokens/s: the same measured at batch 1 on the "
        "first prompt set (time for N tokens minus time for 1, per token).",
    ]
    device = str(next(scenario.target.parameters()).device)
    meta = run_metadata(
        device, scenario=scenario.name, models=scenario.description, sampling_label=_label(sampling),
        sampling=sampling, compiled=not args.eager,
        dtype=str(next(scenario.target.parameters()).dtype).removeprefix("torch."), batches=args.batch,
        prompts_per_set=args.prompts_per_set, prompt_tokens=_prompt_tokens(scenario),
        max_new_tokens=args.max_new_tokens, passes=args.passes, redone_passes=redone,
        recompiled_passes=recompiled,
    )  # fmt: skip
    stem = args.out / f"e2e_{scenario.name}{_stem_suffix(args)}_{torch.device(device).type}"
    for path in write(stem, meta, rows, notes, extra_sections):
        print(f"wrote {path}")
    different = {r["config"] for r in rows if r.get("same_output") is False and r["family"] == "ours"}
    if different:
        print(f"ERROR: greedy output differs from the target's for {sorted(different)}")
        return 1
    return 0


def _set_names(args: argparse.Namespace) -> list[str]:
    """The prompt sets asked for by name: ``--text`` sets, then ``--prompts`` files by their stems."""
    return [*(args.text or []), *(path.stem for path in args.prompts or [])]


def _scenario(args: argparse.Namespace) -> Scenario:
    """The scenario named, or the user's own models (``--target``), on the text asked for."""
    try:
        if args.target is None:
            scenario = SCENARIOS[args.scenario]()
        else:
            scenario = checkpoints_scenario(args.target, args.drafts)
        sets = [*(args.text or []), *(TextSet.of_file(p) for p in args.prompts or [])]
        if not sets and args.target is not None:
            sets = available()
            if not sets:
                raise ValueError("this machine has none of the text sets: give your own (--prompts FILE)")
        return on_text(scenario, sets, args.prompts_per_set) if sets else scenario
    except ValueError as err:
        raise SystemExit(f"hsd-fast bench: {err}") from None


def _check_positions(scenario: Scenario, max_new_tokens: int) -> None:
    """Refuse, before anything is measured, a run longer than the models' position tables."""
    limit = fewest_positions(m.config for m in [scenario.target, *draft_models(scenario)])
    if limit is None:
        return
    longest = _prompt_tokens(scenario)
    try:
        check_positions(
            longest + max_new_tokens,
            [("models'", limit)],
            asked=f"hsd-fast bench: prompts of up to {longest} tokens + --max-new-tokens {max_new_tokens}",
            remedy=f"use --max-new-tokens <= {limit - longest}",
            form=COMMAND_FORM,
        )
    except ValueError as err:
        raise SystemExit(str(err)) from None


def _prompt_tokens(scenario: Scenario) -> int:
    return max(len(p) for prompts in scenario.prompt_sets.values() for p in prompts)


def _sampling(args: argparse.Namespace) -> dict:
    """The generation options every configuration runs with."""
    if args.generation_config:
        return dict(GENERATION_CONFIGS[args.generation_config])
    return {"do_sample": True, "temperature": args.temperature} if args.do_sample else {"do_sample": False}


def _label(sampling: dict) -> str:
    if not sampling.get("do_sample"):
        return "greedy"
    return ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in sampling.items() if k != "do_sample")


def _mixed(scenario: Scenario, sampling: dict, args: argparse.Namespace, profiles: dict) -> int:
    """``--mixed``: the scenario's prompt sets served as one stream of requests (``mixed.py``), for
    each batch: no draft, the selector's pick and a grid against the adaptive engine."""
    if _bridged(scenario):
        raise SystemExit("hsd-fast bench --mixed: the adaptive engine takes no draft with another tokenizer")
    candidates = {LOOKUP: LOOKUP, **scenario.drafts}
    names = profiles[min(profiles)][2]
    levels = (*_drafts(scenario, names[:-1]), scenario.target)  # the profiles' candidates
    sets = {name: torch.stack(prompts) for name, prompts in scenario.prompt_sets.items()}
    device = str(next(scenario.target.parameters()).device)
    different = False
    for batch in args.batch:
        costs, alpha, _, spread, through = profiles[batch]
        selection = select_for_batch(costs, alpha, batch, DEFAULT_MAX_T, args.max_new_tokens, spread, through)
        profile = Profile.of(levels, costs, alpha, spread, through)
        pick = replace(Hierarchy.bind(selection, levels, batch), profile=profile)
        work = mixed_requests(sets, batch)
        print(
            f"batch {batch}: {len(work)} requests, {len(work) * (args.passes + 1)} with the warm-up, each way"
        )
        result = measure_mixed(
            scenario.target, candidates, pick, mixed_grid(list(scenario.drafts)), work, sampling,
            args.max_new_tokens, args.passes, compile=not args.eager,
        )  # fmt: skip
        meta = run_metadata(
            device, scenario=scenario.name, models=scenario.description, sampling_label=_label(sampling),
            sampling=sampling, compiled=not args.eager, batch=batch,
            requests=f"{len(work)} x {work[0].ids.shape[1]} prompt tokens: "
            + ", ".join(r.group for r in work),
            max_new_tokens=args.max_new_tokens, passes=args.passes, redone_passes=result.redone,
        )  # fmt: skip
        at = "" if batch == 1 else f"_b{batch}"
        stem = args.out / f"e2e_{scenario.name}_mixed{at}{_stem_suffix(args)}_{torch.device(device).type}"
        notes = [
            f"Scenario {scenario.name}: {scenario.description}; batch {batch}. One pass serves every "
            "request in turn; medians of interleaved passes after warm-up. The latency controller keeps "
            "its estimates across requests and passes (as a process serving a stream would).",
        ]
        write_mixed(stem, f"hsd-fast bench --mixed: {scenario.name}, {_label(sampling)}", notes, result, meta)
        print(f"wrote {stem}.md")
        different |= any(r.get("same_output") is False for r in result.rows)
    if different:
        print("ERROR: greedy output differs from no draft's in the mixed scenario")
    return int(different)


def _stem_suffix(args: argparse.Namespace) -> str:
    """What the result files' names add to the scenario's: the text asked for, the sampling."""
    names = _set_names(args)
    text = f"_on_{'-'.join(names)}" if names else ""
    if args.generation_config:
        return f"{text}_{args.generation_config}"
    return text + ("_sampled" if args.do_sample else "")


# ----------------------------------------------------------------------------- choosing hierarchies
def _grid_kinds(scenario: Scenario, names: list[str]) -> dict:
    """GRID_KINDS, and where the scenario has early-exit levels or drafts with another tokenizer, the
    best with and without one."""
    bridged = {i for i, name in enumerate(names) if name in _bridged(scenario)}
    if bridged:
        return GRID_KINDS | {
            "best with another tokenizer": lambda chain: bool(bridged & set(chain)),
            "best without another tokenizer": lambda chain: not bridged & set(chain),
        }
    if not scenario.exits:
        return GRID_KINDS
    reusing = {i for i, name in enumerate(names) if name in scenario.exits}
    exits = reusing | {i for i, name in enumerate(names) if _recomputed_k(scenario, name) is not None}
    kinds = GRID_KINDS | {
        "best single early exit": lambda chain: len(chain) == 2 and chain[0] in exits,
        "best with an early exit": lambda chain: bool(exits & set(chain)),
        "best without an early exit": lambda chain: not exits & set(chain),
    }
    if exits == reusing:  # no twins: the exits' verifiers cannot start from their hidden states
        return kinds
    return kinds | {  # what verifying from its hidden states saves, or costs, both ways measured
        "best single early exit, reused": lambda chain: len(chain) == 2 and chain[0] in reusing,
        "best single early exit, recomputed": lambda chain: len(chain) == 2 and chain[0] in exits - reusing,
    }


class BenchProfile(NamedTuple):
    """What the bench chooses and predicts from at one batch size, over the candidates ``names``."""

    costs: list
    alpha: list[list]
    names: list[str]
    spread: list[list[Spread]] | None  # at batch > 1: how far apart rows accept (row_spread)
    through: Through  # a model's rate on the proposals the model under it passed (latency.chain_rates)


def _profile(scenario: Scenario, sampling: dict, args, batch: int = 1) -> BenchProfile:
    """Compiled step costs at ``batch`` rows and acceptance of the lookup level, the drafts with
    another tokenizer (proposal levels too, profiled by replay) and every model (drafts, then the
    target), cached: candidate 0 is the lookup level, the bridged drafts follow it."""
    cache = ProfileCache(args.cache, fallbacks=_fallback_profiles(scenario))
    bridged = _bridged(scenario)
    models = [*(d for n, d in scenario.drafts.items() if n not in bridged), scenario.target]
    names = [LOOKUP, *bridged, *(n for n in scenario.drafts if n not in bridged), "target"]
    transform, greedy = generation_sampling(scenario.target, **sampling)
    context = _prompt_tokens(scenario) + args.max_new_tokens // 2
    desc = f"step costs{'' if args.eager else ' (compiled)'}, batch {batch}"
    crowds = crowd_bytes(models)
    costs = [
        cache.costs(m, context, not args.eager, transform, greedy, batch, crowd_bytes=crowd)
        for m, crowd in zip(tqdm(models, desc=desc), crowds, strict=True)
    ]
    timing = {"context": context, "compile": not args.eager, "transform": transform, "greedy": greedy}
    costs = cache.with_exit_reuse(models, costs, crowds, **timing, batch=batch)  # exits' verifiers
    run = {"new_tokens": args.max_new_tokens}  # rates on text as long as the runs (profile.run_text)
    measuring = (models, scenario.calibration, transform, greedy)
    if batch > 1:
        alpha, model_spread = cache.acceptance_and_spread(*measuring, generation_kwargs=sampling, **run)
    else:
        alpha, model_spread = cache.acceptance(*measuring, generation_kwargs=sampling, **run), None
    specs = [LookupDraft(), *bridged.values()]  # candidates 0, 1, ...: the proposal levels
    replay = (models, scenario.calibration, transform, greedy, DEFAULT_MAX_T, True, sampling)
    passed_through = {}  # (id(spec), id(m), id(v)) -> v's rate on the proposals m passed
    for at, spec in enumerate(specs):
        rates_through = cache.proposal_through(spec, *replay, **run)  # first: one replay serves both
        passed_through |= keyed_by_ids(spec, models, rates_through)
        level, rates = cache.proposal_level(spec, *replay, batch, compile=not args.eager, **run)
        costs, alpha = with_proposal_level(costs, alpha, at, level, [0.0] * at + list(rates))  # none between
    # at a batch: each proposal level's rows under each model (a batch waits for its slowest row)
    rows = [cache.proposal_rows(spec, *replay, **run) for spec in specs] if batch > 1 else []
    levels = [*specs, *_drafts(scenario, names[len(specs) : -1]), scenario.target]  # the specs replayed
    costs, alpha, levels = with_recomputing_exits(costs, alpha, levels)  # an exit reusing, or not
    by_k = {k: name for name, k in scenario.exits.items()}
    twins = [by_k[exit_of(level)[1]] + RECOMPUTED for level in levels[len(names) - 1 : -1]]
    names = [*names[:-1], *twins, names[-1]]
    cache.save()
    proposal_rows = {id(level): r for level, r in zip(levels[: len(rows)], rows, strict=True)}  # specs first
    spread = None if model_spread is None else spread_over(levels, models, model_spread, proposal_rows)
    return BenchProfile(costs, alpha, names, spread, through_over(levels, passed_through))


def _profile_in_child(args: argparse.Namespace) -> None:
    """Measure what ``_profile`` needs in a child process (``--profile-only``), which fills the
    cache; the bench then reads it. On a CPU every compiled step packs its own copy of the weights,
    and those copies stay with the process after the steps are gone (docs/design.md, "Compiled
    steps"): timing the step costs of a large target at several batch sizes in the bench's own
    process left too little memory for the configurations it then compiles."""
    argv = [sys.executable, "-m", "hsd_fast.bench.command", "--profile-only"]
    if args.target is None:
        argv += ["--scenario", args.scenario]
    else:
        argv += ["--target", args.target] + ["--drafts", *args.drafts] * bool(args.drafts)
    argv += ["--text", *args.text] if args.text else []
    argv += ["--prompts", *map(str, args.prompts)] if args.prompts else []
    argv += ["--prompts-per-set", str(args.prompts_per_set)]
    argv += ["--batch", *map(str, args.batch), "--max-new-tokens", str(args.max_new_tokens)]
    argv += ["--cache", str(args.cache)] + ["--eager"] * args.eager
    argv += ["--do-sample", "--temperature", str(args.temperature)] if args.do_sample else []
    argv += ["--generation-config", args.generation_config] if args.generation_config else []
    child = subprocess.run(argv, check=False)
    if child.returncode != 0:
        raise SystemExit(f"hsd-fast bench: profiling in a child process failed (exit {child.returncode})")


def _drafts(scenario: Scenario, names: Sequence[str]) -> tuple:
    """The draft levels named (a chain's names, the target excluded; an exit's name + ``RECOMPUTED``:
    that exit with its verifier recomputing layers < k)."""
    return tuple(as_lookup(n) or _recomputed_exit(scenario, n) or scenario.drafts[n] for n in names)


def _recomputed_k(scenario: Scenario, name: str) -> int | None:
    """The exit's ``k`` where ``name`` is an exit's name + ``RECOMPUTED``, else None."""
    exit_name = name.removesuffix(RECOMPUTED)
    return scenario.exits.get(exit_name) if exit_name != name else None


def _recomputed_exit(scenario: Scenario, name: str) -> torch.nn.Module | None:
    """``EarlyExit(target, k, reuse=False)`` for an exit's name + ``RECOMPUTED``, else None."""
    k = _recomputed_k(scenario, name)
    return None if k is None else EarlyExit(scenario.target, k, reuse=False)


def _bridged(scenario: Scenario) -> dict[str, OtherTokenizerDraft]:
    """The scenario's drafts with another tokenizer, by name."""
    return {n: d for n, d in scenario.drafts.items() if isinstance(d, OtherTokenizerDraft)}


def _adaptive_profile(scenario: Scenario, profile: BenchProfile) -> BenchProfile:
    """``profile`` without the drafts with another tokenizer (the adaptive engine refuses them) and
    the exits' recomputing twins (it recomputes every exit: they are its exits)."""
    bridged = _bridged(scenario)
    keep = [i for i, n in enumerate(profile.names) if n not in bridged and _recomputed_k(scenario, n) is None]

    def kept(matrix: list[list] | None) -> list[list] | None:
        return None if matrix is None else [[matrix[i][j] for j in keep] for i in keep]

    costs, names = [profile.costs[i] for i in keep], [profile.names[i] for i in keep]
    through = reindexed(profile.through.items(), {i: k for k, i in enumerate(keep)})
    return BenchProfile(costs, kept(profile.alpha), names, kept(profile.spread), through)


def _hf_runs(config: cfg.Config, prompts, draft_name: str, notes: list[str]) -> bool:
    """Whether HF's path for a draft with another tokenizer runs in this setting (its sampled path
    raises on transformers 5.24: noted, not measured)."""
    ids = prompts[0][None]
    try:
        config.generate(ids, torch.ones_like(ids))
    except Exception as err:  # whatever HF raised is the finding
        notes.append(
            f"HF assisted with {draft_name} (assistant_tokenizer=): not measured, it raised "
            f"{type(err).__name__}: {err}"
        )
        return False
    return True


def _fallback_profiles(scenario: Scenario) -> list[Path]:
    if scenario.name != "zoo":
        return []
    from hsd_fast import zoo

    return [zoo.zoo_dir() / "profile_cpu.json"]


def _grid(scenario, profile: BenchProfile, sampling, args, prompts) -> dict[Selection, float]:
    """Measured decode seconds per token (batch 1, prefill excluded) of the grid's best predicted
    hierarchies: every chain of one or two drafts with T up to DEFAULT_MAX_T (candidate 0, the lookup
    level, only at the bottom), ranked by the latency model: its GRID_MEASURED best and the best
    predicted of each of the kinds (``_grid_kinds``)."""
    costs, alpha, names, _, through = profile
    target = len(costs) - 1
    candidates = []
    for size in (1, 2):
        for chain in itertools.combinations(range(target), size):
            if any(level_zero_only(costs[c]) for c in chain[1:]):
                continue  # a proposal level only at the bottom
            for T in itertools.product(range(1, DEFAULT_MAX_T + 1), repeat=size):
                predicted = chain_latency(costs, alpha, (*chain, target), T, through=through)
                candidates.append((predicted, (*chain, target), T))
    candidates.sort()
    shortlist = candidates[:GRID_MEASURED]
    kinds = _grid_kinds(scenario, names).values()
    shortlist += [next(c for c in candidates if kind(c[1])) for kind in kinds]
    measured = {}
    for predicted, chain, T in tqdm(dict.fromkeys(shortlist), desc="grid (measured)"):
        hierarchy = Hierarchy(
            _drafts(scenario, [names[i] for i in chain[:-1]]), T, Selection(chain, T, predicted)
        )
        measured[hierarchy.selection] = _decode_seconds(scenario, hierarchy, sampling, args, prompts)
    return measured


def _decode_seconds(scenario, hierarchy: Hierarchy, sampling, args, prompts) -> float:
    """Seconds per token, batch 1, prefill excluded (``profile.measured_latency``), on 2 prompts."""
    batch = torch.stack(prompts[:2])
    return measured_latency(
        scenario.target, hierarchy, batch, args.max_new_tokens, compile=not args.eager, generate=generate,
        **sampling,
    )  # fmt: skip


def _selector_check(pick: Selection, measured: dict[Selection, float], names: list[str]) -> list[str]:
    """A table: the grid's measured hierarchies, predicted and measured decode tokens/s."""
    rows = []
    for selection, seconds in sorted(measured.items(), key=lambda kv: kv[0].predicted_latency):
        chain = " > ".join(names[i] for i in selection.chain)
        is_pick = (selection.chain, selection.T) == (pick.chain, pick.T)
        rows.append([
            chain + (" (the pick)" if is_pick else ""), list(selection.T), 1 / selection.predicted_latency,
            1 / seconds, seconds / selection.predicted_latency,
        ])  # fmt: skip
    columns = ["hierarchy", "T", "predicted tok/s", "measured tok/s", "measured / predicted latency"]
    title = "## The selector's predictions, measured (batch 1, prefill excluded)"
    return [title, "", *markdown_table(columns, rows), ""]


def _configs(scenario, sampling, args, hierarchies, names, profiles, prompts, notes) -> list[cfg.Config]:
    """The configurations measured. ``hierarchies``: label -> (selection, the batches it runs at or
    None: all); ``profiles``: batch -> its ``BenchProfile`` for the predictions at each batch."""
    n = args.max_new_tokens
    configs = [cfg.hf_generate(scenario.target, sampling, n)]
    if not args.eager:
        configs.append(cfg.hf_compiled(scenario.target, sampling, n))
    for draft_name, draft in scenario.drafts.items():
        if draft_name in scenario.exits or getattr(draft, "below", ()):
            continue  # HF's own early exit below stands for exits; HF has no chain of drafts
        if draft_name in _bridged(scenario) and not _hf_runs(
            cfg.hf_assisted(scenario.target, draft_name, draft, sampling, 2), prompts, draft_name, notes
        ):
            continue
        configs.append(cfg.hf_assisted(scenario.target, draft_name, draft, sampling, n))
        if not args.quick:
            configs.append(_best_fixed_assisted(scenario, draft_name, draft, sampling, n, prompts, notes))
    configs.append(cfg.hf_lookup(scenario.target, sampling, n))
    if scenario.exits:
        configs.append(_best_hf_early_exit(scenario, sampling, n, prompts, notes))
    alone = cfg.ours(scenario.target, scenario.drafts, [], [], sampling, n, not args.eager, "ours, no draft")
    alone.predicted = {batch: decode_seconds(profile.costs[-1]) for batch, profile in profiles.items()}
    configs.append(alone)
    seen = {((), ()): alone}
    levels = dict(zip(names[:-1], _drafts(scenario, names[:-1]), strict=True))  # the profile's, by name
    for label, (selection, batches) in hierarchies.items():
        chain = tuple(names[i] for i in selection.chain[:-1])
        same = seen.get((chain, selection.T))
        if same is not None:
            notes.append(f"{label}: the same hierarchy as {same.name}")
            if same.batches is not None:  # it now runs where this one would have too
                same.batches = None if batches is None else (*same.batches, *batches)
            continue
        config = cfg.ours(scenario.target, levels, chain, selection.T, sampling, n, not args.eager)
        config.name = f"{config.name} ({label})"
        config.batches = batches
        config.predicted = {
            batch: chain_latency(costs, alpha, selection.chain, selection.T, batch, n, spread, through)
            for batch, (costs, alpha, _, spread, through) in profiles.items()
        }
        seen[(chain, selection.T)] = config
        configs.append(config)
    # the adaptive engine, steered by the latency model: one controller per batch, from that batch's
    # profile (its names: the lookup level, the drafts, the target: the candidates in order)
    kept = {batch: _adaptive_profile(scenario, profile) for batch, profile in profiles.items()}
    controls = {
        batch: LatencyController(p.costs, p.alpha, max_T=DEFAULT_MAX_T, spread=p.spread, through=p.through)
        for batch, p in kept.items()
    }
    profiled = kept[min(kept)][2]
    adaptive = cfg.ours_adaptive(
        scenario.target, scenario.drafts, profiled[:-1], sampling, n, not args.eager, controls,
        "latency controller",
    )  # fmt: skip
    configs.append(adaptive)
    return configs


def _best_hf_early_exit(scenario, sampling, n, prompts, notes) -> cfg.Config:
    """HF's ``assistant_early_exit`` at the exit of the scenario's that a tuning pass measures fastest."""
    configs = {k: cfg.hf_early_exit(scenario.target, k, sampling, n) for k in scenario.exits.values()}
    best = _fastest(configs, prompts)
    notes.append(f"HF early exit: layer {best} measured fastest of {list(configs)}.")
    return configs[best]


def _fastest(configs: dict, prompts) -> object:
    """The key of the configuration a tuning pass (batch 1, after one warm-up) measures fastest."""
    timed = {}
    work = measuring.batches(prompts, 1)
    for key, config in configs.items():
        measuring.run_all(config, work)
        start = time.perf_counter()
        measuring.run_all(config, work)
        timed[key] = time.perf_counter() - start
    return min(timed, key=timed.get)


def _best_fixed_assisted(scenario, draft_name, draft, sampling, n, prompts, notes) -> cfg.Config:
    configs = {k: cfg.hf_assisted(scenario.target, draft_name, draft, sampling, n, k) for k in ASSISTED_FIXED}
    best = _fastest(configs, prompts)
    notes.append(
        f"HF assisted with {draft_name}: fixed {best} draft tokens measured fastest of "
        f"{list(ASSISTED_FIXED)}."
    )
    return configs[best]


def _measured_decode(rows, configs, scenario, sampling, args, prompts) -> None:
    """Decode tokens/s of the configurations with a prediction, prefill excluded (batch 1)."""
    if 1 not in args.batch:
        return
    for config in configs:
        if not config.predicted or not config.runs_at(1):
            continue
        hierarchy = Hierarchy(_drafts(scenario, config.chain), config.T, Selection((), (), 0.0))
        seconds = _decode_seconds(scenario, hierarchy, sampling, args, prompts)
        for row in rows:
            if row["config"] == config.name and row["batch"] == 1:
                row["measured_decode_tok_s"] = 1.0 / seconds


def main(argv: list[str] | None = None) -> int:
    """``python -m hsd_fast.bench.command ARGS``: ``hsd-fast bench ARGS`` without the rest of the
    command line; the profiling child (``_profile_in_child``) runs this."""
    parser = argparse.ArgumentParser(prog="hsd-fast bench", description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    check(args, parser)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
