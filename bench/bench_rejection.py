"""Benchmark of one verification step (`triton_kernels/rejection.py`): the fused kernel vs the torch
reference (eager and `torch.compile(dynamic=True)`), side by side in one run.

    python bench/bench_rejection.py                 # CUDA if present, else CPU (reference only)
    python bench/bench_rejection.py --quick         # a small grid

Grid: batch {1, 8, 64} x drafts per row {4, 8, 16} x vocab {32000, 128256, 151936}, bf16 and fp32
logits. On CUDA, `triton.testing.do_bench` medians of:
  kernel            the launcher as the engine calls it (sampled; vocabulary split chosen by it)
  kernel_greedy     the same in greedy mode (two launches instead of four)
  kernel_unsplit    sampled with num_chunks=1 (no vocabulary split): what the split buys
  reference eager / torch.compile(dynamic=True) (first-call compile time reported separately)
plus, at batch 1, where the time goes: CUDA events around one launcher call (they sit on the
stream, so any time the GPU waits for the host to launch the kernels is included), the host's
enqueue time alone and the GPU's alone (the call replayed from a CUDA graph); and a roofline =
bytes the op must read / device copy bandwidth measured in the same run. On CPU (no kernel: the
interpreter is not a speed path) the reference is timed with `torch.utils.benchmark`, and the grid
stops at batch 8 to keep the run short. Writes bench/results/rejection_<device>.{json,md}.
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

from hsd_fast.triton_kernels.rejection import verify_triton
from hsd_fast.triton_kernels.rejection_torch import verify_torch

DTYPES = [torch.bfloat16, torch.float32]
KEYS = ["batch", "drafts", "vocab", "dtype"]


def make_inputs(batch: int, drafts: int, vocab: int, dtype: torch.dtype, device: str) -> tuple:
    """Every row with ``drafts`` drafts, in the op's padded layout (equal counts: no padding)."""
    gen = torch.Generator(device=device).manual_seed(0)
    verifier = torch.randn(batch, drafts + 1, vocab, generator=gen, device=device).to(dtype)  # [B, D + 1, V]
    draft = torch.randn(batch, drafts, vocab, generator=gen, device=device).to(dtype)  # [B, D, V]
    draft_lse = torch.logsumexp(draft.float(), -1)  # [B, D]
    tokens = torch.randint(0, vocab, (batch, drafts), generator=gen, device=device)  # [B, D]
    num_drafts = torch.full((batch,), drafts, device=device)  # [B]
    ones = torch.ones(batch, device=device)
    seeds = torch.arange(batch, device=device)
    positions = torch.full((batch,), 100, device=device)
    return verifier, draft, draft_lse, tokens, num_drafts, ones, seeds, positions


def needed_bytes(batch: int, drafts: int, vocab: int, dtype: torch.dtype) -> int:
    """Verifier logits once, one draft row per row (the residual), gathered draft entries, small
    per-row data; uniforms are computed, not read."""
    size = torch.finfo(dtype).bits // 8
    return (batch * (drafts + 1) * vocab + batch * vocab + batch * drafts) * size + batch * 64


def main() -> None:
    args = parse_args(__doc__, "batch {1, 8}, vocab 32000 only")
    cuda = args.device == "cuda"
    batches = [1, 8] if args.quick or not cuda else [1, 8, 64]
    vocabs = [32000] if args.quick else [32000, 128256, 151936]
    meta = run_meta(args.device)
    compiled = torch.compile(_reference, dynamic=True)

    rows = []
    for batch, drafts, vocab, dtype in itertools.product(batches, [4, 8, 16], vocabs, DTYPES):
        inputs = make_inputs(batch, drafts, vocab, dtype, args.device)
        row = {"batch": batch, "drafts": drafts, "vocab": vocab, "dtype": str(dtype).split(".")[-1]}
        run = functools.partial(_bound, inputs=inputs)
        if not cuda:
            rows.append(row | {"reference_eager_us": median_us(run(_reference), False)})
            print(rows[-1], flush=True)
            continue
        if not rows:  # compile times, reported apart from the timings
            meta["kernel_first_call_s"] = first_call_s(lambda i=inputs: _both_modes(_kernel, i))
            meta["torch_compile_first_call_s"] = first_call_s(lambda i=inputs: _both_modes(compiled, i))
        row |= {
            "kernel_us": median_us(run(_kernel), True),
            "kernel_greedy_us": median_us(run(_kernel, greedy=True), True),
            "kernel_unsplit_us": median_us(run(_kernel, num_chunks=1), True),
            "reference_eager_us": median_us(run(_reference), True),
            "reference_compiled_us": compiled_us(run(compiled), meta),
            "roofline_us": needed_bytes(batch, drafts, vocab, dtype) / meta["copy_bandwidth_GBps"] / 1e3,
        }
        add_ratios(row)
        if batch == 1:
            row |= small_batch_us(run(_kernel))
        rows.append(row)
        print(row, flush=True)

    notes = [
        "Reference: verify_torch (rejection_torch.py) at the run's commit. Times in microseconds "
        "(medians), sampled mode unless named greedy, level 1, rows of equal draft counts, random logits "
        "(most drafts rejected).",
        *compile_notes(meta),
    ]
    write_results(f"rejection_{args.device}", "Verification step", notes, KEYS, rows, meta)


# The level is a constant of these functions, not an argument: an int argument of a dynamic=True
# function becomes a symbolic int, and inductor's Triton code for the keyed hash of a symbolic level
# does not compile (torch 2.11 on the H200: `float ^ float`). The engine compiles at static shapes.
def _kernel(*args, **kwargs):
    return verify_triton(*args, level=1, **kwargs)


def _reference(*args, **kwargs):
    return verify_torch(*args, level=1, **kwargs)


def _bound(fn, inputs: tuple, greedy: bool = False, **kwargs):
    return functools.partial(fn, *inputs, greedy=greedy, **kwargs)


def _both_modes(fn, inputs: tuple) -> None:
    fn(*inputs, greedy=False)
    fn(*inputs, greedy=True)


if __name__ == "__main__":
    main()
