"""Host time of the kernel launchers' Python bodies: everything `verify_triton` and `sample_triton`
do on the host except Triton's own launches (the kernels are replaced by no-ops), at batch 1.

    python bench/bench_launcher_host.py

At batch 1 the GPU work of a step is a few microseconds, so the host's time decides whether a
launcher meets the 20 us target. This part of it needs no GPU: it runs on CPU tensors (no CUDA
caching allocator, so a CUDA host spends somewhat more per allocation). Column ``host_us``: the
launcher body, the least of 5 medians; plus one ``torch.empty`` for scale. Writes
bench/results/launcher_host_cpu.{json,md}.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from unittest import mock

import torch
from bench_rejection import make_inputs as verify_inputs
from kernel_bench import median_us, run_meta, write_results

from hsd_fast.triton_kernels import rejection, sampling
from hsd_fast.triton_kernels.keyed_random_torch import DRAFT

KERNELS = {
    rejection: ["_chunk_stats_kernel", "_accept_kernel", "_chunk_race_kernel", "_race_pick_kernel"],
    sampling: ["_sample_chunk_kernel", "_sample_pick_kernel"],
}


class _NoLaunch:
    """Stands in for a kernel: ``kernel[grid](*args)`` does nothing."""

    def __getitem__(self, grid: tuple) -> object:
        return lambda *args, **kwargs: None


def _least_median_us(fn: Callable[[], object], rounds: int = 5) -> float:
    """The least of ``rounds`` medians: this machine's speed drifts by 2x between minutes."""
    return min(median_us(fn, cuda=False) for _ in range(rounds))


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
            rows.append({"launcher": name, "host_us": _least_median_us(fn)})
            print(rows[-1], flush=True)
    rows.append({"launcher": "one torch.empty(8)", "host_us": median_us(lambda: torch.empty(8), cuda=False)})
    notes = [
        "Batch 1, 4 drafts, vocabulary 32000, bf16, CPU tensors; kernels replaced by no-ops, so "
        "Triton's own launch cost is not included. Microseconds: the least of 5 medians "
        "(torch.utils.benchmark).",
    ]
    write_results("launcher_host_cpu", "Launcher host time", notes, ["launcher"], rows, run_meta("cpu"))


if __name__ == "__main__":
    main()
