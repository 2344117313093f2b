"""How much an early-exit level could earn on this machine if the zoo had a deeper target trained for
exits: issue 43's question "would a deeper `sx` reach the targets?", answered before spending the
hours of CPU training such a target would take.

An exit's step cost does not depend on its weights, so untrained targets of `sx`'s shape (hidden 256,
MLP 768, the zoo's 8,192-entry head) at several depths give every cost: the target's steps, each
exit's steps, and the target's verification from the exit's hidden states (``reuse_costs``, what the
engine runs under an exit). The latency model (``latency.expected_latency``, the selector's own) then
gives the speed-up of ``exitK > target`` over no-draft decoding for an agreement rate ``alpha``, at the
best block size T <= 6 and the better of reuse or recompute; and, per exit, the ``alpha`` it would need
to reach issue 43's bar: 1.15x the best chain without an exit. The bar is taken two ways: the model's
own prediction for ``xxs > target`` at the rate the zoo's ``xxs`` agrees with ``sx`` (a separate draft
of the kind the zoo has), and the best measured on real text (``lookup > sx``: 1.34-1.48x our no-draft
decoding in ``bench/results/early_exit_sx_crowd_*_cpu.md``; 1.42 is used). Beside it, what an exit at
that depth plausibly agrees: ``sx``'s card at the same fraction of the depth (``zoo/manifest.json``,
"exits"), an assumption (a deeper model trained the same way may do somewhat better).

    python bench/bench_exit_headroom.py                                  # eager steps, depths 6 and 12
    python bench/bench_exit_headroom.py --twin --compile --depths 12 --stem exit_headroom_twin_compiled_cpu

Writes bench/results/<stem>.{json,md}.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import warnings

import torch
from kernel_bench import run_meta, write_results

import hsd_fast
from hsd_fast import zoo
from hsd_fast.latency import decode_seconds, expected_latency
from hsd_fast.profile.costs import CostProfile, forward_costs, reuse_costs
from hsd_fast.zoo.models import SIZES, Shape, new_model

VOCAB = 8192
MEASURED_BEST_WITHOUT = 1.42  # lookup > sx over our no-draft decoding, eager (see the docstring)
BAR = 1.15  # issue 43: the best chain with an exit >= 1.15x the best without
ALPHAS = [round(0.40 + 0.01 * i, 2) for i in range(60)]  # 0.40 .. 0.99
COLUMNS = [
    "depth", "exit", "exit cost / target", "alpha needed (vs xxs > t)", "alpha needed (vs measured)",
    "sx's alpha at that depth", "speed-up at sx's alpha", "T",
]  # fmt: skip


def best_speedup(exit_cost: CostProfile, target: CostProfile, reused: CostProfile, alpha: float) -> tuple:
    """The latency model's best speed-up of ``exit > target`` over no-draft decoding: (speed-up, T,
    how the target verifies)."""
    reusing = dataclasses.replace(exit_cost, reused_by=((target, reused),))
    options = [
        (decode_seconds(target) / expected_latency([cost, target], [alpha], [T]), T, way)
        for T in range(1, 7)
        for cost, way in ((reusing, "reuse"), (exit_cost, "recompute"))
    ]
    return max(options)


def alpha_needed(speedup_at, bar: float) -> float | None:
    """The smallest alpha on the grid at which ``speedup_at(alpha)`` reaches ``bar`` (None: never)."""
    return next((a for a in ALPHAS if speedup_at(a)[0] >= bar), None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--depths", type=int, nargs="+", default=[6, 12])
    parser.add_argument("--twin", action="store_true", help="hidden 768, MLP 2048 (zoo.cost_twin's shape)")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--stem", default="exit_headroom_cpu")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    torch.set_grad_enabled(False)
    card = json.loads((zoo.zoo_dir() / "manifest.json").read_text())["exits"]["sx"]
    sx_alpha = dict(zip(card["drafts"], card["greedy"], strict=True))  # "exit 2" -> 0.65, "xxs" -> 0.57
    # compiled, fewer shapes (each costs a compilation): the affine fits need two, T <= 6 reads n <= 7
    spans = {"spans": (1, 4, 8)} if args.compile else {}
    shapes = {**spans, "drafts": (1, 4)} if args.compile else {}
    timing = {"repeats": args.repeats, "compile": args.compile}
    draft = forward_costs(new_model(SIZES["xxs"], VOCAB, seed=0).eval(), **timing, **shapes)
    hidden, mlp = (768, 2048) if args.twin else (256, 768)
    rows, notes = [], []
    for depth in args.depths:
        target_model = new_model(Shape(hidden, depth, hidden // 64, mlp), VOCAB, seed=0).eval()
        target = forward_costs(target_model, **timing, **shapes)
        xxs = best_speedup(draft, target, target, sx_alpha["xxs"])[0]  # a separate draft: no reuse
        bar = BAR * xxs
        notes.append(
            f"Depth {depth}: target step {target.draft(1) * 1e3:.2f} ms; xxs step {draft.draft(1) * 1e3:.2f}"
            f" ms; xxs > t predicted {xxs:.2f}x no-draft at alpha {sx_alpha['xxs']}, so the bar is "
            f"{bar:.2f}x (vs xxs) or {BAR * MEASURED_BEST_WITHOUT:.2f}x (vs measured lookup > sx)."
        )
        for k in sorted({max(1, depth // 6), depth // 3, depth // 2}):
            exit_model = hsd_fast.EarlyExit(target_model, k)
            exit_cost = forward_costs(exit_model, **timing, **shapes)
            reused = reuse_costs(target_model, exit_model, **timing, **spans)
            at = functools.partial(best_speedup, exit_cost, target, reused)  # alpha -> (speed-up, T, way)
            plausible = sx_alpha.get(f"exit {round(6 * k / depth)}")
            speedup, T, way = at(plausible) if plausible else (None, None, None)
            rows.append({
                "depth": depth,
                "exit": k,
                "exit cost / target": round(exit_cost.draft(1) / target.draft(1), 3),
                "alpha needed (vs xxs > t)": alpha_needed(at, bar),
                "alpha needed (vs measured)": alpha_needed(at, BAR * MEASURED_BEST_WITHOUT),
                "sx's alpha at that depth": plausible,
                "speed-up at sx's alpha": None if speedup is None else round(speedup, 3),
                "T": None if T is None else f"{T} ({way})",
            })  # fmt: skip
            print(rows[-1], flush=True)
    notes.append(
        "alpha: the rate at which the target accepts each exit token (greedy agreement); None: not "
        "reached below 1.0. Costs from untrained models (a step's cost does not depend on its weights); "
        "speed-ups from the latency model, not measured."
    )
    shape = f"hidden {hidden}, MLP {mlp}, vocabulary {VOCAB}"
    meta = run_meta(
        "cpu", batch=1, dtype="float32", compiled=args.compile, threads=torch.get_num_threads(),
        target=f"untrained, {shape}", depths=args.depths,
    )  # fmt: skip
    title = "Early exits of deeper targets: what they could earn"
    write_results(args.stem, title, notes, COLUMNS, rows, meta)


if __name__ == "__main__":
    main()
