"""The adaptive engine against static hierarchies on a mixed stream of requests (issue 41's mixed
scenario, on the zoo).

One process serves a sequence of requests taken in turn from the varied-text sets this machine has
(``hsd_fast.bench.text_sets``: license prose, C headers, data tables, man pages) and from prompts that
switch register half-way (half of one set's prompt, then half of another's), ``--max-new-tokens``
each, greedy or sampled. Static configurations keep one hierarchy for the whole sequence: no draft,
the selector's pick (``select_hierarchy`` on the zoo's calibration, compiled or eager as the run), and
each configuration of a small grid; adaptive ones choose per round: the built-in policy
(``adapt=True``) and the latency controller started from the pick's profile
(``adapt=True, hierarchy=pick``), which keeps what it learns across the requests (greedy: also
without its probes of idle candidates). Side by side in
interleaved passes after warm-up (``bench.timing.interleaved``); greedy outputs are checked equal.

    python bench/bench_adaptive.py                          # greedy, eager steps
    python bench/bench_adaptive.py --sampled --stem adaptive_cpu_sampled
    python bench/bench_adaptive.py --twin --max-new-tokens 128 --stem adaptive_twin_cpu
    python bench/bench_adaptive.py --batch 16 --max-new-tokens 64 --stem adaptive_b16_cpu

Writes bench/results/<stem>.{json,md}: tokens/s over the whole sequence and per set, and the ratios
to the static pick and to the best static configuration.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch
from kernel_bench import run_meta, write_results

import hsd_fast
from hsd_fast import zoo
from hsd_fast.bench.text_sets import prompt_set
from hsd_fast.bench.timing import CpuMeter, interleaved
from hsd_fast.controller import LatencyController
from hsd_fast.profile import ProfileCache
from hsd_fast.zoo.calibration import read_calibration

TWIN_NOTE = " as its cost twin (hidden 768, 12 layers, MLP 2048; the same logits)"
SETS = ("licenses", "c-headers", "tables", "man-pages")
GRID = {"lookup > s T=6": (["lookup"], [6]), "xxs > s T=4": (["xxs"], [4]), "xs > s T=4": (["xs"], [4])}
GRID["lookup > xxs > s T=6,3"] = (["lookup", "xxs"], [6, 3])


def requests(tokenizer, prompt_len: int, batch: int = 1) -> list[tuple[str, torch.Tensor]]:
    """(set, prompts [batch, prompt_len]) in turn from every set found here, then the register
    switches."""
    encode = lambda text: tokenizer(text)["input_ids"]  # noqa: E731
    found = {}
    for name in SETS:
        try:
            found[name] = prompt_set(name, encode, prompt_len=prompt_len, prompts=3 * batch).prompts
        except (FileNotFoundError, ValueError):
            continue
    names = list(found)
    out = [(name, found[name][i * batch : (i + 1) * batch]) for i in range(2) for name in names]
    half, last = prompt_len // 2, slice(2 * batch, 3 * batch)
    for a, b in zip(names, names[1:] + names[:1], strict=True):  # one set's prompt, then another's
        mixed = torch.cat([found[a][last, :half], found[b][last, half:]], 1)
        out.append((f"{a} > {b}", mixed))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--sampled", action="store_true", help="temperature 0.8 (default: greedy)")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--batch", type=int, default=1, help="rows per request (prompts of one set)")
    parser.add_argument(
        "--max-T", type=int, default=8, help="the largest block size of the pick (the controller: 8)"
    )
    parser.add_argument(
        "--twin", action="store_true", help="s as its cost twin (hidden 768, 12 layers, MLP 2048)"
    )
    parser.add_argument("--stem", default="adaptive_cpu")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    torch.set_grad_enabled(False)
    target = zoo.load("s")
    if args.twin:  # the cost of a larger target, the same tokens and acceptance
        target = zoo.cost_twin(target, hidden_size=768, num_layers=12, intermediate_size=2048)
    models = {n: zoo.load(n) for n in ("xxs", "xs")}
    candidates = ["lookup", models["xxs"], models["xs"]]
    sampling = {"do_sample": True, "temperature": 0.8} if args.sampled else {"do_sample": False}
    calibration = torch.cat([w[:, :128] for w in read_calibration(zoo.zoo_dir()).values()])
    cache = ProfileCache(fallbacks=[zoo.zoo_dir() / "profile_cpu.json"])
    pick = hsd_fast.select_hierarchy(
        target, candidates, calibration, cache=cache, compile=args.compile,
        max_new_tokens=args.max_new_tokens, max_T=args.max_T, progress=False, batch=args.batch, **sampling,
    )  # fmt: skip
    work = requests(zoo.load_tokenizer(), args.prompt_len, args.batch)
    common = {
        **sampling,
        "max_new_tokens": args.max_new_tokens,
        "eos_token_id": None,
        "compile": args.compile,
    }
    outputs: dict[str, list] = {}
    seconds_of: dict[str, list[float]] = {}
    looks: dict[str, float] = {}  # an adaptive run's share of wall time spent looking (policy included)
    probes: dict[str, float] = {}  # of which probing idle candidates

    def run_of(name: str, **kwargs):
        def run() -> None:
            outs, secs, looked, probed = [], [], 0.0, 0.0
            for i, (_, ids) in enumerate(work):
                start = time.perf_counter()
                out = target.generate(
                    ids, custom_generate=hsd_fast.generate, seed=i, output_hsd_stats=True, **common, **kwargs
                )
                secs.append(time.perf_counter() - start)
                outs.append(out.sequences)
                looked += out.hsd_stats.look_seconds
                probed += out.hsd_stats.probe_seconds
            outputs[name], seconds_of[name], looks[name] = outs, secs, looked / sum(secs)
            probes[name] = probed / sum(secs)

        return run

    pick_label = (
        "static pick: "
        + " > ".join(
            [
                *("lookup" if isinstance(d, hsd_fast.LookupDraft) else _name(d, models) for d in pick.drafts),
                "s",
            ]
        )
        + f" T={list(pick.T)}"
    )
    runs = {"no draft": run_of("no draft"), pick_label: run_of(pick_label, hierarchy=pick)}
    for label, (chain, T) in GRID.items():
        drafts = [d if d == "lookup" else models[d] for d in chain]
        runs[label] = run_of(label, drafts=drafts, T=T)
    runs["adaptive, built-in policy"] = run_of("adaptive, built-in policy", drafts=candidates, adapt=True)
    runs["adaptive, latency controller"] = run_of(
        "adaptive, latency controller", drafts=candidates, adapt=True, hierarchy=pick
    )
    if not args.sampled:  # probes serve greedy runs only: the same controller without them
        levels = [hsd_fast.LookupDraft() if c == "lookup" else c for c in candidates]
        unprobed = LatencyController.from_hierarchy(pick, levels, probe_share=0.0)
        runs["adaptive, latency controller, no probes"] = run_of(
            "adaptive, latency controller, no probes", drafts=candidates, adapt=unprobed, hierarchy=pick
        )

    per_pass: dict[str, list[list[float]]] = {name: [] for name in runs}

    def record(_pass: int) -> None:
        for name in runs:
            per_pass[name].append(list(seconds_of[name]))

    timings = interleaved(list(runs.values()), args.passes, CpuMeter(), on_pass=record)
    total = {name: statistics.median(t) for name, t in zip(runs, timings.seconds, strict=True)}
    tokens = len(work) * args.max_new_tokens * args.batch
    groups = sorted({_group(s) for s, _ in work})
    static = [n for n in runs if not n.startswith("adaptive")]
    best_static = min(static, key=total.get)
    rows = []
    for name in runs:
        row = {
            "config": name,
            "tok_s": round(tokens / total[name], 1),
            "x_static_pick": round(total[pick_label] / total[name], 3),
            "x_best_static": round(total[best_static] / total[name], 3),
            "x_no_draft": round(total["no draft"] / total[name], 3),
            "look_share": round(looks[name], 4) if name.startswith("adaptive") else None,
            "probe_share": round(probes[name], 4) if name.startswith("adaptive") else None,
        }
        for group in groups:
            index = [i for i, (s, _) in enumerate(work) if _group(s) == group]
            secs = statistics.median(sum(p[i] for i in index) for p in per_pass[name])
            row[f"{group} tok_s"] = round(len(index) * args.max_new_tokens * args.batch / secs, 1)
        if not args.sampled:
            row["same_output"] = all(
                torch.equal(a, b) for a, b in zip(outputs[name], outputs["no draft"], strict=True)
            )
        rows.append(row)
    meta = run_meta(
        "cpu", batch=args.batch, dtype="float32", sampling=sampling, compiled=args.compile,
        threads=torch.get_num_threads(),
        requests=f"{len(work)} x {args.prompt_len} prompt tokens: " + ", ".join(s for s, _ in work),
        max_new_tokens=args.max_new_tokens, passes=args.passes, redone=timings.redone,
    )  # fmt: skip
    notes = [
        f"Target s{TWIN_NOTE if args.twin else ''}, candidates lookup, xxs, xs (zoo), batch {args.batch}. "
        "One pass serves every request in turn; "
        "medians of interleaved passes after warm-up. The latency controller keeps its estimates "
        "across requests and passes (as a process serving a stream would).",
        f"Best static configuration over the whole sequence: {best_static}.",
    ]
    title = "Adaptive against static hierarchies, mixed requests"
    write_results(args.stem, title, notes, ["config", "tok_s"], rows, meta)


def _group(name: str) -> str:
    return "register switches" if ">" in name else name


def _name(model, models: dict) -> str:
    return next(n for n, m in models.items() if m is model)


if __name__ == "__main__":
    main()
