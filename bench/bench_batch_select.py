"""Selecting for the batch: at each batch size B, the selector's pick from step costs timed at B
rows (``select_hierarchy(..., batch=B)``; docs/design.md, "Selecting for a batch") against the
batch-1 pick, our no-draft decoding and any hierarchy named with ``--also``, all run at B rows and
measured side by side, each predicted two ways: the one-row recursion on the B-row costs, and the
engine's loop replayed over B rows (``batch_latency``), which the selector uses.

    python bench/bench_batch_select.py [--batch 1 4 16] [--do-sample] [--passes 3]
        [--also xxs,xs:3,3 lookup,xs:4,3]

The zoo, compiled steps, fp32, the `code` prompts (64 tokens, repeated to fill a batch), 128 new
tokens. Each hierarchy is timed generating 128 tokens and 1 token, all runs interleaved in rotated
passes after warm-up, contended passes redone (``hsd_fast.bench.timing``): decode tokens/s of the
whole batch = B * 127 / (median long - median short), which is what the latency model predicts (the
prefill excluded). The profile cache is a scratch copy of ``zoo/profile_cpu.json`` (or ``--cache``,
kept): the batch-1 costs come from it, the costs at larger batches are timed here (20-30 minutes
per batch on 2 cores, most of it compiling). Writes bench/results/batch_select_cpu[_sampled].{json,md}.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

from kernel_bench import run_meta, write_results

from hsd_fast.batch_latency import chain_latency, select_for_batch
from hsd_fast.bench import command, measuring
from hsd_fast.bench import configs as cfg
from hsd_fast.bench.scenarios import zoo_scenario
from hsd_fast.bench.timing import CpuMeter, interleaved
from hsd_fast.hierarchy_types import DEFAULT_MAX_T

ZOO = Path(__file__).parents[1] / "zoo"
NEW_TOKENS = 128


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--do-sample", action="store_true", help="temperature 0.8 (default: greedy)")
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument(
        "--also",
        nargs="+",
        default=[],
        metavar="DRAFTS:T",
        help="more hierarchies to run: drafts smallest first and their block sizes, e.g. xxs,xs:3,3",
    )
    parser.add_argument(
        "--cache",
        type=Path,
        help="profile cache to use and keep (default: a scratch copy of zoo/profile_cpu.json)",
    )
    args = parser.parse_args()
    sampling = {"do_sample": True, "temperature": 0.8} if args.do_sample else {"do_sample": False}
    scenario = zoo_scenario()
    prompts = scenario.prompt_sets["code"][:4]

    with tempfile.TemporaryDirectory() as scratch:
        cache = args.cache or Path(scratch) / "profile_cpu.json"
        if not cache.exists():
            shutil.copy(ZOO / "profile_cpu.json", cache)
        profile_args = argparse.Namespace(cache=cache, eager=False, max_new_tokens=NEW_TOKENS)
        profiles = {
            b: command._profile(scenario, sampling, profile_args, b) for b in dict.fromkeys([1, *args.batch])
        }
    names = profiles[1][2]
    picks = {
        b: select_for_batch(costs, alpha, b, DEFAULT_MAX_T, NEW_TOKENS, spread)
        for b, (costs, alpha, _, spread) in profiles.items()
    }
    also = [_named(spec, names) for spec in args.also]

    rows, redone, recompiled, meter = [], 0, 0, CpuMeter()
    for batch in args.batch:
        costs, alpha, _, spread = profiles[batch]
        contenders: dict[tuple, list[str]] = {((len(names) - 1,), ()): ["no draft"]}
        for label, b in (("batch-1 pick", 1), (f"batch-{batch} pick", batch)):
            contenders.setdefault((picks[b].chain, picks[b].T), []).append(label)
        for chain, T in also:
            contenders.setdefault((chain, T), []).append("named")
        work = measuring.batches(prompts, batch)[:1]  # one batch of `batch` rows
        print(f"batch {batch}: {len(contenders)} hierarchies, warm-up, {args.passes} passes")
        timings, outputs = _timed(scenario, names, contenders, work, sampling, args.passes, meter)
        redone, recompiled = redone + timings.redone, recompiled + timings.recompiled
        if not args.do_sample:  # greedy: every hierarchy generates the target's own output
            first, *others = ([seq for seq, _ in outputs[key]] for key in contenders)
            for other in others:
                if not all(a.equal(b) for a, b in zip(first, other, strict=True)):
                    raise SystemExit(f"batch {batch}: greedy outputs differ between hierarchies")
        for k, ((chain, T), labels) in enumerate(contenders.items()):
            long, short = (sorted(timings.seconds[2 * k + j])[args.passes // 2] for j in (0, 1))
            predicted = chain_latency(costs, alpha, chain, T, batch, NEW_TOKENS, spread)
            one_row = chain_latency(costs, alpha, chain, T)
            rows.append({
                "batch": batch, "hierarchy": " > ".join(names[i] for i in chain), "T": list(T),
                "role": ", ".join(labels), "predicted_decode_tok_s": round(batch / predicted, 1),
                "one_row_model_decode_tok_s": round(batch / one_row, 1),
                "measured_decode_tok_s": round(batch * (NEW_TOKENS - 1) / (long - short), 1),
                "measured_tok_s": round(batch * NEW_TOKENS / long, 1),
            })  # fmt: skip
    label = "sampled" if args.do_sample else "greedy"
    notes = [
        f"The zoo ({label}), compiled, fp32, 2 CPU threads; prompts: the `code` set's first 4 (64 tokens), "
        f"repeated to fill a batch; {NEW_TOKENS} new tokens.",
        f"{args.passes} counted passes after warm-up, rotated; {redone} redone for load, {recompiled} for "
        "compiling.",
        "predicted / measured decode tok/s: the whole batch's tokens per second, prefill excluded "
        "(the prediction from step costs timed at that batch, by batch_latency: the engine's loop replayed "
        "over the batch's rows).",
        "one_row_model_decode_tok_s: the one-row recursion on the same costs (what the selector used "
        "before batch_latency).",
        "measured tok/s: the same runs with the prefill included.",
    ]
    stem = "batch_select_cpu" + ("_sampled" if args.do_sample else "")
    meta = run_meta("cpu", sampling=sampling, batches=args.batch, passes=args.passes)
    write_results(
        stem, "The selector's pick per batch", notes, ["batch", "hierarchy", "T", "role"], rows, meta
    )


def _named(spec: str, names: list[str]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``"xxs,xs:3,3"`` -> (candidate indices with the target last, block sizes)."""
    drafts, _, sizes = spec.partition(":")
    unknown = [n for n in drafts.split(",") if n not in names[:-1]]
    if unknown:
        raise SystemExit(f"--also {spec}: unknown drafts {unknown}; the candidates are {names[:-1]}")
    chain = (*(names.index(n) for n in drafts.split(",")), len(names) - 1)
    T = tuple(int(t) for t in sizes.split(","))
    if len(T) != len(chain) - 1:
        raise SystemExit(f"--also {spec}: one block size per draft")
    return chain, T


def _timed(scenario, names, contenders, work, sampling, passes, meter):
    """Each contender generating NEW_TOKENS tokens and 1 token (runs 2k and 2k + 1), interleaved;
    and the outputs of the long runs, by (chain, T)."""
    runs, outputs = [], {}
    for chain, T in contenders:
        drafts = [names[i] for i in chain[:-1]]
        for n in (NEW_TOKENS, 1):
            config = cfg.ours(scenario.target, scenario.drafts, drafts, T, sampling, n)

            def run(config=config, key=(chain, T), n=n) -> None:
                out = measuring.run_all(config, work)
                if n == NEW_TOKENS:
                    outputs[key] = out

            runs.append(run)
    return interleaved(runs, passes, meter), outputs


if __name__ == "__main__":
    main()
