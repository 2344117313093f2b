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
plus, at batch 1, CUDA events around one launcher call (the events sit on the stream, so any time
the GPU waits for the host to launch the kernels is included), and a roofline = bytes the op must
read / device copy bandwidth measured in the same run. On CPU (no kernel: the interpreter is not a
speed path) the reference is timed with `torch.utils.benchmark`, and the grid stops at batch 8 to
keep the run short. Writes bench/results/rejection_<device>.{json,md}.
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import time
from datetime import date
from pathlib import Path

import torch
import triton

from hsd_fast.triton_kernels.rejection import verify_torch, verify_triton

RESULTS = Path(__file__).parent / "results"
REFERENCE_COMMIT = "acae7d0"  # verify_torch as the kernel issue started; unchanged since


def make_inputs(batch: int, drafts: int, vocab: int, dtype: torch.dtype, device: str) -> tuple:
    gen = torch.Generator(device=device).manual_seed(0)
    rows = batch * (drafts + 1)
    verifier = torch.randn(rows, vocab, generator=gen, device=device).to(dtype)
    draft = torch.randn(batch * drafts, vocab, generator=gen, device=device).to(dtype)
    draft_lse = torch.logsumexp(draft.float(), -1)
    tokens = torch.randint(0, vocab, (batch * drafts,), generator=gen, device=device)
    offsets = torch.arange(0, batch + 1, device=device) * drafts
    ones = torch.ones(batch, device=device)
    seeds = torch.arange(batch, device=device)
    positions = torch.full((batch,), 100, device=device)
    return verifier, draft, draft_lse, tokens, offsets, ones, seeds, positions


def needed_bytes(batch: int, drafts: int, vocab: int, dtype: torch.dtype) -> int:
    """Verifier logits once, one draft row per row (the residual), gathered draft entries, small
    per-row data; uniforms are computed, not read."""
    size = torch.finfo(dtype).bits // 8
    return (batch * (drafts + 1) * vocab + batch * vocab + batch * drafts) * size + batch * 64


def copy_bandwidth(device: str) -> float:
    """Device copy bandwidth in bytes/s (read + write of a 1 GiB buffer)."""
    src = torch.empty(2**30, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src))
    return 2 * src.numel() / (ms * 1e-3)


def time_cpu(fn) -> float:
    from torch.utils import benchmark

    return benchmark.Timer(stmt="fn()", globals={"fn": fn}).blocked_autorange(min_run_time=0.5).median


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="batch {1, 8}, vocab 32000 only")
    args = parser.parse_args()
    cuda = args.device == "cuda"
    batches = [1, 8] if args.quick or not cuda else [1, 8, 64]
    vocabs = [32000] if args.quick else [32000, 128256, 151936]
    dtypes = [torch.bfloat16, torch.float32]
    bandwidth = copy_bandwidth(args.device) if cuda else None

    rows = []
    compiled = torch.compile(verify_torch, dynamic=True)
    compile_s = kernel_jit_s = None
    for batch, drafts, vocab, dtype in itertools.product(batches, [4, 8, 16], vocabs, dtypes):
        inputs = make_inputs(batch, drafts, vocab, dtype, args.device)
        row = {"batch": batch, "drafts": drafts, "vocab": vocab, "dtype": str(dtype).split(".")[-1]}
        if cuda:
            if compile_s is None:
                kernel_jit_s = _first_call_s(lambda i=inputs: _both_modes(verify_triton, i))
                compile_s = _first_call_s(lambda i=inputs: _both_modes(compiled, i))
            kernel = triton.testing.do_bench(lambda i=inputs: verify_triton(*i, level=1, greedy=False))
            greedy = triton.testing.do_bench(lambda i=inputs: verify_triton(*i, level=1, greedy=True))
            unsplit = triton.testing.do_bench(
                lambda i=inputs: verify_triton(*i, level=1, greedy=False, num_chunks=1)
            )
            eager = triton.testing.do_bench(lambda i=inputs: verify_torch(*i, level=1, greedy=False))
            comp = triton.testing.do_bench(lambda i=inputs: compiled(*i, level=1, greedy=False))
            roofline_us = needed_bytes(batch, drafts, vocab, dtype) / bandwidth * 1e6
            row |= {
                "kernel_us": kernel * 1e3,
                "kernel_greedy_us": greedy * 1e3,
                "kernel_unsplit_us": unsplit * 1e3,
                "reference_eager_us": eager * 1e3,
                "reference_compiled_us": comp * 1e3,
                "roofline_us": roofline_us,
                "kernel_over_roofline": kernel * 1e3 / roofline_us,
                "compiled_over_kernel": comp / kernel,
            }
            if batch == 1:
                row["kernel_cuda_event_us"] = _event_time(inputs)
        else:
            row["reference_eager_us"] = (
                time_cpu(lambda i=inputs: verify_torch(*i, level=1, greedy=False)) * 1e6
            )
        rows.append(row)
        print(row, flush=True)
    write(rows, args.device, bandwidth, compile_s, kernel_jit_s)


def _both_modes(fn, inputs: tuple) -> None:
    fn(*inputs, level=1, greedy=False)
    fn(*inputs, level=1, greedy=True)


def _first_call_s(fn) -> float:
    """Wall time of a first call: compilation (Triton JIT or torch.compile) plus one run."""
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def _event_time(inputs: tuple, repeats: int = 100) -> float:
    """Median of CUDA-event timings around one launcher call (host launch time included)."""
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        verify_triton(*inputs, level=1, greedy=False)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return sorted(times)[len(times) // 2]


def write(
    rows: list[dict],
    device: str,
    bandwidth: float | None,
    compile_s: float | None,
    kernel_jit_s: float | None,
) -> None:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    name = torch.cuda.get_device_name() if device == "cuda" else f"CPU ({torch.get_num_threads()} threads)"
    meta = {
        "device": name,
        "versions": {"torch": torch.__version__, "triton": triton.__version__},
        "commit": commit,
        "date": date.today().isoformat(),
        "reference": REFERENCE_COMMIT,
        "copy_bandwidth_GBps": None if bandwidth is None else bandwidth / 1e9,
        "torch_compile_first_call_s": compile_s,
        "kernel_first_call_s": kernel_jit_s,
        "event_timing": "CUDA events around one launcher call; host launch time included",
    }
    RESULTS.mkdir(exist_ok=True)
    stem = RESULTS / f"rejection_{device}"
    stem.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    columns = [c for c in rows[0] if c not in ("batch", "drafts", "vocab", "dtype")]
    lines = [
        f"# Verification step: {name}",
        "",
        f"torch {torch.__version__}, triton {triton.__version__}; commit {commit}, {meta['date']}. "
        f"Reference: verify_torch at {REFERENCE_COMMIT}. Times in microseconds (medians), sampled mode "
        "unless named greedy, level 1, rows of equal draft counts.",
        "",
        "| batch | drafts | vocab | dtype | " + " | ".join(columns) + " |",
        "|" + "---|" * (4 + len(columns)),
    ]
    if device == "cuda":
        lines[3:3] = [
            "",
            f"First calls (compile + run, both modes): kernels {kernel_jit_s:.1f} s, "
            f"torch.compile {compile_s:.1f} s. Copy bandwidth: {bandwidth / 1e9:.0f} GB/s. "
            f"kernel_cuda_event_us: {meta['event_timing']}.",
        ]
    for r in rows:
        cells = [f"{r[c]:.1f}" if isinstance(r[c], float) else str(r[c]) for c in columns]
        lines.append(
            f"| {r['batch']} | {r['drafts']} | {r['vocab']} | {r['dtype']} | " + " | ".join(cells) + " |"
        )
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
