"""Host time of the lookup level's round: ``LookupProposer.propose`` (read what changed, sync the
C++ index, propose) and ``DecodeState.write_proposals``, at batch 1, 4 and 16.

    python bench/bench_lookup_round.py

A simulated run, no model: each row's text is random tokens in which earlier passages recur (so the
lookup matches often); every round proposes up to 6 tokens per row, a "verification" accepts them
while they equal the text and writes one more text token, and the index is invalidated from there,
as the engine does. 128 prompt tokens, rows of 1024. Microseconds per round: the median over a run,
the median of 5 runs. Writes bench/results/lookup_round_cpu.{json,md}.
"""

from __future__ import annotations

import statistics
import time
import types

import numpy as np
import torch
from kernel_bench import run_meta, write_results

from hsd_fast.decode_state import DecodeState
from hsd_fast.lookup import LookupDraft, LookupProposer

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


def one_run(text: np.ndarray) -> float:
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


def main() -> None:
    torch.set_num_threads(1)
    rows = []
    for batch in (1, 4, 16):
        text = recurring_text(batch, seed=batch)
        runs = [one_run(text) for _ in range(5)]
        rows.append({"batch": batch, "host_us_per_round": statistics.median(runs) * 1e6})
        print(rows[-1], flush=True)
    notes = [
        f"A simulated run (no model): {PROMPT} prompt tokens, rows of {LENGTH} with recurring passages, "
        f"up to {WANTED} tokens proposed per row and round. Microseconds per round (propose + "
        "write_proposals): the median over a run, the median of 5 runs; one thread.",
    ]
    write_results("lookup_round_cpu", "Lookup round host time", notes, ["batch"], rows, run_meta("cpu"))


if __name__ == "__main__":
    main()
