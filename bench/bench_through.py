"""Tokens that came through (docs/design.md, "Tokens that came through"): chains with a model over the
lookup level, measured on the varied-text sets (license prose, C headers, data tables, man pages),
beside the latency model's prediction from the zoo's calibration profile three ways: each pair at
its own rate (before), the middle model's tokens split into the proposals it kept (at the rate the
replay measured for them) and its own, and split three ways (its corrections of the proposals it
rejected apart: what ``select_hierarchy`` uses now). The middle model's tokens are taken in their
place in its blocks (``latency.rates_through``); the committed ``through_twin_cpu`` predates that
and took the kinds' geometric mean (docs/design.md, "Tokens that came through", *In place*).

    python bench/bench_through.py [--passes 2] [--prompts 3]

Target ``s`` as its cost twin (hidden 768, 12 layers, MLP 2048: the same logits, a middle draft
cheap next to it), candidates lookup, ``xxs``, ``xs``; batch 1, greedy, fp32, eager, 96-token
prompts, 128 new tokens. Every configuration serves every prompt in rotated passes after warm-up,
contended passes redone (``hsd_fast.bench.timing``); tok/s per set and over all, and measured /
predicted (the prefill included in the measurement: compare the ratios within a column). The
profile is read from the user's cache (``~/.cache/hsd_fast/profiles.json``), what is missing measured
and kept there. Writes bench/results/through_twin_cpu.{json,md}.
"""

from __future__ import annotations

import argparse
import statistics
import warnings
from dataclasses import replace

import torch
from bench_adaptive import text_sets
from kernel_bench import run_meta, write_results

import hsd_fast
from hsd_fast import zoo
from hsd_fast.bench import command
from hsd_fast.bench.timing import CpuMeter, interleaved
from hsd_fast.hf_generate import generate
from hsd_fast.latency import chain_rates, expected_latency
from hsd_fast.profile import ProfileCache
from hsd_fast.zoo.calibration import read_calibration

NEW_TOKENS = 128
CHAINS = {  # label -> (candidate indices: lookup 0, xxs 1, xs 2, target 3; T)
    "no draft": ((3,), ()),
    "lookup > s T=8": ((0, 3), (8,)),
    "xs > s T=4": ((2, 3), (4,)),
    "lookup > xxs > s T=6,3": ((0, 1, 3), (6, 3)),
    "lookup > xxs > s T=8,8": ((0, 1, 3), (8, 8)),
    "lookup > xs > s T=8,4": ((0, 2, 3), (8, 4)),
    "lookup > xs > s T=8,8": ((0, 2, 3), (8, 8)),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=3, help="prompts per text set")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    torch.set_grad_enabled(False)
    target = zoo.cost_twin(zoo.load("s"), hidden_size=768, num_layers=12, intermediate_size=2048)
    levels = ["lookup", zoo.load("xxs"), zoo.load("xs")]
    calibration = torch.cat([w[:, :128] for w in read_calibration(zoo.zoo_dir()).values()])
    cache = ProfileCache(command.DEFAULT_CACHE, fallbacks=[zoo.zoo_dir() / "profile_cpu.json"])
    pick = hsd_fast.select_hierarchy(
        target, levels, calibration, cache=cache, max_new_tokens=NEW_TOKENS, progress=False, min_gain=0
    )
    costs, alpha, through = pick.profile.costs, pick.profile.alpha, dict(pick.profile.through)
    two_ways = {chain: replace(rates, corrected=None) for chain, rates in through.items()}
    predicted = {}  # label -> [tok/s each way]
    for label, (chain, T) in CHAINS.items():
        predicted[label] = [
            1 / expected_latency([costs[m] for m in chain], chain_rates(costs, alpha, chain, T, way), list(T))
            for way in (None, two_ways, through)
        ]
    sets = {name: p[: args.prompts] for name, p in text_sets(zoo.load_tokenizer(), 96, 1).items()}
    work = [(name, prompt[None]) for name, prompts in sets.items() for prompt in prompts]
    at = {"request": 0}

    def run_of(chain: tuple, T: tuple):
        drafts = [levels[m] for m in chain[:-1]]

        def run() -> None:
            ids = work[at["request"]][1]
            target.generate(
                ids, custom_generate=generate, drafts=drafts, T=list(T), max_new_tokens=NEW_TOKENS,
                do_sample=False, compile=False,
            )  # fmt: skip

        return run

    def next_request(counted: int) -> None:
        at["request"] = (counted + 1) % len(work)

    runs = [run_of(*spec) for spec in CHAINS.values()]
    timings = interleaved(runs, args.passes * len(work), CpuMeter(), on_pass=next_request)
    rows = []
    for label, seconds in zip(CHAINS, timings.seconds, strict=True):
        per_pass = [seconds[k * len(work) : (k + 1) * len(work)] for k in range(args.passes)]
        row = {"hierarchy": label}
        for name in sets:
            index = [i for i, (n, _) in enumerate(work) if n == name]
            secs = statistics.median(sum(p[i] for i in index) for p in per_pass)
            row[f"{name} tok/s"] = round(len(index) * NEW_TOKENS / secs, 1)
        overall = statistics.median(sum(p) for p in per_pass)
        row["all tok/s"] = round(len(work) * NEW_TOKENS / overall, 1)
        before, kept_only, now = predicted[label]
        row |= {
            "predicted, each pair its own rate": round(before, 1),
            "+ kept proposals apart": round(kept_only, 1),
            "+ corrections apart (now)": round(now, 1),
        }
        rows.append(row)
    base = rows[1]["all tok/s"]  # lookup > s: every ratio against it, measured and predicted
    for row, label in zip(rows, CHAINS, strict=True):
        row["measured x lookup > s"] = round(row["all tok/s"] / base, 3)
        for way, key in enumerate(("before", "kept", "now")):
            row[f"predicted x lookup > s, {key}"] = round(
                predicted[label][way] / predicted["lookup > s T=8"][way], 3
            )
    rates = [
        f"({', '.join(['lookup', 'xxs', 'xs', 's'][m] for m in chain)}): kept {r.passed:.2f}, "
        f"corrections {r.corrected if r.corrected is None else round(r.corrected, 2)}"
        for chain, r in sorted(through.items())
        if chain[2] == 3
    ]
    notes = [
        "Target s as its cost twin (hidden 768, 12 layers, MLP 2048; the same logits), candidates lookup, "
        f"xxs, xs (zoo), batch 1, greedy, eager, {args.prompts} prompts of 96 tokens per set, "
        f"{NEW_TOKENS} new tokens; {timings.redone} contended passes redone.",
        "The predictions are from the zoo's calibration profile (not the sets' text), as the selector "
        "makes them; ratios to lookup > s are within one column. The target's rates on what a model "
        "passed of the lookup's proposals, per chain (lookup, model, target): " + "; ".join(rates) + ".",
        "The selector's pick from this profile: "
        + " > ".join(["lookup", "xxs", "xs", "s"][m] for m in pick.selection.chain)
        + f" T={list(pick.T)}.",
    ]
    meta = run_meta("cpu", batch=1, sampling={"do_sample": False}, passes=args.passes, compiled=False)
    write_results("through_twin_cpu", "Tokens that came through", notes, ["hierarchy"], rows, meta)


if __name__ == "__main__":
    main()
