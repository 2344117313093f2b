"""A conversation whose context grows, in one process: each turn's prompt is the previous turn's
prompt and answer plus a new question, so the requests cross capacity sizes (128, 256, 384, 512 and
768 positions). Compiled steps whose graphs trace the capacity as a symbol (the default on a
CPU: docs/design.md, "Few graphs per run") against graphs compiled per capacity (as before), on two
copies of the zoo's ``s`` under the demo's pick ``lookup > s`` T=8: per turn, the seconds (compiling
included), the graphs compiled, and after the conversation the decode time of the last turn again
(interleaved passes, medians). Greedy; every answer checked equal to HF ``generate``'s.

    python bench/bench_capacity.py          # about 5 minutes here, most of it compiling per capacity

Writes bench/results/capacity_cpu.{json,md}.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import statistics
import time
import warnings
from collections.abc import Iterator
from unittest import mock

import torch
import torch._dynamo
from kernel_bench import run_meta, write_results

import hsd_fast
from hsd_fast import layout, zoo
from hsd_fast.zoo_demo import PROMPT

NEW_TOKENS = 100
QUESTIONS = [
    "\n# Now write a test for it.\n",
    "\n# Explain what the function above returns, step by step.\n",
    "\n# Rewrite it without a loop.\n",
    "\n# What happens when the list is empty?\n",
    "\n# Add type hints and a docstring.\n",
]
COLUMNS = ["turn", "context", "capacity", "symbolic s", "symbolic graphs"]
COLUMNS += ["per capacity s", "per capacity graphs"]


@contextlib.contextmanager
def graphs_per_capacity() -> Iterator[None]:
    """Every capacity compiles its own graphs: the capacity is a static size again (in the buffers'
    shapes and the steps' key), as before it was symbolic."""
    with mock.patch.object(layout, "symbolic_capacity", lambda device: False):
        yield


def _graphs() -> int:
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--passes", type=int, default=5, help="interleaved timed passes of the last turn")
    parser.add_argument("--stem", default="capacity_cpu", help="result file name under bench/results")
    args = parser.parse_args()
    warnings.simplefilter("ignore")  # HF's notices; the outputs are compared below
    symbolic = zoo.load("s")
    per_capacity = copy.deepcopy(symbolic)  # its own runner, caches and compiled steps
    tokenizer = zoo.load_tokenizer()
    options = {"do_sample": False, "max_new_tokens": NEW_TOKENS, "eos_token_id": None}
    ours = {"custom_generate": hsd_fast.generate, "compile": True, "drafts": ["lookup"], "T": [8], **options}
    modes = {
        "symbolic": (symbolic, contextlib.nullcontext),
        "per capacity": (per_capacity, graphs_per_capacity),
    }

    rows, ids = [], tokenizer(PROMPT, return_tensors="pt")["input_ids"]
    for turn, question in enumerate([None, *QUESTIONS], start=1):
        if question is not None:
            ids = torch.cat([ids, tokenizer(question, return_tensors="pt")["input_ids"]], 1)
        expected = symbolic.generate(ids, **options)
        capacity = layout.capacity_bucket(ids.shape[1] + NEW_TOKENS + 1)
        row = {"turn": turn, "context": ids.shape[1], "capacity": capacity}
        for name, (model, mode) in modes.items():
            before, begin = _graphs(), time.perf_counter()
            with mode():
                out = model.generate(ids, **ours)
            row[f"{name} s"] = round(time.perf_counter() - begin, 1)
            row[f"{name} graphs"] = _graphs() - before
            if out.tolist() != expected.tolist():
                raise SystemExit(f"turn {turn}, {name}: the output differs from HF generate's")
        print(row, flush=True)
        rows.append(row)
        ids = expected

    last = ids[:, :-NEW_TOKENS]  # the last turn's prompt, decoded again with every graph warm
    seconds: dict[str, list[float]] = {name: [] for name in modes}
    for p in range(args.passes):
        for name in list(modes) if p % 2 == 0 else list(reversed(modes)):
            model, mode = modes[name]
            with mode():
                begin = time.perf_counter()
                model.generate(last, **ours)
                seconds[name].append(time.perf_counter() - begin)
    median = {name: statistics.median(times) for name, times in seconds.items()}
    total = {name: sum(row[f"{name} s"] for row in rows) for name in modes}
    meta = run_meta(
        "cpu", dtype="float32", batch=1, new_tokens=NEW_TOKENS, passes=args.passes, compiled=True,
        threads=torch.get_num_threads(), hierarchy="lookup > s T=8",
    )  # fmt: skip
    notes = [
        f"A conversation of {len(rows)} turns on the zoo's s, {NEW_TOKENS} new tokens a turn; every answer",
        "equal to HF's greedy one. Seconds per turn include compiling.",
        f"Whole conversation: symbolic {total['symbolic']:.0f} s, "
        f"per capacity {total['per capacity']:.0f} s.",
        f"Last turn again, warm (median of {args.passes} interleaved passes): symbolic "
        f"{median['symbolic'] * 1e3:.0f} ms, per capacity {median['per capacity'] * 1e3:.0f} ms "
        f"({median['per capacity'] / median['symbolic']:.3f}x).",
    ]
    write_results(args.stem, "A conversation that crosses capacity sizes", notes, COLUMNS, rows, meta)


if __name__ == "__main__":
    main()
