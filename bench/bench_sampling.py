"""Benchmark of one drafting step (`triton_kernels/sampling.py`): the kernels vs the torch reference
(eager and `torch.compile(dynamic=True)`), side by side in one run.

    python bench/bench_sampling.py            # CUDA if present, else CPU (reference only)
    python bench/bench_sampling.py --quick    # a small grid

Grid: rows {1, 8, 64} x vocab {32000, 128256, 151936}, bf16 and fp32 logits, sampled and greedy
(on CPU, where only the reference runs, rows {1, 8}).
Columns as in bench_rejection.py: kernel (the launcher's vocabulary split), kernel_unsplit
(num_chunks=1), the references, a roofline (the logits read once / device copy bandwidth) and, at
one row, CUDA events around one launcher call, the host's enqueue time and CUDA-graph replay time.
Writes bench/results/sampling_<device>.{json,md}.
"""

from __future__ import annotations

import functools
import itertools

import torch
from kernel_bench import (
    add_ratios,
    compile_notes,
    compiled_us,
    first_call_s,
    median_us,
    parse_args,
    run_meta,
    small_batch_us,
    write_results,
)

from hsd_fast.triton_kernels.keyed_random_torch import DRAFT
from hsd_fast.triton_kernels.sampling import sample_triton
from hsd_fast.triton_kernels.sampling_torch import sample_torch

KEYS = ["rows", "vocab", "dtype", "mode"]


def make_inputs(rows: int, vocab: int, dtype: torch.dtype, device: str) -> tuple:
    gen = torch.Generator(device=device).manual_seed(0)
    logits = torch.randn(rows, vocab, generator=gen, device=device).to(dtype)
    temperature = torch.ones(rows, device=device)
    seeds = torch.arange(rows, device=device)
    positions = torch.full((rows,), 100, device=device)
    return logits, temperature, seeds, positions


def main() -> None:
    args = parse_args(__doc__, "rows {1, 8}, vocab 32000 only")
    cuda = args.device == "cuda"
    row_counts = [1, 8] if args.quick or not cuda else [1, 8, 64]
    vocabs = [32000] if args.quick else [32000, 128256, 151936]
    meta = run_meta(args.device)
    compiled = torch.compile(_reference, dynamic=True)

    results = []
    grid = itertools.product(row_counts, vocabs, [torch.bfloat16, torch.float32], [False, True])
    for rows, vocab, dtype, greedy in grid:
        inputs = make_inputs(rows, vocab, dtype, args.device)
        row = {"rows": rows, "vocab": vocab, "dtype": str(dtype).split(".")[-1]}
        row["mode"] = "greedy" if greedy else "sampled"
        run = functools.partial(_bound, inputs=inputs, greedy=greedy)
        if not cuda:
            results.append(row | {"reference_eager_us": median_us(run(_reference), False)})
            print(results[-1], flush=True)
            continue
        if not results:  # compile times, reported apart from the timings
            meta["kernel_first_call_s"] = first_call_s(run(_kernel))
            meta["torch_compile_first_call_s"] = first_call_s(run(compiled))
        bytes_needed = rows * vocab * (torch.finfo(dtype).bits // 8) + rows * 32
        row |= {
            "kernel_us": median_us(run(_kernel), True),
            "kernel_unsplit_us": median_us(run(_kernel, num_chunks=1), True),
            "reference_eager_us": median_us(run(_reference), True),
            "reference_compiled_us": compiled_us(run(compiled), meta),
            "roofline_us": bytes_needed / meta["copy_bandwidth_GBps"] / 1e3,
        }
        add_ratios(row)
        if rows == 1:
            row |= small_batch_us(run(_kernel))
        results.append(row)
        print(row, flush=True)

    notes = ["Times in microseconds (medians), level 0, temperature 1, random logits.", *compile_notes(meta)]
    write_results(f"sampling_{args.device}", "Drafting step", notes, KEYS, results, meta)


# Level and purpose are constants of these functions, not arguments: an int argument of a
# dynamic=True function becomes a symbolic int, and inductor's Triton code for the keyed hash of a
# symbolic level does not compile (torch 2.11 on the H200: `float ^ float`).
def _kernel(*args, **kwargs):
    return sample_triton(*args, level=0, purpose=DRAFT, **kwargs)


def _reference(*args, **kwargs):
    return sample_torch(*args, level=0, purpose=DRAFT, **kwargs)


def _bound(fn, inputs: tuple, greedy: bool, **kwargs):
    return functools.partial(fn, *inputs, greedy=greedy, **kwargs)


if __name__ == "__main__":
    main()
