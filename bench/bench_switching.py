"""What switching hierarchies costs, and what the built-in policy earns, on the zoo.

Target s; candidates the lookup level, xxs and xs; batch 1, greedy; prompts from the machine's own
varied text (``hsd_fast.bench.text_sets``) and the zoo's calibration. Side by side in interleaved
passes after warm-up (``bench.timing.interleaved``), the same prompts for every configuration:

- fixed hierarchies H (``adapt=False``): no draft, ``xxs > s``, ``lookup > s``, ``lookup > xxs > s``;
- ``H, looked at``: the adaptive engine with a policy that always returns H: every round ends at a
  barrier, the policy looks, a new epoch starts, the ledger is reconfigured; the difference to H is
  the cost of looking, per round;
- ``H <-> H'``: a policy alternating two hierarchies every round: against the mean of H and H' fixed,
  the cost of a switch (reconfiguration and catch-up) per switch;
- the built-in policy (``adapt=True``).

Also per switch, from ``HSDStats.hierarchies``: the host's reconfiguration time and the committed
tokens the joining levels fed to catch up. The outputs of every configuration are checked equal.

    python bench/bench_switching.py                  # eager steps, 96 new tokens
    python bench/bench_switching.py --compile        # compiled steps (first run compiles, minutes)

Writes bench/results/switching_cpu[_compiled].{json,md}.
"""

from __future__ import annotations

import argparse
import statistics
import warnings

import torch
from kernel_bench import run_meta, write_results

import hsd_fast
from hsd_fast import zoo
from hsd_fast.bench.text_sets import prompt_set
from hsd_fast.bench.timing import CpuMeter, interleaved
from hsd_fast.switching_types import Choice
from hsd_fast.zoo.calibration import read_calibration

CANDIDATES = ("lookup", "xxs", "xs")
COLUMNS = (
    "config", "tok_s", "x_no_draft", "same_output", "rounds", "switches", "look_ms_per_round",
    "switch_ms_each", "switch_host_ms", "catch_up_tokens_per_switch",
)  # fmt: skip
FIXED = {"no draft": Choice(), "xxs > s": Choice((1,), (4,)), "lookup > s": Choice((0,), (6,))}
FIXED["lookup > xxs > s"] = Choice((0, 1), (6, 3))
PAIRS = [("xxs > s", "lookup > s"), ("no draft", "xxs > s"), ("lookup > s", "lookup > xxs > s")]


def prompts(tokenizer, prompt_len: int) -> list[torch.Tensor]:
    """One prompt from each varied-text set found on this machine, and two of the zoo's."""
    encode = lambda text: tokenizer(text)["input_ids"]  # noqa: E731
    out = []
    for name in ("licenses", "c-headers", "tables", "man-pages"):
        try:
            found = prompt_set(name, encode, prompt_len=prompt_len)
        except (FileNotFoundError, ValueError):
            continue
        out.append(found.prompts[:1])
    windows = list(read_calibration(zoo.zoo_dir()).values())  # per source, [N, L] windows of the zoo's corpus
    out += [w[:1, :prompt_len] for w in windows[:2]]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--compile", action="store_true")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    torch.set_grad_enabled(False)
    target = zoo.load("s")
    models = {n: zoo.load(n) for n in CANDIDATES if n != "lookup"}
    candidates = ["lookup" if n == "lookup" else models[n] for n in CANDIDATES]
    work = prompts(zoo.load_tokenizer(), args.prompt_len)
    common = {
        "do_sample": False,
        "max_new_tokens": args.max_new_tokens,
        "eos_token_id": None,
        "compile": args.compile,
    }
    outputs: dict[str, list] = {}
    stats: dict[str, list] = {}

    def run_of(name: str, **kwargs):
        def run() -> None:
            outs, st = [], []
            for ids in work:
                out = target.generate(
                    ids, custom_generate=hsd_fast.generate, output_hsd_stats=True, **common, **kwargs
                )
                outs.append(out.sequences)
                st.append(out.hsd_stats)
            outputs[name], stats[name] = outs, st

        return run

    runs = {}
    for name, choice in FIXED.items():
        drafts = [candidates[i] for i in choice.drafts]
        runs[name] = run_of(name, drafts=drafts, T=list(choice.T))
        runs[f"{name}, looked at"] = run_of(
            f"{name}, looked at", drafts=candidates, adapt=lambda seen, c=choice: c
        )
    for a, b in PAIRS:
        pair = (FIXED[a], FIXED[b])
        runs[f"{a} <-> {b}"] = run_of(
            f"{a} <-> {b}", drafts=candidates, adapt=lambda s, p=pair: p[s.round % 2]
        )
    runs["built-in policy"] = run_of("built-in policy", drafts=candidates, adapt=True)

    timings = interleaved(list(runs.values()), args.passes, CpuMeter())
    seconds = {name: statistics.median(t) for name, t in zip(runs, timings.seconds, strict=True)}
    reference = outputs["no draft"]
    tokens = len(work) * args.max_new_tokens
    rows = []
    for name in runs:
        same = all(torch.equal(a, b) for a, b in zip(outputs[name], reference, strict=True))
        used = [u for st in stats[name] for u in st.hierarchies]
        switches = [u for u in used if u.from_round > 0]
        rounds = sum(u.rounds for u in used)
        row = dict.fromkeys(COLUMNS) | {
            "config": name,
            "tok_s": round(tokens / seconds[name], 1),
            "x_no_draft": round(seconds["no draft"] / seconds[name], 3),
            "same_output": same,
            "rounds": rounds if used else None,
            "switches": len(switches) if used else None,
            "switch_host_ms": round(1e3 * statistics.median(u.switch_seconds for u in switches), 3)
            if switches
            else None,
            "catch_up_tokens_per_switch": round(statistics.mean(u.catch_up_tokens for u in switches), 1)
            if switches
            else None,
        }
        if name.endswith(", looked at"):
            base = name.removesuffix(", looked at")
            row["look_ms_per_round"] = round(1e3 * (seconds[name] - seconds[base]) / max(rounds, 1), 3)
        if "<->" in name:
            a, b = name.split(" <-> ")
            mean_fixed = (seconds[a] + seconds[b]) / 2
            row["switch_ms_each"] = round(1e3 * (seconds[name] - mean_fixed) / max(len(switches), 1), 3)
        rows.append(row)
    meta = run_meta(
        "cpu", batch=1, dtype="float32", sampling="greedy", compiled=args.compile,
        threads=torch.get_num_threads(),
        prompts=f"{len(work)} x {args.prompt_len} tokens (varied-text sets found here + 2 zoo windows)",
        max_new_tokens=args.max_new_tokens, passes=args.passes, redone=timings.redone,
    )  # fmt: skip
    notes = [
        "Target s, candidates lookup, xxs, xs (zoo), batch 1, greedy. Medians of interleaved passes "
        "after warm-up.",
        "`H, looked at`: an adaptive run whose policy always returns H (a barrier, a look, a new epoch "
        "and a reconfiguration every round): `look_ms_per_round` is its extra time over H fixed, per "
        "round.",
        "`H <-> H'`: alternating every round: `switch_ms_each` is its extra time over the mean of H and "
        "H' fixed, per switch (reconfiguration, catch-up forwards, and the rounds the alternation "
        "itself makes shorter or longer: an estimate). `switch_host_ms`: the host's part, measured "
        "inside the run (policy, epoch, ledger, steps looked up).",
    ]
    stem = "switching_cpu_compiled" if args.compile else "switching_cpu"
    write_results(
        stem, "Switching hierarchies on the zoo", notes, ["config", "tok_s", "x_no_draft"], rows, meta
    )


if __name__ == "__main__":
    main()
