"""What the kernel benchmarks share: timers, the device copy bandwidth (the roofline's denominator),
and writing results as JSON + markdown under bench/results/ with device, versions, commit and date.

Timing on CUDA uses `triton.testing.do_bench` medians (host launch included); on CPU, where only
the torch references run (the Triton interpreter is not a speed path), `torch.utils.benchmark`.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

import torch
import triton

from hsd_fast.report import markdown_table, run_metadata, write_report

RESULTS = Path(__file__).parent / "results"
EVENT_TIMING = (
    "CUDA events around one launcher call, host launch time included; kernel_host_us is the host's "
    "enqueue time alone, kernel_graph_us the GPU's alone (the call replayed from a CUDA graph)"
)


def median_us(fn: Callable[[], object], cuda: bool) -> float:
    if cuda:
        return triton.testing.do_bench(fn, return_mode="median") * 1e3
    from torch.utils import benchmark

    return benchmark.Timer(stmt="fn()", globals={"fn": fn}).blocked_autorange(min_run_time=0.5).median * 1e6


def event_us(fn: Callable[[], object], repeats: int = 100) -> float:
    """Median of CUDA-event timings around one call. The events sit on the stream, so time the GPU
    spends waiting for the host to launch the kernels is included."""
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return sorted(times)[len(times) // 2]


def compiled_us(fn: Callable[[], object], meta: dict) -> float | None:
    """``median_us`` of a call through ``torch.compile(dynamic=True)``, or None where inductor fails
    to compile it (seen on torch 2.11 for the verification reference at a new batch size: an
    assertion in its tiling code); the first failure is kept in ``meta``."""
    try:
        return median_us(fn, True)
    except Exception as err:  # an inductor bug must not cost the kernel's columns
        meta.setdefault("torch_compile_failure", f"{type(err).__name__}: {err}".splitlines()[0][:200])
        return None


def add_ratios(row: dict) -> None:
    """The kernel against the roofline and against the compiled reference, from the row's times."""
    row["kernel_over_roofline"] = row["kernel_us"] / row["roofline_us"]
    if row["reference_compiled_us"] is not None:
        row["compiled_over_kernel"] = row["reference_compiled_us"] / row["kernel_us"]


def host_us(fn: Callable[[], object], repeats: int = 200) -> float:
    """Median host time to enqueue one call, with no synchronisation in between (a few hundred
    launches fit in the launch queue). Close to ``event_us``: the call is bound by the host."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e6)
    torch.cuda.synchronize()
    return sorted(times)[len(times) // 2]


def graph_us(fn: Callable[[], object]) -> float:
    """``event_us`` of one call captured in a CUDA graph and replayed: the GPU's own time, with no
    host launch cost (what fewer launches or graph capture in the engine could reach)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up off the capture, as torch.cuda.graph asks
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return event_us(graph.replay)


def small_batch_us(fn: Callable[[], object]) -> dict[str, float | str]:
    """Where the time of a small call goes: events around it (host launch included), the host's
    enqueue time alone, and the GPU's alone (graph replay). A failed capture is reported, not
    raised: the other columns are worth keeping."""
    out: dict[str, float | str] = {"kernel_cuda_event_us": event_us(fn), "kernel_host_us": host_us(fn)}
    try:
        out["kernel_graph_us"] = graph_us(fn)
    except RuntimeError as err:
        out["kernel_graph_us"] = f"capture failed: {str(err).splitlines()[0][:80]}"
    return out


def first_call_s(fn: Callable[[], object]) -> float:
    """Wall time of a first call: compilation (Triton JIT or torch.compile) plus one run."""
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def copy_bandwidth() -> float:
    """Device copy bandwidth in bytes/s (read + write of a 1 GiB buffer)."""
    src = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), return_mode="median")
    return 2 * src.numel() / (ms * 1e-3)


def parse_args(doc: str, quick_help: str, **switches: str) -> argparse.Namespace:
    """--device, --quick, and one more on/off switch per keyword (name -> help)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help=quick_help)
    for name, help_text in switches.items():
        parser.add_argument(f"--{name}", action="store_true", help=help_text)
    return parser.parse_args()


def run_meta(device: str, **extra: object) -> dict:
    """Date, commit, device and versions; on CUDA also the copy bandwidth measured now."""
    meta = run_metadata(device, **extra)
    if device == "cuda":
        meta |= {"copy_bandwidth_GBps": copy_bandwidth() / 1e9, "event_timing": EVENT_TIMING}
    return meta


def compile_notes(meta: dict) -> list[str]:
    """The markdown lines for what was measured once per run (CUDA only)."""
    if "copy_bandwidth_GBps" not in meta:
        return []
    return [
        "",
        f"First calls (compile + run): kernels {meta['kernel_first_call_s']:.1f} s, "
        f"torch.compile {meta['torch_compile_first_call_s']:.1f} s. "
        f"Copy bandwidth {meta['copy_bandwidth_GBps']:.0f} GB/s. kernel_cuda_event_us: {EVENT_TIMING}.",
        *(
            [f"Empty reference_compiled_us: torch.compile failed ({meta['torch_compile_failure']})."]
            if "torch_compile_failure" in meta
            else []
        ),
    ]


def write_results(
    stem: str, title: str, notes: list[str], keys: list[str], rows: list[dict], meta: dict
) -> None:
    """bench/results/<stem>.json (meta + rows) and .md (notes, then a table: the ``keys`` columns
    first)."""
    columns = keys + [c for c in rows[0] if c not in keys]
    table = markdown_table(columns, [[r.get(c) for c in columns] for r in rows])
    write_report(RESULTS / stem, f"{title}: {meta['device']}", meta, [*notes, "", *table], {"rows": rows})
