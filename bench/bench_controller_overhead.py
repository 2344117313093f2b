"""What the latency controller costs where it has nothing to change: the zoo's prompt sets, where the
selector's pick (`lookup > s`) is right on every set, compiled, batch 1. Four ways, interleaved per
request (every way serves a request, rotated, before any serves the next):

- the static pick (``hierarchy=pick``);
- the adaptive engine never looking (a policy that keeps the pick, ``look_every`` beyond the
  request): what the adaptive machinery costs without a single look;
- the latency controller (``adapt=True, hierarchy=pick``'s policy, fresh here and kept across the
  requests as a served stream keeps it);
- the same controller with the request-start rule it had before 2026-12-05 (a decision before every
  request's first round, looks restarting at ``every``), as a subclass here.

    python bench/bench_controller_overhead.py            # 5 passes over 24 requests, ~1-2 minutes

Writes bench/results/controller_overhead_cpu.{json,md}: ms per request, x the static pick, the
looks' and probes' host ms per request, decisions per request, whether every output equals the
static pick's, and the hierarchies the adaptive ways committed their tokens under.
"""

from __future__ import annotations

import argparse
import statistics
import warnings
from collections import Counter
from collections.abc import Callable

import torch
from kernel_bench import run_meta, write_results

from hsd_fast import zoo
from hsd_fast.bench.mixed import choice_label, most_used
from hsd_fast.bench.scenarios import zoo_scenario
from hsd_fast.bench.timing import CpuMeter, interleaved
from hsd_fast.controller import LatencyController
from hsd_fast.hf_generate import generate
from hsd_fast.hierarchy import select_hierarchy
from hsd_fast.profile import ProfileCache
from hsd_fast.switching_types import Adaptive, Choice, Observation
from hsd_fast.zoo.calibration import read_calibration


class KeepsThePick:
    """A policy that never looks within a request: the adaptive engine's own cost."""

    look_every = 1 << 30

    def __init__(self, pick: Choice) -> None:
        self.pick = pick

    def __call__(self, seen: Observation) -> Choice:
        return self.pick


class DecidesEveryRequest(LatencyController):
    """The request-start rule before 2026-12-05: decide before every request's first round and look
    from ``every`` again."""

    def __call__(self, seen: Observation) -> Choice:
        before = self.current if seen.round > 0 else None
        self.current = self._decide(seen)
        self.steady = self.steady + 1 if self.current == before else 0
        self.interval = self._interval()
        return self.current


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--stem", default="controller_overhead_cpu")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    torch.set_grad_enabled(False)
    scenario = zoo_scenario()
    target = scenario.target
    candidates = ["lookup", *(scenario.drafts[n] for n in ("xxs", "xs", "sm"))]
    calibration = torch.cat(list(read_calibration(zoo.zoo_dir()).values()))
    cache = ProfileCache(fallbacks=[zoo.zoo_dir() / "profile_cpu.json"])
    pick = select_hierarchy(
        target, candidates, calibration, context=128, cache=cache, progress=False, compile=True,
        max_new_tokens=args.max_new_tokens,
    )  # fmt: skip
    start = Choice(tuple(pick.chain[:-1]), tuple(pick.T))  # candidate indices: the pick's chain
    work = [ids[None] for prompts in scenario.prompt_sets.values() for ids in prompts]
    common = {
        "do_sample": False,
        "max_new_tokens": args.max_new_tokens,
        "eos_token_id": None,
        "compile": True,
    }
    # the controller a user gets (``adapt=True, hierarchy=pick``: kept across calls), and the rule before
    before = DecidesEveryRequest.from_hierarchy(pick, candidates)
    controllers = {
        "latency controller": LatencyController.kept_for(pick, candidates, max_T=pick.profile.max_T),
        "latency controller, deciding every request (before)": before,
    }
    at = {"request": 0}
    outputs: dict[str, list] = {}
    spent: dict[str, Counter] = {}
    used: dict[str, Counter] = {}  # hierarchy -> tokens committed under it
    names = ["lookup", "xxs", "xs", "sm"]

    def run_of(name: str, options: Callable[[], dict]) -> Callable[[], None]:
        outputs[name], spent[name], used[name] = [None] * len(work), Counter(), Counter()

        def run() -> None:
            i = at["request"]
            out = target.generate(
                work[i], custom_generate=generate, output_hsd_stats=True, **common, **options()
            )
            outputs[name][i] = out.sequences
            spent[name]["look"] += out.hsd_stats.look_seconds
            spent[name]["probe"] += out.hsd_stats.probe_seconds
            spent[name]["calls"] += 1
            for stretch in out.hsd_stats.hierarchies or ():
                used[name][choice_label(stretch.choice, names, "s")] += stretch.committed

        return run

    never = Adaptive(KeepsThePick(start), start=start)
    runs = {
        "static pick": run_of("static pick", lambda: {"hierarchy": pick}),
        "adaptive, never looking": run_of(
            "adaptive, never looking", lambda: {"drafts": candidates, "adapt": never}
        ),
        "latency controller": run_of(
            "latency controller", lambda: {"drafts": candidates, "adapt": True, "hierarchy": pick}
        ),
        "latency controller, deciding every request (before)": run_of(
            "latency controller, deciding every request (before)",
            lambda: {  # as ``adapt=True, hierarchy=pick`` builds it: from the pick, then where it left off
                "drafts": candidates,
                "adapt": Adaptive(before, start=None if before.current is not None else start),
            },
        ),
    }

    def next_request(counted: int) -> None:
        at["request"] = (counted + 1) % len(work)

    timings = interleaved(list(runs.values()), args.passes * len(work), CpuMeter(), on_pass=next_request)
    total = {
        name: statistics.median(sum(t[k * len(work) : (k + 1) * len(work)]) for k in range(args.passes))
        for name, t in zip(runs, timings.seconds, strict=True)
    }
    rows = []
    for name in runs:
        control = controllers.get(name)
        rows.append({
            "config": name,
            "ms_per_request": round(1e3 * total[name] / len(work), 2),
            "x_static_pick": round(total["static pick"] / total[name], 3),
            "look_ms_per_request": round(1e3 * spent[name]["look"] / spent[name]["calls"], 2),
            "probe_ms_per_request": round(1e3 * spent[name]["probe"] / spent[name]["calls"], 2),
            "decisions_per_request": round(len(control.decisions) / spent[name]["calls"], 2)
            if control
            else None,
            "hierarchies": most_used(used[name]) if used[name] else None,
            "same_output": all(
                torch.equal(a, b) for a, b in zip(outputs[name], outputs["static pick"], strict=True)
            ),
        })  # fmt: skip
    meta = run_meta(
        "cpu", batch=1, dtype="float32", compiled=True, threads=torch.get_num_threads(),
        requests=f"{len(work)}: the zoo's prompt sets ({', '.join(scenario.prompt_sets)})",
        max_new_tokens=args.max_new_tokens, passes=args.passes, redone=timings.redone,
        recompiled=timings.recompiled,
    )  # fmt: skip
    chain = " > ".join(["lookup", "xxs", "xs", "sm", "s"][i] for i in pick.chain)
    notes = [
        f"Target s, candidates lookup, xxs, xs, sm (zoo); the pick {chain} T={list(pick.T)}. ms per "
        "request: the median over passes of a pass's seconds over every request, per request. Looks "
        "and probes: host time the run reports (`hsd_stats.look_seconds`, `probe_seconds`), per "
        "call (the warm-up's included).",
    ]
    write_results(
        args.stem, "The latency controller's cost where the pick is right", notes, ["config"], rows, meta
    )


if __name__ == "__main__":
    main()
