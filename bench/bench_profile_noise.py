"""How precise the selector's step costs are: the zoo's models timed by ``forward_costs`` with a fixed
five rounds (what the profiler did before ``NOISE_GOAL``) and with rounds added while the noise is above
the goal (the default), in turn, several passes each, in one process.

Per model and method: the noise the profile reports (the largest relative standard error of a step's
median, plain and crowded), the seconds the timing took, and how far the passes' medians of the same
step land apart (the largest over steps of max / min - 1): the reproducibility the reported noise
stands for. Eager steps (a compiled profile compiles every shape again in each pass).

    python bench/bench_profile_noise.py            # xxs, xs, sm, s; 3 passes; about 2 minutes

Writes bench/results/profile_noise_cpu.{json,md}.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import torch
from kernel_bench import run_meta, write_results

from hsd_fast import zoo
from hsd_fast.profile import costs
from hsd_fast.profile.costs import crowd_bytes, forward_costs

METHODS = {"five rounds": float("inf"), "rounds to the goal": costs.NOISE_GOAL}
COLUMNS = [
    "model", "method", "noise (median of passes)", "crowded noise", "seconds per profile",
    "passes apart (worst step)",
]  # fmt: skip


@contextlib.contextmanager
def noise_goal(goal: float):
    """The profiler's goal set to ``goal`` for a block (inf: stop after ``repeats`` rounds)."""
    kept = costs.NOISE_GOAL
    costs.NOISE_GOAL = goal
    try:
        yield
    finally:
        costs.NOISE_GOAL = kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["xxs", "xs", "sm", "s"], help="zoo models to time")
    parser.add_argument("--passes", type=int, default=3, help="profiles per model and method (>= 2)")
    parser.add_argument("--context", type=int, default=96, help="cached tokens before each step")
    parser.add_argument("--stem", default="profile_noise_cpu", help="result file name under bench/results")
    args = parser.parse_args()
    if args.passes < 2:
        parser.error("--passes must be at least 2 (the passes' spread is what is measured)")
    torch.manual_seed(0)
    models = {name: zoo.load(name) for name in args.models}
    crowds = dict(zip(models, crowd_bytes(list(models.values())), strict=True))
    runs: dict[tuple[str, str], list] = {(m, method): [] for m in models for method in METHODS}
    for p in range(args.passes):
        for name, model in models.items():
            order = list(METHODS) if p % 2 == 0 else list(reversed(METHODS))  # neither always first
            for method in order:
                with noise_goal(METHODS[method]):
                    begin = time.perf_counter()
                    profile = forward_costs(model, context=args.context, crowd_bytes=crowds[name])
                    runs[name, method].append((profile, time.perf_counter() - begin))
                print(f"pass {p} {name} {method}: noise {profile.noise:.3f}", flush=True)
    rows = []
    for (name, method), profiles in runs.items():
        steps = [p.seconds + p.draft_seconds for p, _ in profiles]
        apart = max(max(s) / min(s) - 1 for s in zip(*steps, strict=True))
        rows.append({
            "model": name,
            "method": method,
            "noise (median of passes)": round(statistics.median(p.noise for p, _ in profiles), 3),
            "crowded noise": round(statistics.median(p.crowded.noise for p, _ in profiles), 3),
            "seconds per profile": round(statistics.median(s for _, s in profiles), 1),
            "passes apart (worst step)": round(apart, 3),
        })  # fmt: skip
    meta = run_meta(
        "cpu", dtype="float32", batch=1, context=args.context, passes=args.passes, compiled=False,
        threads=torch.get_num_threads(), noise_goal=costs.NOISE_GOAL, max_repeats=costs.MAX_REPEATS,
        extra_seconds=costs.EXTRA_SECONDS,
    )  # fmt: skip
    notes = [
        f"The zoo's models ({', '.join(models)}), eager, {args.passes} profiles per model and method, the",
        "methods in turn. `noise`: the largest relative standard error of a step's median that the",
        "profile reports (crowded: the steps timed after the other models' weights went through the",
        "cache); `passes apart`: over the steps, the largest max / min - 1 of the passes' medians.",
    ]
    title = "Step costs: five rounds or rounds to the noise goal"
    write_results(args.stem, title, notes, COLUMNS, rows, meta)


if __name__ == "__main__":
    main()
