"""Host time: what the CPU spends around the work, per engine round, per lookup round and per kernel
launch, each written to its own result file.

    python bench/bench_host.py [engine] [lookup-round] [launchers]     (default: all three)

- ``engine``: the engine's own host time per round on the zoo, a round's wall time minus its time in
  forwards (``HSDStats.host_time`` over the rounds), greedy, compiled steps, batch 1 and 16, for no
  draft, ``xxs > s`` T=2 and ``lookup > s`` T=6 (a lookup round's propose, write and commit count as
  that round's step time). Each runs 3 times to warm up (compiling), then 5 times: the median of the
  5 per-run means. 128 new tokens after the zoo's first code prompt (batch 16: its first 4 code
  prompts, 4 times each). Writes ``engine_host_cpu``.
- ``lookup-round``: the lookup level's round, ``LookupProposer.propose`` (read what changed, sync the
  C++ index, propose) and ``DecodeState.write_proposals``, at batch 1, 4 and 16, in a simulated run
  without a model: each row's text is random tokens in which earlier passages recur (so the lookup
  matches often); every round proposes up to 6 tokens per row, a "verification" accepts them while
  they equal the text and writes one more text token, and the index is invalidated from there, as
  the engine does. 128 prompt tokens, rows of 1024; the median over a run, the median of 5 runs, one
  thread. Writes ``lookup_round_cpu``.
- ``launchers``: the kernel launchers' Python bodies, everything ``verify_triton`` and
  ``sample_triton`` do on the host except Triton's own launches (the kernels replaced by no-ops), at
  batch 1. There the GPU work of a step is a few microseconds, so the host's time decides whether a
  launcher meets the 20 us target. It needs no GPU: CPU tensors (no CUDA caching allocator, so a
  CUDA host spends somewhat more per allocation); the least of 5 medians, plus one ``torch.empty``
  for scale. Writes ``launcher_host_cpu``.

Result files: bench/results/<name>.{json,md}.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
import types
from collections.abc import Callable
from unittest import mock

import numpy as np
import torch
from kernel_bench import median_us, run_meta, write_results

from hsd_fast import LookupDraft, run_hsd
from hsd_fast.decode_state import DecodeState
from hsd_fast.lookup import LookupProposer


# ---------------------------------------------------------------------------------------- engine
def engine() -> None:
    from hsd_fast.bench.scenarios import zoo_scenario
    from hsd_fast.hf_runner import HFRunner

    zoo = zoo_scenario()
    vocab = zoo.target.get_output_embeddings().weight.shape[0]
    target, xxs = HFRunner.of(zoo.target, vocab), HFRunner.of(zoo.drafts["xxs"], vocab)
    configs = {
        "no draft": ([target], []),
        "xxs > s, T=2": ([xxs, target], [2]),
        "lookup > s, T=6": ([LookupDraft(), target], [6]),
    }
    code = list(zoo.prompt_sets["code"][:4])
    rows = []
    for batch, prompts in ((1, code[:1]), (16, code * 4)):
        for name, (runners, block_sizes) in configs.items():
            kwargs = dict(block_sizes=block_sizes, max_new_tokens=128, greedy=True, compile=True)
            for _ in range(3):
                run_hsd(runners, prompts, **kwargs)
            per_run = []
            for _ in range(5):
                stats = run_hsd(runners, prompts, **kwargs).stats
                per_run.append(1e6 * stats.host_time / sum(stats.forwards))
            rows.append({"batch": batch, "config": name, "host_us_per_round": statistics.median(per_run)})
            print(rows[-1], flush=True)
    notes = [
        "The zoo, greedy, compiled steps; host time = a round's wall time minus its time in forwards "
        "(the prefill's head chunks included in the latter), per round (lookup rounds count: their "
        "propose, write and commit are their step time). Median of 5 runs after 3 warm-up runs.",
    ]
    write_results(
        "engine_host_cpu", "Engine host time per round", notes, ["batch", "config"], rows, run_meta("cpu")
    )


# ---------------------------------------------------------------------------------- lookup round
PROMPT, LENGTH, WANTED = 128, 1024, 6


def recurring_text(rows: int, seed: int) -> np.ndarray:
    """[rows, LENGTH] int64: random tokens in which earlier passages recur."""
    gen = np.random.default_rng(seed)
    text = np.zeros((rows, LENGTH), dtype=np.int64)
    for r in range(rows):
        seq = list(gen.integers(0, 2000, 40))
        while len(seq) < LENGTH:
            if gen.random() < 0.6:  # copy an earlier passage
                start = int(gen.integers(0, len(seq) - 8))
                seq += seq[start : start + int(gen.integers(4, 20))]
            else:
                seq += list(gen.integers(0, 2000, int(gen.integers(1, 6))))
        text[r] = seq[:LENGTH]
    return text


def one_lookup_run(text: np.ndarray) -> float:
    """Seconds per lookup round, the median over one simulated run."""
    rows = text.shape[0]
    state = types.SimpleNamespace(tokens=torch.zeros(rows, LENGTH + WANTED, dtype=torch.int64))
    state.tokens[:, :PROMPT] = torch.from_numpy(text[:, :PROMPT])
    proposer = LookupProposer(LookupDraft(), rows, [])
    all_rows, wanted = np.arange(rows), np.full(rows, WANTED, dtype=np.int64)
    ends = np.full(rows, PROMPT, dtype=np.int64)
    times = []
    while (ends < LENGTH - WANTED - 1).all():
        started = time.perf_counter()
        proposed, counts, _ = proposer.propose(state.tokens, all_rows, ends, wanted)
        DecodeState.write_proposals(state, all_rows, ends, proposed, counts)
        times.append(time.perf_counter() - started)
        tokens = state.tokens.numpy()
        accepted = np.zeros(rows, dtype=np.int64)
        for r in range(rows):
            span = slice(ends[r], ends[r] + counts[r])
            right = tokens[r, span] == text[r, span]
            accepted[r] = counts[r] if right.all() else int(np.argmin(right))
            tokens[r, ends[r] : ends[r] + accepted[r] + 1] = text[r, ends[r] : ends[r] + accepted[r] + 1]
        proposer.invalidate(all_rows, ends + accepted)
        ends = ends + accepted + 1
    return statistics.median(times)


def lookup_round() -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    rows = []
    for batch in (1, 4, 16):
        text = recurring_text(batch, seed=batch)
        runs = [one_lookup_run(text) for _ in range(5)]
        rows.append({"batch": batch, "host_us_per_round": statistics.median(runs) * 1e6})
        print(rows[-1], flush=True)
    torch.set_num_threads(threads)
    notes = [
        f"A simulated run (no model): {PROMPT} prompt tokens, rows of {LENGTH} with recurring passages, "
        f"up to {WANTED} tokens proposed per row and round. Microseconds per round (propose + "
        "write_proposals): the median over a run, the median of 5 runs; one thread.",
    ]
    write_results("lookup_round_cpu", "Lookup round host time", notes, ["batch"], rows, run_meta("cpu"))


# ------------------------------------------------------------------------------------- launchers
class _NoLaunch:
    """Stands in for a kernel: ``kernel[grid](*args)`` does nothing."""

    def __getitem__(self, grid: tuple) -> object:
        return lambda *args, **kwargs: None


def _least_median_us(fn: Callable[[], object], rounds: int = 5) -> float:
    """The least of ``rounds`` medians: this machine's speed drifts by 2x between minutes."""
    return min(median_us(fn, cuda=False) for _ in range(rounds))


def launchers() -> None:
    from bench_rejection import make_inputs as verify_inputs

    from hsd_fast.triton_kernels import rejection, sampling
    from hsd_fast.triton_kernels.keyed_random_torch import DRAFT

    kernels = {
        rejection: ["_chunk_stats_kernel", "_accept_kernel", "_chunk_race_kernel", "_race_pick_kernel"],
        sampling: ["_sample_chunk_kernel", "_sample_pick_kernel"],
    }
    verify_args = verify_inputs(1, 4, 32000, torch.bfloat16, "cpu")
    logits, temperature, seeds, positions = verify_args[0][:, 0], *verify_args[5:]  # logits [1, V]
    calls = {
        "verify sampled": lambda: rejection.verify_triton(*verify_args, level=1, greedy=False),
        "verify greedy": lambda: rejection.verify_triton(*verify_args, level=1, greedy=True),
        "sample sampled": lambda: sampling.sample_triton(
            logits, temperature, seeds, positions, level=0, purpose=DRAFT, greedy=False
        ),
    }
    rows = []
    with contextlib.ExitStack() as stack:
        for module, names in kernels.items():
            for name in names:
                stack.enter_context(mock.patch.object(module, name, _NoLaunch()))
        for name, fn in calls.items():
            rows.append({"launcher": name, "host_us": _least_median_us(fn)})
            print(rows[-1], flush=True)
    rows.append({"launcher": "one torch.empty(8)", "host_us": median_us(lambda: torch.empty(8), cuda=False)})
    notes = [
        "Batch 1, 4 drafts, vocabulary 32000, bf16, CPU tensors; kernels replaced by no-ops, so "
        "Triton's own launch cost is not included. Microseconds: the least of 5 medians "
        "(torch.utils.benchmark).",
    ]
    write_results("launcher_host_cpu", "Launcher host time", notes, ["launcher"], rows, run_meta("cpu"))


PARTS = {"engine": engine, "lookup-round": lookup_round, "launchers": launchers}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("parts", nargs="*", metavar="PART", help=f"any of {', '.join(PARTS)} (default: all)")
    parts = parser.parse_args().parts or list(PARTS)
    unknown = [part for part in parts if part not in PARTS]
    if unknown:
        parser.error(f"PART: unknown {', '.join(unknown)}; choose from {', '.join(PARTS)}")
    for part in parts:
        PARTS[part]()


if __name__ == "__main__":
    main()
