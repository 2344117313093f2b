"""How deep the lookup level's blocks should go: ``lookup > s`` at block sizes past ``DEFAULT_MAX_T``
(docs/design.md §10.4, *A tree of lookups*: deeper blocks verify 1.11-1.41x the tokens per target
forward at T=16 than at T=8 on the varied text, replayed). Measured here end to end, greedy, batch 1:
each prompt of a set decoded at every T in turn (the order reversed on the second pass), after a
warm-up call per T; tokens/s per set, the median over prompts and passes, and the ratio to T=7 (the
zoo's pick). Every T must give the same tokens (checked). Beside each measured ratio, the latency
model's prediction for the set (profiled on its calibration windows, costs timed here), as the
selector prices it (the lookup replayed at each T) and as one replay at the largest T priced it
before (docs/design.md §10.4, *Rates at each block size*).

    python bench/bench_lookup_depth.py                      # zoo s, eager, the varied text sets
    python bench/bench_lookup_depth.py --compile            # compiled steps
    python bench/bench_lookup_depth.py --twin --sets zoo    # s as its cost twin, the zoo's own sets

Writes bench/results/lookup_depth[_twin]_<sets>_cpu[_compiled].{json,md}.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import torch
from bench_adaptive import TWIN_NOTE, text_sets
from kernel_bench import run_meta, write_results

import hsd_fast
from hsd_fast import zoo
from hsd_fast.bench.scenarios import zoo_scenario
from hsd_fast.bench.text_sets import prompt_set
from hsd_fast.latency import expected_latency
from hsd_fast.profile import ProfileCache
from hsd_fast.zoo.calibration import read_calibration

NEW_TOKENS = 128


def calibrations(name: str, sets: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """What the selector profiles on for each set: a varied set's own calibration windows (disjoint
    from its prompts), or for the zoo's sets the zoo's calibration (as the demo does)."""
    if name == "zoo":
        whole = torch.cat(list(read_calibration(zoo.zoo_dir()).values()))
        return dict.fromkeys(sets, whole)
    encode = lambda text: zoo.load_tokenizer()(text)["input_ids"]  # noqa: E731
    return {set_name: prompt_set(set_name, encode).calibration for set_name in sets}


def predicted_ratios(
    target: torch.nn.Module, calibration: torch.Tensor, Ts: list[int], compile: bool, cache: ProfileCache
) -> tuple[dict[int, float], dict[int, float]]:
    """The latency model's tokens/s at each T over the first, for ``lookup > target`` profiled on
    ``calibration``: with the lookup replayed at each T (as the selector prices it), and as before,
    every T priced from one replay at the largest."""
    pick = hsd_fast.select_hierarchy(
        target, ["lookup"], calibration, context=128, cache=cache, compile=compile, max_T=max(Ts),
        max_new_tokens=NEW_TOKENS, progress=False,
    )  # fmt: skip
    costs, rate = list(pick.profile.costs), pick.profile.alpha[0][1]
    own = {T: expected_latency(costs, [rate], [T]) for T in Ts}
    one_replay = {T: expected_latency(costs, [tuple(rate)], [T]) for T in Ts}
    return ({T: own[Ts[0]] / own[T] for T in Ts}, {T: one_replay[Ts[0]] / one_replay[T] for T in Ts})


def prompt_sets(name: str) -> dict[str, torch.Tensor]:
    """``varied``: 3 prompts of 64 tokens of each text set this machine has; ``zoo``: the zoo
    scenario's code, prose and repetitive prompts."""
    if name == "zoo":
        return {k: torch.stack(v) for k, v in zoo_scenario().prompt_sets.items()}
    return text_sets(zoo.load_tokenizer(), 64, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--T", type=int, nargs="+", default=[7, 11, 15], help="the first is the 1.00x")
    parser.add_argument("--sets", choices=["varied", "zoo"], default="varied")
    parser.add_argument("--twin", action="store_true", help="s as its cost twin (hidden 768, 12 layers)")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--passes", type=int, default=2)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    torch.set_grad_enabled(False)
    target = zoo.load("s")
    if args.twin:
        target = zoo.cost_twin(target, hidden_size=768, num_layers=12, intermediate_size=2048)
    sets = prompt_sets(args.sets)

    def decode(prompt: torch.Tensor, T: int) -> tuple[float, torch.Tensor]:
        started = time.perf_counter()
        out = target.generate(
            prompt[None], custom_generate=hsd_fast.generate, drafts=["lookup"], T=[T],
            max_new_tokens=NEW_TOKENS, do_sample=False, compile=args.compile,
        )  # fmt: skip
        return time.perf_counter() - started, out

    for T in args.T:  # warm-up (compiling where asked: twice, as ``compile`` waits for a shape's reuse)
        for _ in range(1 + args.compile):
            decode(next(iter(sets.values()))[0], T)
    speeds: dict[str, dict[int, list[float]]] = {name: {T: [] for T in args.T} for name in sets}
    outputs: dict[tuple[str, int], torch.Tensor] = {}
    for order in range(args.passes):
        for name, prompts in sets.items():
            for i, prompt in enumerate(prompts):
                for T in args.T if order % 2 == 0 else args.T[::-1]:
                    seconds, out = decode(prompt, T)
                    speeds[name][T].append(NEW_TOKENS / seconds)
                    first = outputs.setdefault((name, i), out)
                    assert torch.equal(first, out), f"{name} prompt {i}: T={T} decoded other tokens"
    rows = []
    with tempfile.TemporaryDirectory() as scratch:  # costs timed on this machine, kept for the run
        cache = ProfileCache(
            Path(scratch) / "profile.json",
            fallbacks=[zoo.zoo_dir() / f"profile{'_twin' * args.twin}_cpu.json"],
        )
        for (name, by_T), calibration in zip(
            speeds.items(), calibrations(args.sets, sets).values(), strict=True
        ):
            median = {T: statistics.median(v) for T, v in by_T.items()}
            own, one_replay = predicted_ratios(target, calibration, args.T, args.compile, cache)
            row = {"set": name}
            for T in args.T:
                row[f"T={T} tok/s"] = round(median[T], 1)
                row[f"T={T} x T={args.T[0]}"] = round(median[T] / median[args.T[0]], 2)
            for T in args.T[1:]:
                row[f"T={T} predicted"] = round(own[T], 2)
                row[f"T={T} predicted, one replay"] = round(one_replay[T], 2)
            rows.append(row)
            print(row, flush=True)
    notes = [
        f"Target s{TWIN_NOTE if args.twin else ''}, `drafts=['lookup']`, greedy, batch 1, {NEW_TOKENS} new "
        f"tokens, {'compiled' if args.compile else 'eager'}; {args.passes} passes, each prompt at every T "
        "in turn (reversed on odd passes), after a warm-up; medians over prompts and passes. Every T "
        "decoded the same tokens.",
        f"Predicted: the latency model's tokens/s at T over T={args.T[0]} for `lookup > s`, profiled on the "
        "set's calibration windows (the zoo's sets: the zoo's calibration) with costs timed here; "
        "'one replay': every T priced from the lookup's replay at the largest T, as before the "
        "replays at each block size (docs/design.md, *Rates at each block size*).",
    ]
    meta = run_meta("cpu", batch=1, dtype="float32", compiled=args.compile, sets=args.sets)
    meta["passes"] = args.passes
    stem = f"lookup_depth{'_twin' * args.twin}_{args.sets}_cpu{'_compiled' * args.compile}"
    write_results(stem, "The lookup level's block size past 8", notes, ["set"], rows, meta)


if __name__ == "__main__":
    main()
