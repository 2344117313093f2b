"""What a checkpoint's own sampling defaults cost: Qwen2.5-Instruct's (temperature 0.7, top-p 0.8,
top-k 20, repetition penalty 1.05) against the same without the penalty, with an n-gram ban
(``no_repeat_ngram_size``) on top, and with bad words, a sequence bias and the length processors
(``min_new_tokens``, ``begin_suppress_tokens``, an exponential length decay) on top of that, all
compiled with the steps, on the zoo.

Ours (one process, interleaved passes after warm-up, ``bench.timing.interleaved``): no draft and
``xxs > s`` T=3, compiled steps, at batch 1 and 4; HF ``generate`` with the same settings beside
them. Prompts: held-out zoo text, code and prose in turn.

    python bench/bench_processors.py [--batch 1 4] [--passes 3] [--new-tokens 128] [--stem processors_cpu]

Writes bench/results/processors_cpu.{json,md}.
"""

from __future__ import annotations

import argparse
import statistics

import torch
from kernel_bench import run_meta, write_results

from hsd_fast import zoo
from hsd_fast.bench import configs
from hsd_fast.bench.timing import CpuMeter, interleaved
from hsd_fast.zoo.calibration import read_calibration

RARE = 8191  # an id the zoo's models almost never emit
QWEN = {"do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20}
SETTINGS = {
    "Qwen sampling, no penalty": QWEN,
    "Qwen sampling (repetition_penalty 1.05)": {**QWEN, "repetition_penalty": 1.05},
    "... and no_repeat_ngram_size 4": {
        **QWEN, "repetition_penalty": 1.05, "no_repeat_ngram_size": 4,
    },
    "... and bad words, sequence bias, length processors": {
        **QWEN, "repetition_penalty": 1.05, "no_repeat_ngram_size": 4,
        "bad_words_ids": [[17], [100, 101], [2000, 2001, 2002]],
        "sequence_bias": {(50,): -1.0, (60, 61): 2.0},
        "min_new_tokens": 16, "begin_suppress_tokens": [0], "exponential_decay_length_penalty": (64, 1.001),
        "eos_token_id": RARE,  # the length processors need an EOS; a rare one lets rows run to the end
    },
}  # fmt: skip
HIERARCHIES = {"no draft": ((), []), "xxs > s T=3": (("xxs",), [3])}


def prompt_batch(batch: int, length: int) -> torch.Tensor:
    """``batch`` held-out windows, code and prose in turn, ``length`` tokens each."""
    windows = read_calibration(zoo.zoo_dir())
    sources = [windows["python-code"], windows["bible"]]
    return torch.stack([sources[i % 2][i // 2, :length] for i in range(batch)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--stem", default="processors_cpu")
    args = parser.parse_args()
    torch.manual_seed(0)
    target, drafts = zoo.load("s"), {"xxs": zoo.load("xxs")}
    rows = []
    for batch in args.batch:
        ids = prompt_batch(batch, args.prompt_len)
        mask = torch.ones_like(ids)
        runs, names = [], []
        for setting, sampling in SETTINGS.items():
            named = [("HF generate", configs.hf_generate(target, sampling, args.new_tokens))]
            for label, (chain, T) in HIERARCHIES.items():
                named.append(
                    (f"ours, {label}", configs.ours(target, drafts, chain, T, sampling, args.new_tokens))
                )
            for label, config in named:
                names.append((setting, label))
                runs.append(lambda config=config, ids=ids, mask=mask: config.generate(ids, mask))
        timings = interleaved(runs, args.passes, CpuMeter())
        medians = [statistics.median(s) for s in timings.seconds]
        for (setting, label), seconds in zip(names, medians, strict=True):
            base = medians[names.index(("Qwen sampling, no penalty", label))]
            rows.append({
                "batch": batch, "setting": setting, "config": label,
                "tok_s": batch * args.new_tokens / seconds, "x_without_penalty": base / seconds,
                "redone": timings.redone, "recompiled": timings.recompiled,
            })  # fmt: skip
            print(rows[-1], flush=True)
    notes = [
        "Sampled, compiled steps; `x_without_penalty`: against the same configuration with Qwen's "
        "sampling and no penalty (1.00 on those rows). HF `generate` runs eagerly, as users call it.",
    ]
    meta = run_meta(
        "cpu", models="zoo s (target), xxs (draft), fp32", new_tokens=args.new_tokens, passes=args.passes,
        prompts=f"{args.prompt_len} tokens, held-out code and prose in turn",
    )  # fmt: skip
    write_results(
        args.stem, "A checkpoint's sampling defaults", notes, ["batch", "setting", "config"], rows, meta
    )


if __name__ == "__main__":
    main()
