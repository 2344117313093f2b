"""The demo's own prompt (``hsd-fast demo``: a Python function header the zoo continues into repetitive
text), side by side in one process: HF ``generate``, our no-draft decoding, the demo's pick over the
lookup level and the zoo's drafts (``lookup > s`` T=8 with the committed profile) and the pick it made
before the lookup level was offered (``xxs > s`` T=4). Compiled, greedy, 128 new tokens, batch 1; every
configuration warmed up (compiled) first, then timed in interleaved passes; medians. The outputs are
checked equal to HF's.

    python bench/bench_demo_prompt.py          # about 10 minutes here, most of it compiling

Writes bench/results/demo_prompt_cpu.{json,md}.
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
from hsd_fast.zoo_demo import PROMPT

NEW_TOKENS = 128
COLUMNS = ["configuration", "tok/s", "x HF generate", "x ours, no draft"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--passes", type=int, default=5, help="interleaved timed passes per configuration")
    parser.add_argument("--stem", default="demo_prompt_cpu", help="result file name under bench/results")
    args = parser.parse_args()
    warnings.simplefilter("ignore")  # the profile's and HF's notices; the outputs are compared below
    target, xxs = zoo.load("s"), zoo.load("xxs")
    ids = zoo.load_tokenizer()(PROMPT, return_tensors="pt")["input_ids"]
    options = {"do_sample": False, "max_new_tokens": NEW_TOKENS, "eos_token_id": None}
    ours = {"custom_generate": hsd_fast.generate, "compile": True, **options}
    configs = {
        "HF generate": lambda: target.generate(ids, **options),
        "ours, no draft": lambda: target.generate(ids, drafts=[], **ours),
        "ours, lookup > s T=8": lambda: target.generate(ids, drafts=["lookup"], T=[8], **ours),
        "ours, xxs > s T=4": lambda: target.generate(ids, drafts=[xxs], T=[4], **ours),
    }
    expected = None
    for name, run in configs.items():
        out, _ = run(), run()  # the first call compiles
        expected = out if expected is None else expected
        if out.tolist() != expected.tolist():
            raise SystemExit(f"{name}: the output differs from HF generate's")
        print(f"warmed up: {name}", flush=True)
    seconds: dict[str, list[float]] = {name: [] for name in configs}
    for p in range(args.passes):
        for name in list(configs) if p % 2 == 0 else list(reversed(configs)):
            begin = time.perf_counter()
            configs[name]()
            seconds[name].append(time.perf_counter() - begin)
    median = {name: statistics.median(times) for name, times in seconds.items()}
    rows = [
        {
            "configuration": name,
            "tok/s": round(NEW_TOKENS / m, 1),
            "x HF generate": round(median["HF generate"] / m, 2),
            "x ours, no draft": round(median["ours, no draft"] / m, 2),
        }
        for name, m in median.items()
    ]
    meta = run_meta(
        "cpu", dtype="float32", batch=1, new_tokens=NEW_TOKENS, passes=args.passes, compiled=True,
        threads=torch.get_num_threads(),
    )  # fmt: skip
    notes = [
        "The demo's prompt, greedy; every output equal to HF's. Medians of interleaved passes after a",
        "warm-up that compiled each configuration's steps.",
    ]
    write_results(args.stem, "The demo's prompt", notes, COLUMNS, rows, meta)


if __name__ == "__main__":
    main()
