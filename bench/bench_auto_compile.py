"""What ``compile="auto"`` (the default) costs a new process that serves many requests: the zoo's ``s``
under the demo's pick ``lookup > s`` T=8, greedy, batch 1, 128 new tokens per request, prompts of 64
tokens cycling over varied text (the zoo's code and prose windows and the text sets this machine
has), in fresh processes whose inductor cache an earlier process filled (so every compile loads its
steps, ``hsd_fast/graph_cache.py``). Two modes, interleaved: the compile price recorded by the last
process that compiled the hierarchy (``hsd_fast/compile_price.py``, the default) and no record (as
before: ``engine.AUTO_COMPILE_AFTER_SECONDS``, 60 s of eager decoding before compiling). Per process:
the seconds for all requests, how many ran eagerly and for how long, the seconds spent compiling, and
the first eager and the last compiled request checked equal to HF ``generate``'s.

    python bench/bench_auto_compile.py          # about 13 minutes here

Writes bench/results/auto_compile_cpu.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
from kernel_bench import run_meta, write_results

NEW_TOKENS = 128
PROMPT_TOKENS = 64
MODES = ("recorded price", "no record (as before)")
COLUMNS = [
    "mode",
    "requests",
    "all requests s",
    "tok/s",
    "eager requests",
    "eager s",
    "compiling s",
    "all but compiling s",
]


def prompts() -> list[torch.Tensor]:
    """64-token prompts from the zoo's held-out code and prose and the text sets found here, interleaved."""
    from hsd_fast import zoo
    from hsd_fast.bench import text_sets
    from hsd_fast.zoo.calibration import read_calibration

    windows = read_calibration(zoo.zoo_dir())  # source -> [8, 128] held-out token windows
    sets = [list(windows[source][:, :PROMPT_TOKENS]) for source in ("python-code", "bible")]
    tokenizer = zoo.load_tokenizer()
    for name in text_sets.available():
        sets.append(list(text_sets.prompt_set(name, tokenizer.encode, calibration=1, prompts=4).prompts))
    return [p.unsqueeze(0) for group in zip(*sets, strict=False) for p in group]


def child(requests: int, warm_up: bool) -> None:
    """One process: ``requests`` requests under ``compile="auto"`` (``warm_up``: each prompt once,
    compiled, which fills the cache and the record); prints a JSON line."""
    import hsd_fast
    from hsd_fast import zoo
    from hsd_fast.compile_policy import compile_seconds

    warnings.simplefilter("ignore")
    target = zoo.load("s")
    cycle = prompts()
    options = {"do_sample": False, "max_new_tokens": NEW_TOKENS, "eos_token_id": None}
    ours = {"custom_generate": hsd_fast.generate, "drafts": ["lookup"], "T": [8], **options}
    if warm_up:  # every prompt once: the step shapes the timed processes meet are in the cache
        for prompt in cycle:
            target.generate(prompt, compile=True, **ours)
        print(json.dumps({"compiling s": compile_seconds()}), flush=True)
        return
    outputs, eager, eager_seconds, compiled = [], 0, 0.0, False
    begin = time.perf_counter()
    for i in range(requests):
        started, compiling = time.perf_counter(), compile_seconds()
        outputs.append(target.generate(cycle[i % len(cycle)], **ours))
        compiled = compiled or compile_seconds() > compiling  # from the request that compiled on
        if not compiled:
            eager, eager_seconds = eager + 1, eager_seconds + time.perf_counter() - started
    seconds = time.perf_counter() - begin
    for i in (0, requests - 1):  # the first ran eagerly, the last compiled
        if outputs[i].tolist() != target.generate(cycle[i % len(cycle)], **options).tolist():
            raise SystemExit(f"request {i}: the output differs from HF generate's")
    report = {"requests": requests, "all requests s": seconds, "tok/s": requests * NEW_TOKENS / seconds}
    report |= {"eager requests": eager, "eager s": eager_seconds, "compiling s": compile_seconds()}
    report["all but compiling s"] = seconds - compile_seconds()
    print(json.dumps(report), flush=True)


def in_a_new_process(cache_dir: str, requests: int, warm_up: bool = False) -> dict:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache_dir}
    command = [sys.executable, __file__, "--child", str(requests), *(["--warm-up"] if warm_up else [])]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _rounded(values) -> dict:
    return {column: round(value, 1) for column, value in zip(COLUMNS[1:], values, strict=True)}


def main() -> None:
    from hsd_fast.compile_price import RECORD_FILE

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=400, help="requests per process")
    parser.add_argument("--passes", type=int, default=3, help="interleaved passes over the modes")
    parser.add_argument("--stem", default="auto_compile_cpu", help="result file name under bench/results")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--warm-up", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        return child(args.child, args.warm_up)
    runs: dict[str, list[dict]] = {name: [] for name in MODES}
    with tempfile.TemporaryDirectory() as cache_dir:
        record = Path(cache_dir) / RECORD_FILE
        warm = [in_a_new_process(cache_dir, 1, warm_up=True) for _ in range(2)]  # compiles, then loads
        print("warm-up processes", warm, flush=True)
        kept = record.read_text()  # the price the second (loading) process recorded
        for p in range(args.passes):
            for name in MODES if p % 2 == 0 else reversed(MODES):
                if name == "recorded price":
                    record.write_text(kept)
                else:
                    record.unlink(missing_ok=True)
                runs[name].append(in_a_new_process(cache_dir, args.requests))
                print(name, runs[name][-1], flush=True)
        shutil.rmtree(cache_dir, ignore_errors=True)
    rows = []
    for name, reports in runs.items():  # the medians, then each pass (compiling varies: see the notes)
        rows.append(
            {"mode": f"{name}, median"}
            | _rounded(statistics.median(r[c] for r in reports) for c in COLUMNS[1:])
        )
    for p in range(args.passes):
        rows += [
            {"mode": f"{name}, pass {p + 1}"} | _rounded(runs[name][p][c] for c in COLUMNS[1:])
            for name in MODES
        ]
    meta = run_meta(
        "cpu", dtype="float32", batch=1, new_tokens=NEW_TOKENS, passes=args.passes, compiled="auto",
        threads=torch.get_num_threads(), hierarchy="lookup > s T=8", requests=args.requests,
        recorded_price_s=[round(seconds, 1) for seconds in json.loads(kept).values()],
        warm_up_compiling_s=[round(w["compiling s"], 1) for w in warm],
    )  # fmt: skip
    notes = [
        "Fresh processes, each serving the same requests under compile='auto' (the zoo's s, lookup > s",
        "T=8, 128 new tokens, 64-token prompts cycling over the zoo's code and prose and this machine's",
        "text sets); inductor's cache filled by two earlier processes that ran each prompt once compiled",
        "(one compiled, one loaded: its seconds are the recorded price). 'no record': the record deleted,",
        "so auto waits for 60 s of eager decoding. Compiling varies from process to process: which step",
        "shapes get graphs depends on the requests that reach them first (a graph also serves narrower",
        "steps), so a process may compile a shape the warm-up did not, and that shape misses the cache.",
        "The first and the last request of each process checked equal to HF's greedy output. Medians.",
    ]
    write_results(args.stem, "compile='auto' with the recorded compile price", notes, COLUMNS, rows, meta)


if __name__ == "__main__":
    main()
