"""Early-exit levels (``hsd_fast.EarlyExit``) against the zoo's separate drafts and HF's own
``assistant_early_exit``, on a target trained for exits (zoo ``se``, ``s`` trained on; ``--target sx``
for ``s``'s shape trained from scratch with the exit loss; ``--target s`` for the untrained one).

Ours (one process, interleaved passes after warm-up, ``bench.timing.interleaved``): no draft, each
single level (lookup, xxs, xs, exit 1-3), and chains of two or three; each chain's block sizes are the
latency model's best for it (T <= 6) on the profile ``select_hierarchy`` measured for the candidates,
whose own pick over all of them runs too. ``--twin``: the target's cost twin of the same depth (hidden
768, MLP 2048: ``zoo.cost_twin``, the same logits), where a layer costs what it does in a real model
and the head a smaller share, so an exit costs about k/6 of the target. HF: ``generate`` and
``assistant_early_exit=k`` for each k, which is HF's self-speculation (the same algorithm as our
single exit level: the comparison the issue asks is of speed-ups, ours over our no draft, HF's over
its ``generate``). Greedy outputs are checked equal to the target's own.

    python bench/bench_early_exit.py --cache /tmp/ee.json              # greedy, eager steps
    python bench/bench_early_exit.py --cache /tmp/ee.json --sampled --stem early_exit_cpu_sampled
    python bench/bench_early_exit.py --cache /tmp/ee_twin.json --twin --stem early_exit_twin_cpu
    python bench/bench_early_exit.py --cache /tmp/c.json --twin --compile --few \
        --stem early_exit_twin_compiled_cpu
    python bench/bench_early_exit.py --target sx --cache /tmp/sx.json --stem early_exit_sx_cpu

Writes bench/results/<stem>.{json,md}.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import warnings
from pathlib import Path

import torch
from kernel_bench import run_meta, write_results

import hsd_fast
from hsd_fast import zoo
from hsd_fast.batch_latency import chain_latency
from hsd_fast.bench.text_sets import prompt_set
from hsd_fast.bench.timing import CpuMeter, interleaved
from hsd_fast.lookup import level_identity
from hsd_fast.profile import ProfileCache
from hsd_fast.select_levels import RECOMPUTED
from hsd_fast.zoo.calibration import read_calibration

EXITS = (1, 2, 3)
CHAINS = [  # names, smallest first; the target above
    (), ("lookup",), ("xxs",), ("xs",), ("exit1",), ("exit2",), ("exit3",),
    ("lookup", "xxs"), ("xxs", "xs"), ("lookup", "exit2"), ("xxs", "exit2"), ("xxs", "exit3"),
    ("exit1", "exit3"), ("lookup", "xxs", "exit2"),
]  # fmt: skip
TWIN_NOTE = ", its cost twin: hidden 768, MLP 2048, 6 layers"
FEW = [(), ("lookup",), ("xxs",), ("exit2",), ("exit3",), ("xxs", "exit2"), ("lookup", "exit2")]
COLUMNS = ["config", "tok_s", "x own no-draft", "predicted x own no-draft", "x HF generate"]
VARIED = ("licenses", "man-pages")  # text the zoo never saw (bench.text_sets)


def rank_correlation(a: list[float], b: list[float]) -> float:
    """Spearman's rho: the correlation of the two lists' ranks (ties take their mean rank)."""

    def ranks(values: list[float]) -> list[float]:
        order = sorted(values)
        return [order.index(v) + (order.count(v) - 1) / 2 for v in values]

    return statistics.correlation(ranks(a), ranks(b))


def prompts(tokenizer, prompt_len: int) -> list[tuple[str, torch.Tensor]]:
    """Two held-out zoo prompts (code, prose) and one of each varied set found on this machine."""
    windows = read_calibration(zoo.zoo_dir())
    out = [("code", windows["python-code"][:1, :prompt_len]), ("prose", windows["bible"][:1, :prompt_len])]
    encode = lambda text: tokenizer(text)["input_ids"]  # noqa: E731
    for name in VARIED:
        try:
            out.append((name, prompt_set(name, encode, prompt_len=prompt_len).prompts[:1]))
        except (FileNotFoundError, ValueError):
            continue
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--target", default="se", help="zoo target (default se, trained for exits; sx: from scratch)"
    )
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--sampled", action="store_true", help="temperature 0.8 (default: greedy)")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument(
        "--twin", action="store_true", help="the target's cost twin: hidden 768, MLP 2048, same 6 layers"
    )
    parser.add_argument(
        "--few", action="store_true", help=f"only the chains {FEW} (compiled runs: less to compile)"
    )
    parser.add_argument("--stem", default="early_exit_cpu")
    parser.add_argument("--cache", type=Path, required=True, help="profile cache (a new file: fresh costs)")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    torch.set_grad_enabled(False)
    target = zoo.load(args.target)
    if args.twin:  # the same function at the cost of a wider model of the same depth
        target = zoo.cost_twin(target, hidden_size=768, num_layers=6, intermediate_size=2048)
    levels = {"lookup": "lookup", "xxs": zoo.load("xxs"), "xs": zoo.load("xs")}
    levels |= {f"exit{k}": hsd_fast.EarlyExit(target, k) for k in EXITS}
    # the same exits with the level above recomputing layers < k (the selector adds them as candidates)
    recomputing = {f"exit{k}{RECOMPUTED}": hsd_fast.EarlyExit(target, k, reuse=False) for k in EXITS}
    sampling = {"do_sample": True, "temperature": 0.8} if args.sampled else {"do_sample": False}
    calibration = torch.cat([w[:, :128] for w in read_calibration(zoo.zoo_dir()).values()])
    # a cache of this run's own: the step costs are timed now, on this machine, quiet
    cache = ProfileCache(args.cache, fallbacks=[zoo.zoo_dir() / "profile_cpu.json"])
    pick = hsd_fast.select_hierarchy(
        target, list(levels.values()), calibration, cache=cache, compile=args.compile,
        max_new_tokens=args.max_new_tokens, max_T=6, progress=True, min_gain=0, **sampling,
    )  # fmt: skip
    profile = pick.profile
    index = {level_identity(c): i for i, c in enumerate(profile.candidates)}
    named = levels | recomputing
    position = {name: index[level_identity(level)] for name, level in named.items()}
    top = len(profile.costs) - 1

    def latency(chain: tuple[str, ...], T: tuple[int, ...]) -> float:
        """The latency model's seconds per token for ``chain`` under the target at ``T``."""
        return chain_latency(profile.costs, profile.alpha, (*(position[n] for n in chain), top), T)

    def best_T(chain: tuple[str, ...]) -> tuple[int, ...]:
        return min(itertools.product(range(1, 7), repeat=len(chain)), key=lambda T: latency(chain, T))

    no_draft = latency((), ())
    predicted: dict[str, float] = {}  # our runs: predicted speed-up over our no-draft decoding

    work = prompts(zoo.load_tokenizer(), args.prompt_len)
    common = {**sampling, "max_new_tokens": args.max_new_tokens, "eos_token_id": None, "pad_token_id": 0}
    outputs: dict[str, list] = {}

    def run_of(name: str, hf: bool = False, **kwargs):
        def run() -> None:
            outs = []
            for i, (_, ids) in enumerate(work):
                if hf:
                    outs.append(target.generate(ids, **common, **kwargs))
                else:
                    out = target.generate(
                        ids,
                        custom_generate=hsd_fast.generate,
                        seed=i,
                        compile=args.compile,
                        **common,
                        **kwargs,
                    )
                    outs.append(out)
            outputs[name] = outs

        return run

    runs = {"HF generate": run_of("HF generate", hf=True)}
    for k in EXITS:
        runs[f"HF assistant_early_exit={k}"] = run_of(
            f"HF assistant_early_exit={k}", hf=True, assistant_early_exit=k
        )
    both_ways: list[tuple[str, str]] = []  # (an exit under the target reused, recomputed)
    for chain in FEW if args.few else CHAINS:
        T = best_T(chain) if chain else ()
        name = " > ".join([*chain, args.target]) + (f" T={list(T)}" if chain else " (ours, no draft)")
        runs[name] = run_of(name, drafts=[levels[n] for n in chain], T=list(T))
        predicted[name] = no_draft / latency(chain, T)
        if chain and chain[-1].startswith("exit"):  # the exit under the target, recomputed
            twin = (*chain[:-1], chain[-1] + RECOMPUTED)
            T = best_T(twin)
            both_ways.append((name, " > ".join([*twin, args.target]) + f" T={list(T)}"))
            runs[both_ways[-1][1]] = run_of(both_ways[-1][1], drafts=[named[n] for n in twin], T=list(T))
            predicted[both_ways[-1][1]] = no_draft / latency(twin, T)
    pick_names = [
        next(n for n, lv in named.items() if level_identity(lv) == level_identity(d)) for d in pick.drafts
    ]
    pick_name = "selector's pick: " + " > ".join([*pick_names, args.target]) + f" T={list(pick.T)}"
    runs[pick_name] = run_of(pick_name, hierarchy=pick)
    predicted[pick_name] = no_draft / pick.predicted_latency

    timings = interleaved(list(runs.values()), args.passes, CpuMeter())
    seconds = {name: statistics.median(t) for name, t in zip(runs, timings.seconds, strict=True)}
    ours_alone = next(n for n in runs if n.endswith("(ours, no draft)"))
    reference = outputs["HF generate"]
    rows = []
    for name in runs:
        hf = name.startswith("HF")
        base = seconds["HF generate" if hf else ours_alone]
        row = {
            "config": name,
            "tok_s": round(len(work) * args.max_new_tokens / seconds[name], 1),
            "x own no-draft": round(base / seconds[name], 3),
            "x HF generate": round(seconds["HF generate"] / seconds[name], 3),
        }
        if name in predicted:
            row["predicted x own no-draft"] = round(predicted[name], 3)
        if not args.sampled:
            row["same_output"] = all(torch.equal(a, b) for a, b in zip(outputs[name], reference, strict=True))
        rows.append(row)
    exit_names = {f"exit{k}" for k in EXITS}

    def has_exit(name: str) -> bool:
        return any(part.split(" ")[0] in exit_names for part in name.split(" > "))

    ours = [n for n in runs if not n.startswith("HF") and n != ours_alone]
    with_exit = min((n for n in ours if has_exit(n)), key=seconds.get)
    without = min((n for n in ours if not has_exit(n)), key=seconds.get)
    single_exit = min((n for n in ours if n.count(" > ") == 1 and has_exit(n)), key=seconds.get)
    hf_exit = min((n for n in runs if "early_exit" in n), key=seconds.get)
    notes = [
        f"Target {args.target} (zoo{TWIN_NOTE if args.twin else ''}), batch 1, "
        f"{'compiled' if args.compile else 'eager'} steps; prompts: "
        + ", ".join(s for s, _ in work)
        + f"; {args.max_new_tokens} new tokens each. Medians of {args.passes} interleaved passes after "
        "warm-up "
        f"({timings.redone} redone for foreign CPU load).",
        f"Best with an early exit: {with_exit}; best without: {without}; ratio "
        f"{seconds[without] / seconds[with_exit]:.3f}x.",
        f"Best single exit level: {single_exit}, {seconds[ours_alone] / seconds[single_exit]:.3f}x our "
        "no-draft; "
        f"HF's best early exit: {hf_exit}, {seconds['HF generate'] / seconds[hf_exit]:.3f}x HF generate.",
        "An exit under the target hands it its hidden states (the target runs layers >= k only, "
        "hsd_fast/exit_reuse.py); rows marked (recompute) use EarlyExit(target, k, reuse=False), the "
        "target recomputing layers < k, at their own best T; the selector has both among its candidates "
        "(hierarchy.with_recomputing_exits). Between two exits the upper one always reuses.",
    ]
    # does the latency model tell which way is faster? recomputed over reused speed, predicted and measured
    ways = {a.split(" T=")[0]: (predicted[b] / predicted[a], seconds[a] / seconds[b]) for a, b in both_ways}
    right = sum((p > 1) == (m > 1) for p, m in ways.values())
    notes.append(
        "Reuse or recompute (recomputed / reused speed, predicted vs measured): "
        + "; ".join(f"{chain} {p:.2f} vs {m:.2f}" for chain, (p, m) in ways.items())
        + f". The latency model tells the faster way in {right} of {len(ways)}."
    )
    # does it rank the chains right? (what the selector needs, whatever the machine's pace that day)
    chains = [n for n in ours if n in predicted and not n.startswith("selector")]
    measured = {n: seconds[ours_alone] / seconds[n] for n in chains}  # x our no-draft decoding
    ratios = [measured[n] / predicted[n] for n in chains]
    rho = rank_correlation([predicted[n] for n in chains], [measured[n] for n in chains])
    notes.append(
        f"Predicted against measured speed-up over our no-draft decoding, over our {len(chains)} chains: "
        f"rank correlation (Spearman) {rho:.2f}; measured / predicted median {statistics.median(ratios):.2f}"
        f" (range {min(ratios):.2f}-{max(ratios):.2f})."
    )
    meta = run_meta(
        "cpu", batch=1, dtype="float32", sampling=sampling, compiled=args.compile,
        threads=torch.get_num_threads(), target=args.target + (" (cost twin)" if args.twin else ""),
        max_new_tokens=args.max_new_tokens,
        passes=args.passes, redone=timings.redone,
    )  # fmt: skip
    write_results(args.stem, f"Early-exit levels, target {args.target}", notes, COLUMNS, rows, meta)


if __name__ == "__main__":
    main()
