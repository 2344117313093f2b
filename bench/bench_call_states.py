"""The lookup level's calls by what came before them, and what the latency model makes of it
(docs/design.md §8.10, *After a whole take, after a miss*).

    python bench/bench_model_error.py --cache twin_costs.json --observations model_error.pkl  # 6-10 min
    python bench/bench_call_states.py --observations model_error.pkl  # about a minute

1. The profile's replay of the lookup level (``proposal_scores.replay`` on the zoo target's own
   128-token continuations of the calibration windows, as ``select_hierarchy`` profiles it, block 8)
   with each call put in one of three states by the call before it in its row: the row's first,
   after a call the text took whole (it offered tokens and all of them were the text's), after a
   miss (it offered nothing, or a token the text did not have). Per state: calls, the share that
   offer nothing, the mean length offered, and each model's rate per position on them.
2. The recording of ``bench_model_error.py`` replayed through controllers whose prior for the
   lookup's calls under a middle model (``lookup > m > s``) differs:

   - ``controller``: as the controller has it (later calls: the first calls' estimate);
   - ``later after a miss``: the later calls of m's run (after m's own token) priced from the
     profile's calls after a miss;
   - ``first mixed, the run's share``: besides, the first calls of m's run (after the target's
     verification) as the calls after a whole take with probability w, after a miss otherwise, w the
     share of the run's target verifications that took the whole block (measured on the run it
     predicts: an oracle, to see what knowing w would be worth);
   - ``first mixed, the profile's share``: the same at the profile's own share of calls after a
     whole take (a w fixed before the request).

   Each at the prior counted as ``--priors`` trials (1e6: the profile alone, as the selector sees it
   before a request). Per variant: the rms of log(delivered / modelled) over all runs, over the
   middle chains, per text set, and the pairs of chains on one set ordered right.

Writes bench/results/call_states_twin_cpu.{json,md} (``--stem`` names them otherwise).
"""

from __future__ import annotations

import argparse
import copy
import math
import pickle
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from bench_model_error import CHAINS, LOOKUP, FixedChain, _rounds_of, marked, replay, summary
from kernel_bench import run_meta, write_results

import hsd_fast.run_estimates as estimates_module
from hsd_fast import proposal_scores, zoo
from hsd_fast.latency import LaterCalls
from hsd_fast.lookup import LookupDraft
from hsd_fast.processors import LogitsTransform
from hsd_fast.profile import proposal_replay, run_text
from hsd_fast.profile.acceptance_rates import teacher_forced_scores
from hsd_fast.zoo.calibration import read_calibration

STATES = ("first", "after a whole take", "after a miss")
MODELS = {1: "xxs", 2: "xs", 3: "s"}  # candidate index -> zoo model (3: the target, as its twin decodes)
MAX_T = 8  # the profile's block (the zoo profile's lookup entries are replayed at T8)
NEW_TOKENS = 128


def profile_states() -> dict[str, dict]:
    """Per state (``STATES``): the calls, the lengths they offer (``proposal_replay.offered_lengths``)
    and each model's rates per position on them (``proposal_scores.acceptance_by_position``)."""
    windows = read_calibration(zoo.zoo_dir())
    prompts = torch.cat([w[:, :128] for w in windows.values()])
    models = {name: zoo.load(name) for name in MODELS.values()}
    text = run_text.continued(models["s"], prompts, NEW_TOKENS, do_sample=False)  # [N, L]
    calls = proposal_scores.replay(LookupDraft(), text, MAX_T, start=run_text.continuation_start(prompts))
    rows = text.tolist()
    states, before = [], None
    for call in calls:  # ordered by row and position
        if before is None or before.row != call.row:
            states.append(STATES[0])
        else:
            taken = 0
            while taken < len(before.tokens) and before.tokens[taken] == rows[before.row][before.t + taken]:
                taken += 1
            whole = 0 < len(before.tokens) == taken
            states.append(STATES[1] if whole else STATES[2])
        before = call
    vocab = models["s"].get_output_embeddings().weight.shape[0]
    scores = {n: teacher_forced_scores(m, text, LogitsTransform(), True, vocab) for n, m in models.items()}
    out = {}
    for state in STATES:
        chosen = [c for c, s in zip(calls, states, strict=True) if s == state]
        rates = {
            n: proposal_scores.acceptance_by_position(chosen, text, sc, MAX_T) for n, sc in scores.items()
        }
        out[state] = {"calls": len(chosen), "lengths": proposal_replay.offered_lengths(chosen, MAX_T)}
        out[state]["rates"] = rates
    return out


class LaterFromProfile(FixedChain):
    """``FixedChain`` whose prior for a lookup's later calls under model m is the profile's calls
    after a miss (``after_miss``: m -> (lengths, rates)), the run's later calls counted on top as the
    controller counts them."""

    after_miss: dict[int, tuple[tuple[float, ...], tuple[float, ...]]]

    def later_calls(self, p: int, m: int, alpha) -> LaterCalls:
        return self._later_calls_over(p, m, *self.after_miss[m])


def mixed(states: dict, w: float, model: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Lengths and ``model``'s rates per position of calls that come after a whole take with
    probability ``w`` and after a miss otherwise: lengths mixed, each position's rate weighted by how
    often each state's proposals reach it (``run_estimates._reached``)."""
    parts = [(w, states[STATES[1]]), (1.0 - w, states[STATES[2]])]
    lengths = sum(f * np.asarray(s["lengths"]) for f, s in parts)
    reach = [f * estimates_module._reached(s["rates"][model], s["lengths"]) for f, s in parts]  # [P] each
    taken = sum(r * np.asarray(s["rates"][model]) for r, (_, s) in zip(reach, parts, strict=True))
    rates = np.divide(taken, sum(reach), out=np.asarray(parts[1][1]["rates"][model]), where=sum(reach) > 0)
    return tuple(float(p) for p in lengths / lengths.sum()), tuple(float(r) for r in rates)


def variant(fresh: FixedChain, states: dict, name: str, choice, seen: list) -> FixedChain:
    """``fresh`` as ``name`` (module doc) has it for one run of ``choice``."""
    if name == "controller" or not (len(choice.drafts) == 2 and choice.drafts[0] == LOOKUP):
        return fresh
    m = choice.drafts[1]
    out = LaterFromProfile.__new__(LaterFromProfile)  # the recorded controller's state, another class
    out.__dict__.update(copy.deepcopy(fresh.__dict__))
    after_miss = states[STATES[2]]
    out.after_miss = {k: (after_miss["lengths"], after_miss["rates"][model]) for k, model in MODELS.items()}
    if name.startswith("first mixed"):
        if name.endswith("the run's share"):
            rounds = _rounds_of(seen, choice)
            blocks = np.concatenate([r.verified[-1] for r in rounds])
            w = float(np.mean(np.concatenate([r.accepted[-1] for r in rounds]) >= blocks))
        else:
            w = states[STATES[1]]["calls"] / (states[STATES[1]]["calls"] + states[STATES[2]]["calls"])
        lengths, rates = mixed(states, w, MODELS[m])
        out.estimates.prior_costs[LOOKUP] = replace(out.estimates.prior_costs[LOOKUP], lengths=lengths)
        out.estimates.prior_alpha[LOOKUP][m] = rates
    return out


VARIANTS = (
    "controller",
    "later after a miss",
    "first mixed, the run's share",
    "first mixed, the profile's share",
)


class _Recording(pickle.Unpickler):
    """Reads ``bench_model_error.py``'s recording, whose controllers were pickled as ``__main__``'s."""

    def find_class(self, module: str, name: str):
        return super().find_class("bench_model_error" if module == "__main__" else module, name)


def rms(errors: dict) -> float:
    return float(np.sqrt(np.mean([math.log(e["delivered"] / e["modelled"]) ** 2 for e in errors.values()])))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--observations", type=Path, required=True, help="bench_model_error.py's recording")
    parser.add_argument("--priors", type=float, nargs="+", default=[1e6, estimates_module.PRIOR_TOKENS, 4])
    parser.add_argument("--stem", default="call_states_twin_cpu", help="the result files' name")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    torch.set_grad_enabled(False)
    with args.observations.open("rb") as file:
        recorded = _Recording(file).load()
    states = profile_states()
    rows = [
        {"state": state, "calls": s["calls"], "offers nothing": round(s["lengths"][0], 3)}
        | {"mean length offered": round(sum(b * p for b, p in enumerate(s["lengths"])), 2)}
        | {f"{name} rates": " ".join(f"{r:.2f}" for r in s["rates"][name]) for name in MODELS.values()}
        for state, s in states.items()
    ]
    notes, replays = [], []
    for prior in args.priors:
        for name in VARIANTS:
            errors = {
                key: replay(
                    variant(recorded["fresh"], states, name, CHAINS[key[1]], seen),
                    CHAINS[key[1]],
                    marked(seen, CHAINS[key[1]]),
                    prior,
                )
                for key, seen in recorded["runs"].items()
            }
            overall, right, ranked = summary(errors)
            middle = {k: e for k, e in errors.items() if len(CHAINS[k[1]].drafts) == 2}
            row = {"prior": prior, "variant": name, "rms": round(overall, 3)}
            row |= {
                "rms, middle chains": round(rms(middle), 3),
                "pairs ordered right": f"{right} of {ranked}",
            }
            for text in sorted({k[0] for k in errors}):
                row[f"rms, {text}"] = round(rms({k: e for k, e in errors.items() if k[0] == text}), 3)
            replays.append(row)
            print(row, flush=True)
    notes.append(
        f"The profile's replay of the lookup level (block {MAX_T}) on the zoo target's {NEW_TOKENS}-token "
        "continuations of the calibration windows, its calls by the call before them in their row; "
        "rates per position 1..8 (greedy). Then the recording replayed under each variant "
        "(bench_call_states.py's doc); the rms of log(delivered / modelled)."
    )
    meta = run_meta("cpu", batch=1, sampling={"do_sample": False}, compiled=False)
    meta["recording"] = str(args.observations)
    write_results(args.stem, "The lookup level's calls by state", notes, ["state"], rows, meta)
    replay_stem = f"{args.stem}_replay"
    write_results(
        replay_stem, "The latency model's error by prior", notes, ["prior", "variant"], replays, meta
    )


if __name__ == "__main__":
    main()
