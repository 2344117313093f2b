"""What a new process pays before it decodes fast: the demo's request (the zoo's ``s`` under its pick
``lookup > s`` T=8, the demo's prompt, 128 new tokens, compiled, greedy) in fresh processes, with
compiled steps kept in inductor's FX graph cache across processes (``hsd_fast/graph_cache.py``, the
default) and as before (frozen CPU steps bypassed the cache; kernels' own libraries were still found
on disk), each in a new cache directory and in one an earlier process filled. Per process: the first
call's seconds (compiling included), a second call's (warm), what the cache did, and the whole
process's wall time; every output checked equal to HF ``generate``'s. Passes interleave the modes;
medians.

    python bench/bench_graph_cache.py          # about 8 minutes here, most of it compiling

Writes bench/results/graph_cache_cpu.{json,md}.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from unittest import mock

import torch
from kernel_bench import run_meta, write_results

NEW_TOKENS = 128
MODES = {  # name: (steps kept in the cache, the cache directory filled by an earlier process)
    "as before, new cache": (False, False),
    "as before, later process": (False, True),
    "cached steps, new cache": (True, False),
    "cached steps, later process": (True, True),
}
COLUMNS = ["mode", "first call s", "second call ms", "process s", "FX cache hits", "misses", "bypasses"]


def child(cached: bool) -> None:
    """One process: the demo's request twice; prints a JSON line."""
    import hsd_fast
    from hsd_fast import compile_policy, zoo
    from hsd_fast.zoo_demo import PROMPT

    warnings.simplefilter("ignore")
    target = zoo.load("s")
    ids = zoo.load_tokenizer()(PROMPT, return_tensors="pt")["input_ids"]
    options = {"do_sample": False, "max_new_tokens": NEW_TOKENS, "eos_token_id": None}
    expected = target.generate(ids, **options)
    ours = {"custom_generate": hsd_fast.generate, "compile": True, "drafts": ["lookup"], "T": [8], **options}
    before = mock.patch.object(compile_policy, "weights_in_cache_key", lambda model: contextlib.nullcontext())
    counters = torch._dynamo.utils.counters
    counters.clear()
    seconds = []
    with contextlib.nullcontext() if cached else before:
        for _ in range(2):
            begin = time.perf_counter()
            out = target.generate(ids, **ours)
            seconds.append(time.perf_counter() - begin)
            if out.tolist() != expected.tolist():
                raise SystemExit("the output differs from HF generate's")
    inductor = counters["inductor"]
    report = {"first call s": seconds[0], "second call ms": seconds[1] * 1e3}
    report |= {"FX cache hits": inductor["fxgraph_cache_hit"], "misses": inductor["fxgraph_cache_miss"]}
    print(json.dumps(report | {"bypasses": inductor["fxgraph_cache_bypass"]}), flush=True)


def in_a_new_process(cached: bool, cache_dir: str) -> dict:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache_dir}
    command = [sys.executable, __file__, "--child", "cached" if cached else "before"]
    begin = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    report = json.loads(done.stdout.strip().splitlines()[-1])
    return report | {"process s": time.perf_counter() - begin}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--passes", type=int, default=2, help="interleaved passes over the modes")
    parser.add_argument("--stem", default="graph_cache_cpu", help="result file name under bench/results")
    parser.add_argument("--child", choices=["cached", "before"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child == "cached")
    runs: dict[str, list[dict]] = {name: [] for name in MODES}
    with tempfile.TemporaryDirectory() as scratch:
        filled = str(Path(scratch) / "filled")
        for cached in (True, False):  # the earlier process: fills the cache both modes read
            in_a_new_process(cached, filled)
        for p in range(args.passes):
            for name in list(MODES) if p % 2 == 0 else list(reversed(MODES)):
                cached, later = MODES[name]
                cache_dir = filled if later else tempfile.mkdtemp(dir=scratch)
                runs[name].append(in_a_new_process(cached, cache_dir))
                print(name, runs[name][-1], flush=True)
    rows = []
    for name, reports in runs.items():
        row = {"mode": name}
        for column in COLUMNS[1:]:
            values = [r[column] for r in reports]
            timed = column.endswith((" s", " ms"))
            row[column] = round(statistics.median(values), 1) if timed else max(values)
        rows.append(row)
    meta = run_meta(
        "cpu", dtype="float32", batch=1, new_tokens=NEW_TOKENS, passes=args.passes, compiled=True,
        threads=torch.get_num_threads(), hierarchy="lookup > s T=8",
    )  # fmt: skip
    notes = [
        "Fresh processes running the demo's request twice (the zoo's s, lookup > s T=8, 128 new tokens);",
        "every output equal to HF's greedy one. Medians over passes; counts are the most seen in a pass.",
        "'new cache': an empty inductor cache directory; 'later process': one an earlier process filled.",
    ]
    write_results(args.stem, "Compiled steps across processes", notes, COLUMNS, rows, meta)


if __name__ == "__main__":
    main()
