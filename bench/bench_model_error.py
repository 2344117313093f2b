"""Where the latency model errs, chain by chain, on the text a run decodes (docs/design.md, "Tokens that
came through", *In place*): fixed hierarchies decode each text set under a controller that never
switches, their observations are recorded, then replayed offline through fresh controllers, which
predict each look's seconds per token as an adaptive run would (on the estimates of that look).

    python bench/bench_model_error.py [--cache twin_costs.json] [--priors 32 4]

Target ``s`` as its cost twin (hidden 768, 12 layers, MLP 2048), candidates lookup, ``xxs``, ``xs``;
batch 1, greedy, fp32, eager, 3 prompts of 96 tokens per set (the varied-text sets and three of the
zoo's calibration windows), 128 new tokens. Per set and chain: the seconds per token delivered and
modelled, and, per target round, the tokens committed and the middle model's verifications against
the model's expectation on the estimates over the whole run (its trials not faded), both over every
round of the chain (a request's first and last included, as the estimates); for chains over the
lookup level, the share of its calls the level above took whole, overall and right after a call
it took whole (the model takes calls as independent), and, under a middle model, the first call of
each of its runs (right after the target's verification) against the later ones. Where each chain's
time went (the target's steps against the prior profile for their widths, the lookup's calls' and
the host work's shares) and the lookup's share of calls that match nothing, measured and as the
looks estimated it. The block the target verifies, and under a middle model over the lookup level
the target's rate on each kind of the middle's tokens (kept proposals, corrections, other own
tokens), measured and modelled. ``--priors``:
the replay is repeated with the prior's acceptance and proposal lengths counted as that many trials
and calls (``PRIOR_TOKENS``, ``PRIOR_CALLS``; the first is the controller's own). The decoding is recorded
to ``--observations`` (default: the temporary directory's ``model_error.pkl``), which a later run
with ``--replay-only`` replays without decoding (a recording made before the engine marked the
first verification of a middle model's run, ``Observation.opens``, gets the marks from the gains:
``marked``). The replay's controllers count a lookup's later calls under a middle model apart
(``LatencyController(later_calls_apart=True)``); ``--calls-alike`` counts them alike (the default
controller's way).
Writes bench/results/model_error_twin_cpu.{json,md} (``--stem`` names them otherwise).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import itertools
import math
import pickle
import tempfile
import warnings
from pathlib import Path

import numpy as np
import torch
from bench_adaptive import text_sets
from kernel_bench import run_meta, write_results

import hsd_fast
import hsd_fast.controller as controller_module
import hsd_fast.run_estimates as estimates_module
from hsd_fast import zoo
from hsd_fast.controller import LatencyController
from hsd_fast.hf_generate import generate
from hsd_fast.latency import (
    block_sizes,
    chain_rates,
    expected_gain,
    level_outcomes,
    mean_gain,
    sharing_the_cache,
    verifying_costs,
)
from hsd_fast.lookup import LookupDraft
from hsd_fast.profile import ProfileCache
from hsd_fast.switching_types import Choice, Observation
from hsd_fast.zoo.calibration import read_calibration

NEW_TOKENS = 128
CHAINS = {  # candidates: lookup 0, xxs 1, xs 2 (the target is 3)
    "lookup > s T=8": Choice((0,), (8,)),
    "lookup > xs > s T=8,7": Choice((0, 2), (8, 7)),
    "lookup > xxs > s T=6,3": Choice((0, 1), (6, 3)),
    "xs > s T=4": Choice((2,), (4,)),
    "xxs > s T=4": Choice((1,), (4,)),
    "no draft": Choice(),
}
LOOKUP = 0  # the lookup level's candidate index
APART = 0.05  # two chains are ranked when their delivered seconds per token differ by more than this


class FixedChain(LatencyController):
    """A controller that learns and predicts as the adaptive one does but keeps ``fixed``."""

    fixed: Choice

    def _decide(self, seen: Observation) -> Choice:
        super()._decide(seen)
        self.current = self.fixed
        return self.fixed


class Recording(FixedChain):
    """``FixedChain`` keeping what it was shown (``seen``: each observation, and ``("finished",
    observation)`` at a request's end)."""

    seen: list

    def __call__(self, seen: Observation) -> Choice:
        self.seen.append(dataclasses.replace(seen, tokens=None))  # the token buffer is not learnt from
        return super().__call__(seen)

    def finished(self, seen: Observation) -> None:
        self.seen.append(("finished", dataclasses.replace(seen, tokens=None)))
        super().finished(seen)


def record(cache: str | None, prompts: int) -> dict:
    """Decode every set with every chain (a fresh controller each): the controller before any run,
    and each run's chain and observations."""
    target = zoo.cost_twin(zoo.load("s"), hidden_size=768, num_layers=12, intermediate_size=2048)
    candidates = [LookupDraft(), zoo.load("xxs"), zoo.load("xs")]
    windows = read_calibration(zoo.zoo_dir())
    calibration = torch.cat([w[:, :128] for w in windows.values()])
    profiles = ProfileCache(cache, fallbacks=[zoo.zoo_dir() / "profile_cpu.json"])
    pick = hsd_fast.select_hierarchy(
        target, ["lookup", *candidates[1:]], calibration, cache=profiles, max_new_tokens=NEW_TOKENS,
        progress=False, do_sample=False, compile=False,
    )  # fmt: skip
    sets = {name: p[:prompts] for name, p in text_sets(zoo.load_tokenizer(), 96, 1).items()}
    own = torch.cat([w[:, -96:] for w in windows.values()])  # the text the prior was measured on
    sets["zoo"] = own[torch.linspace(0, len(own) - 1, prompts).long()]
    runs = {}
    for (name, ids), (label, choice) in itertools.product(sets.items(), CHAINS.items()):
        control = Recording.from_hierarchy(pick, candidates, probe_share=0.0)
        control.fixed, control.seen = choice, []
        for prompt in ids:
            target.generate(
                prompt[None], custom_generate=generate, max_new_tokens=NEW_TOKENS, do_sample=False,
                drafts=candidates, adapt=control, hierarchy=pick, compile=False,
            )  # fmt: skip
        runs[name, label] = control.seen
        print(f"{name}, {label}: {len(control.seen)} looks", flush=True)
    return {"fresh": FixedChain.from_hierarchy(pick, candidates, probe_share=0.0), "runs": runs}


@contextlib.contextmanager
def estimator(prior: float, fade: float | None = None):
    """The estimates' and the controller's module constants for a replay: the prior counted as
    ``prior`` trials and calls, trials faded by ``fade`` per round (None: the estimates'), and
    chains' measurements kept whole (summed over the run, not faded)."""
    patched = [
        (estimates_module, "PRIOR_TOKENS", prior),
        (estimates_module, "PRIOR_CALLS", prior),
        (estimates_module, "FADE", estimates_module.FADE if fade is None else fade),
        (controller_module, "CORRECTION_FADE", 1.0),
    ]
    before = [(module, name, getattr(module, name)) for module, name, _ in patched]
    for module, name, value in patched:
        setattr(module, name, value)
    try:
        yield
    finally:
        for module, name, value in before:
            setattr(module, name, value)


def marked(seen: list, choice: Choice, alike: bool = False) -> list:
    """``seen`` with ``Observation.opens`` for a recording made before the engine marked it: at
    batch 1 a look's middle-level verifications are cut into runs where their gains reach the
    middle's block size, as the engine cuts them (each look starts at a round's start).
    ``alike``: no marks at all (every call counted as a first one, as before the marks)."""
    out = []
    for item in seen:
        rounds = item[1] if isinstance(item, tuple) else item
        if alike:
            rounds = dataclasses.replace(rounds, opens=())
        elif not rounds.opens and rounds.choice is not None and len(rounds.choice.drafts) >= 2:
            assert len(rounds.committed) == 1, "a recording without marks replays at batch 1 only"
            opens, run = [], 0
            for b, a in zip(rounds.verified[0].tolist(), rounds.accepted[0].tolist(), strict=True):
                opens.append(run == 0)
                run = 0 if run + min(a, b) + 1 >= rounds.choice.T[1] else run + min(a, b) + 1
            others = (np.ones(len(v), dtype=bool) for v in rounds.verified[1:])  # the target's: all open
            rounds = dataclasses.replace(rounds, opens=(np.array(opens, dtype=bool), *others))
        out.append(("finished", rounds) if isinstance(item, tuple) else rounds)
    return out


def replay(fresh: FixedChain, choice: Choice, seen: list, prior: float) -> dict:
    """One run's observations through copies of ``fresh`` that keep ``choice``: the model's seconds
    per token at each look, on the estimates the controller has then; and its tokens and middle
    verifications per target round on the estimates of the whole run (trials not faded), against
    the run's own."""
    at_looks = []  # the lookup's share of calls that match nothing, as each look estimates it
    with estimator(prior):
        control = _replayed(fresh, choice, seen, each=lambda c: at_looks.append(c.lengths(LOOKUP)[0]))
        control._measure(
            control.estimates.costs(), control.estimates.alpha()
        )  # the rounds after the last look
    delivered, modelled, per_row = control.measured[(choice.drafts, choice.tree)]
    out = {"delivered": delivered / per_row, "modelled": modelled / per_row}
    over_lookup = bool(choice.drafts) and choice.drafts[0] == LOOKUP
    out |= _where_the_time_went(fresh, choice, seen, over_lookup)
    if over_lookup:
        # under a middle model the looks' estimate is of the first calls of its runs (``later_calls``)
        apart = len(choice.drafts) >= 2
        rounds = _rounds_of(seen, choice)
        calls = [r.verified[0][r.opens[0]] if apart and r.opens else r.verified[0] for r in rounds]
        offered = np.concatenate(calls)
        out["lookup matches nothing"] = (float(np.mean(offered == 0)), float(np.mean(at_looks)))
    if choice.drafts:
        with estimator(prior, fade=1.0):  # the model reads the constants too: inside
            whole = _replayed(fresh, choice, seen)
            gain, middle, block = _expected_round(whole, choice)
            through, call_gains = _over_lookup_modelled(whole, choice)
        steps, tokens, calls = np.zeros(len(choice.drafts) + 1), 0, [[]]  # calls: per request
        for item in seen:  # every round of the chain, a request's first and last too, as the estimates
            rounds = item[1] if isinstance(item, tuple) else item
            if rounds.choice == choice:
                steps += [len(sizes) for sizes in rounds.step_sizes]
                tokens += rounds.round_tokens
                calls[-1].append(np.stack([rounds.verified[0], rounds.accepted[0]]))
            if isinstance(item, tuple):
                calls.append([])
        out["tokens per target round"] = (tokens / steps[-1], gain)
        blocks = np.concatenate([r.verified[-1] for r in _rounds_of(seen, choice)])
        out["target's block"] = (float(blocks.mean()), block)
        if through is not None:
            out["target's rate per kind (kept, corrections, own)"] = (_kinds_measured(seen, choice), through)
        requests = [np.concatenate(c, axis=1) for c in calls if c]  # each [2, N]: offered, taken
        if choice.drafts[0] == LOOKUP:
            out["whole matches"] = _streaks(np.concatenate(requests, axis=1))
        if choice.drafts[0] == LOOKUP and len(choice.drafts) == 2:
            out["first calls"] = _first_calls(requests, choice.T[1]) | call_gains
        if len(choice.drafts) == 2:
            out["middle verifications per target round"] = (steps[1] / steps[-1], middle)
    return out


def _replayed(fresh: FixedChain, choice: Choice, seen: list, each=None) -> FixedChain:
    """``seen`` shown to a copy of ``fresh`` that keeps ``choice``; ``each(controller)`` after every
    look of a request (not its end)."""
    control = copy.deepcopy(fresh)
    control.estimates.later_calls_apart = (
        True  # where the looks carry the marks (``--calls-alike`` strips them)
    )
    control.fixed, control.decide_share = choice, 1.0  # every look decides (and measures), as timed
    for item in seen:
        if isinstance(item, tuple):
            control.finished(item[1])
        else:
            control(item)
            if each is not None:
                each(control)
    return control


def _rounds_of(seen: list, choice: Choice) -> list[Observation]:
    """The looks of ``seen`` (a request's end included) over rounds of ``choice``."""
    looks = (item[1] if isinstance(item, tuple) else item for item in seen)
    return [rounds for rounds in looks if rounds.choice == choice]


def _where_the_time_went(fresh: FixedChain, choice: Choice, seen: list, over_lookup: bool) -> dict:
    """Over the looks the controller measures (not a request's first), the target's steps' seconds
    against what the prior profile gives for their widths (a verification's fed tokens; without a
    draft, the tokens a step decodes), as the controller scales its costs, and the share of the rounds'
    time (the looks' own left out) spent in the lookup level's calls and outside every step (the
    engine's host work; ``over_lookup``: the chain's level 0 is the lookup level)."""
    cost = fresh.estimates.prior_costs[fresh.target]
    verified = profiled = lookup = stepped = wall = 0.0
    for rounds in _rounds_of(seen, choice):
        if rounds.round <= 1 or rounds.warming:
            continue
        level, sizes, seconds = len(rounds.step_sizes) - 1, rounds.step_sizes[-1], rounds.step_seconds[-1]
        verified += float(seconds.sum())
        profiled += sum(estimates_module._predicted(cost, level, int(n)) for n in sizes)  # as it scales
        stepped += sum(float(s.sum()) for s in rounds.step_seconds)
        if over_lookup:
            lookup += float(rounds.step_seconds[0].sum())
        wall += rounds.round_seconds - rounds.look_seconds
    return {
        "target steps / profile": verified / profiled if profiled else float("nan"),
        "lookup calls' share": lookup / wall if over_lookup else None,
        "host share": 1.0 - stepped / wall,
    }


def _streaks(calls: np.ndarray) -> tuple[float, float]:
    """Of a batch-1 run's lookup calls in order (``[2, N]``: tokens each offered, and taken by the
    level above), the share that offered tokens and had all of them taken, overall and right after
    such a call: the model takes calls as independent, so the two would match."""
    offered, taken = calls
    whole = (offered > 0) & (taken >= offered)  # [N]
    after = whole[1:][whole[:-1]]
    return float(whole.mean()), float(after.mean()) if after.size else float("nan")


FIRST_CALLS = (
    "lookup offers nothing, first",
    "lookup offers nothing, later",
    "lookup first token taken, first",
    "lookup first token taken, later",
    "middle verifications, calls independent",
    "middle verifications, calls first apart",
    "lookup call gain, first",
    "lookup call gain, first, model",
    "lookup call gain, later",
    "lookup call gain, later, model",
)


def _first_calls(requests: list[np.ndarray], T: int) -> dict[str, float]:
    """The lookup calls under a middle model with block size ``T`` (each request's ``[2, N]``, as
    ``_streaks``), split into the first of each of the middle model's runs (right after the
    target's verification) and the rest (after the middle model's own token), the runs cut where
    their gains reach T, as the engine cuts them: how often each offers nothing, how often the
    middle model takes the first token of what it offers, and the middle verifications per target
    round that the run's own gains make if calls are independent and if the first calls are drawn
    apart."""
    first, rest = [], []  # (offered, gain) per call
    for offered, taken in requests:
        run = 0
        for b, gain in zip(offered, np.minimum(taken, offered) + 1, strict=True):
            (first if run == 0 else rest).append((b, gain))
            run = 0 if run + gain >= T else run + gain
    first, rest = np.array(first).reshape(-1, 2), np.array(rest).reshape(-1, 2)
    both = np.concatenate([first, rest])
    return {
        "lookup offers nothing, first": float(np.mean(first[:, 0] == 0)),
        "lookup offers nothing, later": float(np.mean(rest[:, 0] == 0)) if len(rest) else float("nan"),
        "lookup first token taken, first": _first_taken(first),
        "lookup first token taken, later": _first_taken(rest),
        "middle verifications, calls independent": _calls_to_reach(both[:, 1], both[:, 1], T),
        "middle verifications, calls first apart": _calls_to_reach(
            first[:, 1], rest[:, 1] if len(rest) else both[:, 1], T
        ),
        "lookup call gain, first": float(np.mean(first[:, 1])),
        "lookup call gain, later": float(np.mean(rest[:, 1])) if len(rest) else float("nan"),
    }


def _first_taken(calls: np.ndarray) -> float:
    """Of ``[N, 2]`` (offered, gain) calls, the share of those that offered tokens whose first
    token the level above took."""
    offered = calls[calls[:, 0] > 0]
    return float(np.mean(offered[:, 1] > 1)) if len(offered) else float("nan")


def _calls_to_reach(first: np.ndarray, later: np.ndarray, T: int) -> float:
    """Expected calls until their gains (each >= 1) sum to ``T`` or more, the first drawn from the
    gains ``first``, the others from ``later`` (empirical distributions)."""
    p = np.bincount(later.astype(int)) / len(later)  # [G] P(a later call gains g)
    more = np.zeros(T + 1)  # more[r]: expected calls still to come with r left to reach
    for r in range(1, T + 1):
        more[r] = 1.0 + sum(q * more[max(r - g, 0)] for g, q in enumerate(p) if q > 0)
    return 1.0 + float(np.mean(more[np.clip(T - first.astype(int), 0, T)]))


def _kinds_measured(seen: list, choice: Choice) -> list[float]:
    """The target's rate, per trial, on each kind of token a middle model hands up over the lookup
    level (kept proposals, corrections, other own tokens; ``latency.RatesThrough``), from a batch-1
    recording: each target block cut back into the middle's verifications since the last (a block
    that does not add up, cut by the length budget, left out)."""
    counts = np.zeros((3, 2))  # per kind: passed, tried
    for rounds in _rounds_of(seen, choice):
        pieces = [  # the middle's verifications in order: (proposals kept, kind of its own token)
            (min(a, b), 1 if a < b else 2)
            for b, a in zip(rounds.verified[0].tolist(), rounds.accepted[0].tolist(), strict=True)
        ]
        for b, a in zip(rounds.verified[1].tolist(), rounds.accepted[1].tolist(), strict=True):
            kinds: list[int] = []
            while len(kinds) < b and pieces:
                kept, own = pieces.pop(0)
                kinds += [0] * kept + [own]
            if len(kinds) == b:
                for kind in kinds[:a]:
                    counts[kind] += 1
                if a < b:
                    counts[kinds[a], 1] += 1
    return [round(p / t, 3) if t else float("nan") for p, t in counts]


def _over_lookup_modelled(control: LatencyController, choice: Choice) -> tuple[list[float] | None, dict]:
    """For a chain lookup > m > v, what the controller expects on the whole run: v's rates on the
    three kinds of m's tokens (``_kinds_measured``), and the gain of the lookup's first call of m's
    run and of the later ones (``latency.LaterCalls``; as the first where it keeps none apart).
    (None, {}) for another chain."""
    levels = (*choice.drafts, control.target)
    if len(levels) != 3 or levels[0] != LOOKUP:
        return None, {}
    alpha = control.estimates.alpha()
    rates, own = (
        control.estimates.through(alpha)[levels],
        estimates_module.mean_rate(alpha[levels[1]][levels[2]]),
    )
    corrected = own if rates.corrected is None else rates.corrected
    kinds = [round(r, 3) for r in (rates.passed, corrected, own if rates.own is None else rates.own)]
    lookup = control.estimates.chain_costs(control.estimates.costs(), alpha, list(levels))[LOOKUP]
    first = mean_gain(alpha[LOOKUP][levels[1]], block_sizes(lookup, choice.T[0]))
    later = first
    if lookup.later is not None:
        later = mean_gain(lookup.later.rates, block_sizes(lookup.later_calls(), choice.T[0]))
    return kinds, {"lookup call gain, first, model": first, "lookup call gain, later, model": later}


def _expected_round(control: LatencyController, choice: Choice) -> tuple[float, float, float]:
    """The model's tokens per target round, the middle level's verifications per target round and
    the mean block the target verifies."""
    alpha, levels = control.estimates.alpha(), [*choice.drafts, control.target]
    costs = control.estimates.chain_costs(
        control.estimates.costs(), alpha, levels
    )  # a lookup's later calls, as modelled
    rates = chain_rates(costs, alpha, levels, choice.block_sizes, control.estimates.through(alpha))
    paid = sharing_the_cache(verifying_costs([costs[m] for m in levels]))
    outcomes = level_outcomes(paid, rates, list(choice.block_sizes))
    gain = outcomes[-1].mean(lambda b: expected_gain(rates[-1], b))
    return gain, outcomes[1].calls if len(outcomes) > 1 else 1.0, outcomes[-1].mean(lambda b: b)


def summary(errors: dict) -> tuple[float, int, int]:
    """The rms of log(delivered / modelled) over the runs, and of the pairs of chains on one set
    whose delivered speeds differ by more than ``APART``, how many the model orders right."""
    logs = [math.log(e["delivered"] / e["modelled"]) for e in errors.values()]
    right = ranked = 0
    for name in {n for n, _ in errors}:
        for a, b in itertools.combinations(CHAINS, 2):
            ea, eb = errors[name, a], errors[name, b]
            if abs(math.log(ea["delivered"] / eb["delivered"])) > APART:
                ranked += 1
                right += (ea["delivered"] < eb["delivered"]) == (ea["modelled"] < eb["modelled"])
    return float(np.sqrt(np.mean(np.square(logs)))), right, ranked


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cache", help="a profile cache for the twin's costs (as bench_adaptive's)")
    parser.add_argument("--prompts", type=int, default=3, help="prompts per text set")
    parser.add_argument("--priors", type=float, nargs="+", default=[estimates_module.PRIOR_TOKENS])
    parser.add_argument("--observations", type=Path, default=Path(tempfile.gettempdir()) / "model_error.pkl")
    parser.add_argument("--replay-only", action="store_true", help="replay --observations, decode nothing")
    parser.add_argument(
        "--calls-alike", action="store_true", help="the controller counts a lookup's calls alike (as before)"
    )
    parser.add_argument("--stem", default="model_error_twin_cpu", help="the result files' name")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    torch.set_grad_enabled(False)
    if args.replay_only:
        recorded = pickle.loads(args.observations.read_bytes())
        for name in ("later_proposals", "later_trials"):  # a controller recorded before they were kept
            recorded["fresh"].__dict__.setdefault(name, {})
    else:
        recorded = record(args.cache, args.prompts)
        args.observations.write_bytes(pickle.dumps(recorded))
    rows, notes = [], []
    for prior in args.priors:
        errors = {
            key: replay(
                recorded["fresh"], CHAINS[key[1]], marked(seen, CHAINS[key[1]], args.calls_alike), prior
            )
            for key, seen in recorded["runs"].items()
        }
        rms, right, ranked = summary(errors)
        notes.append(
            f"Prior counted as {prior:g} trials: rms of log(delivered / modelled) {rms:.3f}; of the {ranked} "
            f"pairs of chains on one set whose delivered speeds differ by more than {APART:.0%}, {right} "
            "ordered right."
        )
        for (name, label), e in errors.items():
            row = {"prior": prior, "set": name, "hierarchy": label}
            row |= {
                "delivered ms/token": round(1e3 * e["delivered"], 2),
                "modelled ms/token": round(1e3 * e["modelled"], 2),
                "delivered / modelled": round(e["delivered"] / e["modelled"], 3),
            }
            row["target steps / profile"] = round(e["target steps / profile"], 2)
            for key in ("lookup calls' share", "host share"):
                row[key] = None if e[key] is None else round(e[key], 3)
            nothing, estimated = e.get("lookup matches nothing", (None, None))
            row["lookup matches nothing, measured"] = None if nothing is None else round(nothing, 2)
            row["lookup matches nothing, at the looks"] = None if estimated is None else round(estimated, 2)
            for key in ("tokens per target round", "middle verifications per target round", "target's block"):
                measured, expected = e.get(key, (None, None))
                row[f"{key}, measured"] = None if measured is None else round(measured, 2)
                row[f"{key}, model"] = None if expected is None else round(expected, 2)
            kinds = "target's rate per kind (kept, corrections, own)"
            row[f"{kinds}, measured"], row[f"{kinds}, model"] = e.get(kinds, (None, None))
            overall, after = e.get("whole matches", (None, None))
            row["lookup calls taken whole"] = None if overall is None else round(overall, 2)
            row["right after one taken whole"] = None if after is None else round(after, 2)
            first = e.get("first calls", {})
            for key in FIRST_CALLS:
                row[key] = round(first[key], 2) if key in first else None
            rows.append(row)
    notes.insert(
        0,
        "Target s as its cost twin (hidden 768, 12 layers, MLP 2048; the same logits), candidates lookup, "
        f"xxs, xs (zoo), batch 1, greedy, eager, {args.prompts} prompts of 96 tokens per set, {NEW_TOKENS} "
        "new tokens, one controller per set and chain. Seconds per token as the controller measures them "
        "(a request's first look and the looks' own time left out), the model's on each look's estimates; "
        "per target round, the model on the estimates over the whole run (its trials not faded), over "
        "every round of the chain. Lookup calls taken whole: the share of the lookup level's calls that "
        "offered tokens and had all of them taken by the level above, overall and right after such a call. "
        "Under a middle model: how often the lookup offers nothing on the first call of the middle's run "
        "(after the target's verification) and on the later ones (after the middle's own token), how often "
        "the middle takes the first token of what they offer, the mean gain of each (measured and as the "
        "controller expects it on the whole run), and the "
        "middle verifications per target round the run's own gains make with calls independent or with "
        "the first calls apart (each run cut where its gains reach the middle's block size). Where the "
        "time went, over the looks the controller measures: the target's steps' seconds against the prior "
        "profile's for their widths, as the controller scales costs; the lookup level's calls' and the "
        "engine's host work's (outside every step) shares of the rounds' time. Lookup matches nothing: "
        "the share of its calls (under a middle model: of the first calls of its runs) that offered no "
        "token, measured over the run and as the controller estimated it at the looks (mean over the looks). "
        "The target's block: the tokens its verifications were handed (measured: each request's last, cut "
        "by the length budget, too). Under a middle model over the lookup level, the target's rate per "
        "trial on each kind of the middle's tokens (the proposals it kept, its corrections, its other own "
        "tokens), measured (each block cut back into the middle's verifications) and the controller's on "
        "the whole run (docs/design.md §8.10, *Past the kept proposals*).",
    )
    meta = run_meta("cpu", batch=1, sampling={"do_sample": False}, compiled=False)
    write_results(args.stem, "The latency model's error per chain", notes, ["prior", "set"], rows, meta)


if __name__ == "__main__":
    main()
