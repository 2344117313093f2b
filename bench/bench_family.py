"""The zoo as a real family on a GPU: the target ``s`` as its cost twin of a Llama-3-8B body, ``sm`` as
a Llama-3.2-1B body, ``xs`` and ``xxs`` as they are, and the lookup level; bf16, greedy.

Rows run in a fixed order (the cheapest and most telling first: batch 1, then batch 16, then what
compiles long). Each row is warmed up until nothing compiles, timed over ``--passes`` calls, compared
with HF ``generate`` on the same prompts, and written at once (``rows.jsonl`` and the report), so a
run cut off by its time limit keeps every row it finished. While time is left at the end, every
finished row is timed again, all rows in a rotated order per pass, and its median taken over all its
calls. In bf16 a greedy output may leave HF's at a numerical near-tie (README, "Precision"): a row
that differs names the first differing position and the target's logit gap there in bf16 units in
the last place (ulps) of the larger logit.

    python bench/bench_family.py [--out DIR] [--budget 450] [--only SUBSTRING ...] [--small] [--eager]

``--small`` builds tiny twins and ``--eager`` leaves our steps uncompiled (a quick CPU check of the
script: ``--small --eager --context 64 --new-tokens 16 --passes 1``). Writes DIR/rows.jsonl,
DIR/family_<device>.{json,md} and DIR/profiles.txt (the profiler's tables of our rows' profiled calls;
default DIR: bench/results).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from bench_attention_e2e import prompts_of

from hsd_fast import zoo
from hsd_fast.bench import configs
from hsd_fast.bench.gpu_busy import kernel_tables, profiled
from hsd_fast.profile.costs import synchronize, warm_up
from hsd_fast.report import markdown_table, run_metadata, write_report
from hsd_fast.zoo.twin import FAMILY_SHAPES

GREEDY = {"do_sample": False}

# name, batch, how to build its Config from (models, new_tokens, our steps compiled)
Row = tuple[str, int, Callable[[dict, int, bool], configs.Config]]


def _ours(chain: tuple[str, ...], T: list[int]) -> Callable[[dict, int, bool], configs.Config]:
    return lambda m, n, c: configs.ours(m["target"], m, chain, T, GREEDY, n, compile=c)


def _assisted(num_tokens: int | None) -> Callable[[dict, int, bool], configs.Config]:
    return lambda m, n, c: configs.hf_assisted(m["target"], "sm", m["sm"], GREEDY, n, num_tokens)


ROWS: list[Row] = [
    ("HF generate", 1, lambda m, n, c: configs.hf_generate(m["target"], GREEDY, n)),
    ("ours, no draft", 1, _ours((), [])),
    ("ours, sm > target T=[4]", 1, _ours(("sm",), [4])),
    ("ours, xs > target T=[4]", 1, _ours(("xs",), [4])),
    ("ours, lookup > target T=[7]", 1, _ours(("lookup",), [7])),  # the zoo's pick on a CPU
    ("ours, lookup > xs > target T=[8, 4]", 1, _ours(("lookup", "xs"), [8, 4])),
    (  # the same graphs, every step read by the host before the next launch (docs/design.md §3.8)
        "ours, xs > target T=[4], steps read one at a time",
        1,
        lambda m, n, c: configs.steps_read_one_at_a_time(_ours(("xs",), [4])(m, n, c)),
    ),
    ("HF assisted, sm (default schedule)", 1, _assisted(None)),
    ("HF assisted, sm (4 tokens)", 1, _assisted(4)),
    ("HF prompt lookup (10 tokens)", 1, lambda m, n, c: configs.hf_lookup(m["target"], GREEDY, n)),
    ("ours, xs > sm > target T=[2, 4]", 1, _ours(("xs", "sm"), [2, 4])),
    ("HF generate", 16, lambda m, n, c: configs.hf_generate(m["target"], GREEDY, n)),
    ("ours, no draft", 16, _ours((), [])),
    ("ours, xs > target T=[3]", 16, _ours(("xs",), [3])),
    ("HF generate, compiled static cache", 1, lambda m, n, c: configs.hf_compiled(m["target"], GREEDY, n)),
    ("ours, sm > target T=[3]", 16, _ours(("sm",), [3])),
    ("ours, xxs > sm > target T=[2, 3]", 16, _ours(("xxs", "sm"), [2, 3])),
    ("ours, xxs > xs > sm > target T=[2, 2, 4]", 1, _ours(("xxs", "xs", "sm"), [2, 2, 4])),
    (
        "ours, adaptive over xxs, xs, sm",
        1,
        lambda m, n, c: configs.ours_adaptive(m["target"], m, ("xxs", "xs", "sm"), GREEDY, n, compile=c),
    ),
    # last, as it is a question, not a target: deeper lookup blocks verify 1.11-1.41x the tokens per
    # forward of T=8 on the varied text (docs/design.md §10.4), for a forward of 17 tokens that on a
    # GPU at batch 1 should cost about what one of 8 does
    ("ours, lookup > target T=[16]", 1, _ours(("lookup",), [16])),
]  # fmt: skip


def load_family(device: str, small: bool) -> dict[str, torch.nn.Module]:
    """The family in bf16 on ``device``: twins built there (no host copy of their weights)."""
    dtype = torch.bfloat16
    models = {name: zoo.load(name, dtype, device) for name in ("xxs", "xs")}
    if small:  # the same code paths at a CPU's size: larger heads regrouped, nothing else grown
        models["sm"] = zoo.cost_twin(zoo.load("sm", dtype, device), num_kv_heads=6, num_heads=12, head_dim=64)
        models["target"] = zoo.cost_twin(
            zoo.load("s", dtype, device), head_dim=128, num_heads=16, num_kv_heads=8
        )
    else:
        models["sm"] = zoo.cost_twin(zoo.load("sm", dtype, device), shape="llama-3.2-1b")
        models["target"] = zoo.cost_twin(zoo.load("s", dtype, device), shape="llama-3-8b")
    return models


def ulps_apart(target: torch.nn.Module, prompt: torch.Tensor, reference: list[int], got: list[int]) -> dict:
    """Where ``got`` first leaves ``reference``, and the target's logit gap between the two tokens
    there, in bf16 ulps of the larger logit (HF's eager forward over the reference prefix)."""
    pairs = enumerate(zip(reference, got, strict=False))
    at = next((i for i, (a, b) in pairs if a != b), min(len(reference), len(got)))
    if at == len(reference) or at == len(got):  # one ends early: no token to compare there
        return {"first_difference": at, "gap_ulps": None}
    ids = torch.cat([prompt, torch.tensor(reference[:at], dtype=prompt.dtype, device=prompt.device)])
    with torch.no_grad():
        logits = target(ids[None]).logits[0, -1].float()
    high = logits[reference[at]].abs().clamp_min(1e-3)
    ulp = 2.0 ** (torch.floor(torch.log2(high)) - 7)  # bf16 keeps 8 significant bits
    return {
        "first_difference": at,
        "gap_ulps": round(float((logits[reference[at]] - logits[got[at]]) / ulp), 2),
    }


class FamilyBench:
    """Runs the rows in order and keeps the report current after every row."""

    def __init__(self, args: argparse.Namespace, device: str) -> None:
        self.args, self.device = args, device
        self.models = load_family(device, args.small)
        self.prompts = {b: [p.to(device) for p in prompts_of(args.context, b)] for b in (1, 16)}
        self.references: dict[int, list[list[int]]] = {}
        self.results: list[dict] = []  # a finished row keeps its call under "run"
        self.tables: list[str] = []  # the profiler's tables of our rows' profiled calls
        self.started = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def call(self, config: configs.Config, batch: int) -> Callable[[], list[list[int]]]:
        prompts = self.prompts[batch]
        ids = torch.stack(prompts)
        mask = torch.ones_like(ids)

        def run() -> list[list[int]]:
            sequences, _ = config.generate(ids, mask)
            synchronize(torch.device(self.device))
            return sequences[:, ids.shape[1] :].tolist()

        return run

    def timed(self, run: Callable[[], object]) -> float:
        synchronize(torch.device(self.device))
        start = time.perf_counter()
        run()
        return time.perf_counter() - start

    def measure(self, name: str, batch: int, build: Callable[[dict, int, bool], configs.Config]) -> None:
        config = build(self.models, self.args.new_tokens, not self.args.eager)
        run = self.call(config, batch)
        start = time.perf_counter()
        out = run()
        warm_up(run)
        warm = time.perf_counter() - start
        seconds = [self.timed(run) for _ in range(self.args.passes)]
        busy = None
        if name.startswith("ours"):  # one more call under the profiler: the GPU's busy share
            prof, busy = profiled(run, torch.device(self.device))
            tables = kernel_tables(prof, cuda=self.device == "cuda")
            self.tables.append(f"## {name}, batch {batch}\n\n{tables}")
        reference = self.references.setdefault(batch, out)  # the first row of a batch is HF generate
        row = {"config": name, "batch": batch, "warm_up_s": round(warm, 1), "seconds": seconds, "run": run}
        if busy is not None:
            row["gpu_kernels_s"] = busy.kernels_s
        differing = [i for i, (a, b) in enumerate(zip(reference, out, strict=True)) if a != b]
        row["equal_to_hf"] = not differing
        if differing:
            i = differing[0]
            row["row_differing"] = i
            row |= ulps_apart(self.models["target"], self.prompts[batch][i], reference[i], out[i])
        self.results.append(row)

    def more_passes(self) -> int:
        """Every finished row timed again per pass, in a rotated order, while the budget lasts."""
        passes = 0
        while self.elapsed() < self.args.budget - self._pass_seconds():
            finished = [r for r in self.results if "run" in r]
            turn = passes % max(len(finished), 1)
            for row in finished[turn:] + finished[:turn]:
                row["seconds"].append(self.timed(row["run"]))
            passes += 1
            self.write()
        return passes

    def _pass_seconds(self) -> float:
        return sum(statistics.median(r["seconds"]) for r in self.results if "run" in r) * 1.2

    def write(self) -> None:
        out = Path(self.args.out)
        out.mkdir(parents=True, exist_ok=True)
        rows = [self._summary(r) for r in self.results]
        with open(out / "rows.jsonl", "w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
        (out / "profiles.txt").write_text("\n\n\n".join(self.tables))
        columns = [
            "batch",
            "config",
            "tok_s",
            "x_hf",
            "x_no_draft",
            "gpu_busy",
            "calls",
            "warm_up_s",
            "equal_to_hf",
            "note",
        ]
        columns += ["error"] * any("error" in r for r in rows)
        table = markdown_table(columns, [[r.get(c, "") for c in columns] for r in rows])
        shape = "tiny twins (--small)" if self.args.small else f"target {FAMILY_SHAPES['llama-3-8b']}"
        meta = run_metadata(
            self.device,
            models=f"{shape}; sm {FAMILY_SHAPES['llama-3.2-1b']}; xs, xxs as they are; bf16",
            context=self.args.context,
            new_tokens=self.args.new_tokens,
            elapsed_s=round(self.elapsed()),
        )
        notes = [
            "Greedy, our steps compiled (CUDA graphs on CUDA). `tok_s`: new tokens per second over the "
            "batch, median of the calls after warm-up; `x_hf` / `x_no_draft`: against HF `generate` / "
            "our no-draft decoding at the same batch. `gpu_busy`: the share of a call's wall time in "
            "which some kernel ran (one profiled call after the timed ones, against their median). "
            "`note`: where an output leaves HF's (row, first position, the target's logit gap there in "
            "bf16 ulps)."
        ]
        write_report(
            out / f"family_{self.device}",
            "The family at real shapes",
            meta,
            [*notes, "", *table],
            {"rows": rows},
        )

    def _summary(self, row: dict) -> dict:
        tokens = row["batch"] * self.args.new_tokens
        summary = {k: v for k, v in row.items() if k not in ("seconds", "run")}
        if "run" not in row:  # failed: its error is the row
            return summary
        summary |= {"tok_s": tokens / statistics.median(row["seconds"]), "calls": len(row["seconds"])}
        if "gpu_kernels_s" in row:
            summary["gpu_busy"] = row["gpu_kernels_s"] / statistics.median(row["seconds"])
        for key, base in (("x_hf", "HF generate"), ("x_no_draft", "ours, no draft")):
            match = [
                r for r in self.results if r["config"] == base and r["batch"] == row["batch"] and "run" in r
            ]
            if match:
                summary[key] = statistics.median(match[0]["seconds"]) / statistics.median(row["seconds"])
        if "first_difference" in row:
            summary["note"] = (
                f"row {row['row_differing']} at {row['first_difference']}, {row['gap_ulps']} ulps"
            )
        return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--budget", type=float, default=450.0, help="seconds: no row starts after this")
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument(
        "--only", nargs="+", help="rows whose name contains one of these (HF generate always)"
    )
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--small", action="store_true", help="tiny twins: a CPU check of the script")
    parser.add_argument("--eager", action="store_true", help="our steps not compiled (a quick CPU check)")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    bench = FamilyBench(args, device)
    print(f"[{bench.elapsed():.0f} s] models built on {device}", flush=True)
    for name, batch, build in ROWS:
        wanted = name == "HF generate" or not args.only or any(part in name for part in args.only)
        if not wanted or batch not in args.batch:
            continue
        if bench.elapsed() > args.budget:
            print(f"[{bench.elapsed():.0f} s] budget spent: {name} (batch {batch}) and later rows not run")
            break
        try:
            bench.measure(name, batch, build)
        except Exception as err:  # the report says which row failed and why; the others still run
            bench.results.append(
                {"config": name, "batch": batch, "error": f"{type(err).__name__}: {err}"[:300]}
            )
            print(f"failed {name} (batch {batch}): {type(err).__name__}: {err}"[:2000], flush=True)
        bench.write()
        print(f"[{bench.elapsed():.0f} s] {bench._summary(bench.results[-1])}", flush=True)
    print(f"[{bench.elapsed():.0f} s] {bench.more_passes()} more passes over every row", flush=True)
    bench.write()


if __name__ == "__main__":
    main()
