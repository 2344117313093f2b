"""Host time of the kernel launchers' Python bodies: everything `verify_triton` and `sample_triton`
do on the host except Triton's own launches (the kernels are replaced by no-ops), at batch 1.

    python bench/bench_launcher_host.py

At batch 1 the GPU work of a step is a few microseconds, so the host's time decides whether a
launcher meets the 20 us target. This part of it needs no GPU: it runs on CPU tensors (no CUDA
caching allocator, so a CUDA host spends somewhat more per allocation). Columns, side by side in one
run:
  host_us                   the launcher body as it is
  host_us_with_triton_cdiv  the same with `triton.cdiv` for the host's ceiling divisions, as before
                            commit 'launchers: plain host arithmetic' (a constexpr function: ~3 us
                            per host call)
each the least of 5 medians, the two measured in turn; plus one `torch.empty` and one `triton.cdiv`
call for scale. Writes bench/results/launcher_host_cpu.{json,md}.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from unittest import mock

import torch
import triton
from bench_rejection import make_inputs as verify_inputs
from kernel_bench import median_us, run_meta, write_results

from hsd_fast.triton_kernels import rejection, sampling, split
from hsd_fast.triton_kernels.keyed_random_torch import DRAFT

KERNELS = {
    rejection: ["_chunk_stats_kernel", "_accept_kernel", "_chunk_race_kernel", "_race_pick_kernel"],
    sampling: ["_sample_chunk_kernel", "_sample_pick_kernel"],
}


class _NoLaunch:
    """Stands in for a kernel: ``kernel[grid](*args)`` does nothing."""

    def __getitem__(self, grid: tuple) -> object:
        return lambda *args, **kwargs: None


def _interleaved(fn: Callable[[], object], rounds: int = 5) -> dict[str, float]:
    """Both variants measured in turn, ``rounds`` times; the least median of each. This machine's
    speed drifts by 2x between minutes, which would swamp one measurement after the other."""
    times: dict[str, list[float]] = {"host_us": [], "host_us_with_triton_cdiv": []}
    for _ in range(rounds):
        times["host_us"].append(median_us(fn, cuda=False))
        with mock.patch.object(split, "cdiv", triton.cdiv):
            times["host_us_with_triton_cdiv"].append(median_us(fn, cuda=False))
    return {column: min(values) for column, values in times.items()}


def main() -> None:
    verify_args = verify_inputs(1, 4, 32000, torch.bfloat16, "cpu")
    logits, temperature, seeds, positions = verify_args[0][:1], *verify_args[5:]
    launchers = {
        "verify sampled": lambda: rejection.verify_triton(*verify_args, level=1, greedy=False),
        "verify greedy": lambda: rejection.verify_triton(*verify_args, level=1, greedy=True),
        "sample sampled": lambda: sampling.sample_triton(
            logits, temperature, seeds, positions, level=0, purpose=DRAFT, greedy=False
        ),
    }
    rows = []
    with contextlib.ExitStack() as stack:
        for module, names in KERNELS.items():
            for name in names:
                stack.enter_context(mock.patch.object(module, name, _NoLaunch()))
        for name, fn in launchers.items():
            rows.append({"launcher": name, **_interleaved(fn)})
            print(rows[-1], flush=True)
    rows.append({"launcher": "one torch.empty(8)", "host_us": median_us(lambda: torch.empty(8), cuda=False)})
    rows.append(
        {"launcher": "one triton.cdiv call", "host_us": median_us(lambda: triton.cdiv(7, 2), cuda=False)}
    )
    notes = [
        "Batch 1, 4 drafts, vocabulary 32000, bf16, CPU tensors; kernels replaced by no-ops, so "
        "Triton's own launch cost is not included. Microseconds: the least of 5 medians "
        "(torch.utils.benchmark), the two variants measured in turn.",
    ]
    write_results("launcher_host_cpu", "Launcher host time", notes, ["launcher"], rows, run_meta("cpu"))


if __name__ == "__main__":
    main()
