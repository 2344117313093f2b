"""Rows that accept apart: at batch B on the zoo's mixed requests (code, prose, repetitive text and
register switches between them: ``hsd_fast.bench.mixed``), each hierarchy's measured decode time per
row-token beside five predictions from the same profile (step costs timed at B rows, rates on the
zoo's calibration text): the one-row recursion, the batch replay with every row at the pair's rate
(``batch_latency`` before rows accepted apart), the replay with the calibration's model spreads but
the lookup level's rows pooled (before it had rows of its own), the replay with the calibration's
spread and lookup rows (what the selector uses now; docs/design.md, "Rows that accept apart") and
the replay with both measured on the requests' own rows (the target's greedy continuations of them,
teacher-forced and replayed).

    python bench/bench_batch_rows.py [--batch 16] [--passes 2] [--compiled]

Greedy, fp32, 128 new tokens, eager steps unless ``--compiled``. Each hierarchy generates 128 tokens
and 1 token for every request, all runs interleaved in rotated passes after warm-up, contended passes
redone (``hsd_fast.bench.timing``): decode seconds per row-token = (median long - median short) /
(requests x B x 127), the prefill excluded as the model excludes it. The profile is read from the
user's cache (``~/.cache/hsd_fast/profiles.json``), what is missing measured and kept there. Writes
bench/results/batch_rows_b{B}_cpu.{json,md}.
"""

from __future__ import annotations

import argparse

import torch
from kernel_bench import run_meta, write_results

from hsd_fast import proposal_scores
from hsd_fast.batch_latency import chain_latency
from hsd_fast.bench import command, measuring
from hsd_fast.bench import configs as cfg
from hsd_fast.bench.mixed import mixed_requests
from hsd_fast.bench.scenarios import zoo_scenario
from hsd_fast.bench.timing import CpuMeter, interleaved
from hsd_fast.hierarchy import spread_over
from hsd_fast.hierarchy_types import DEFAULT_MAX_T
from hsd_fast.lookup import LOOKUP, LookupDraft
from hsd_fast.processors import LogitsTransform
from hsd_fast.profile import proposal_replay
from hsd_fast.profile.acceptance_rates import acceptance_and_spread, teacher_forced_scores
from hsd_fast.row_spread import ProposalRows, Spread, sigma_of

NEW_TOKENS = 128
GREEDY = {"do_sample": False}
HIERARCHIES = [((), ()), (("xxs",), (3,)), (("xxs",), (4,)), (("sm",), (4,)), (("lookup",), (7,))]
HIERARCHIES += [(("xxs", "sm"), (2, 3))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--compiled", action="store_true", help="compiled steps (default: eager)")
    args = parser.parse_args()
    torch.manual_seed(0)
    scenario = zoo_scenario()
    profile_args = argparse.Namespace(
        cache=command.DEFAULT_CACHE, eager=not args.compiled, max_new_tokens=NEW_TOKENS
    )
    costs, alpha, names, spread = command._profile(scenario, GREEDY, profile_args, args.batch)
    sets = {name: torch.stack(prompts) for name, prompts in scenario.prompt_sets.items()}
    work = [(r.ids, torch.ones_like(r.ids)) for r in mixed_requests(sets, args.batch)]

    runs, outputs = [], {}
    for drafts, T in HIERARCHIES:
        for n in (NEW_TOKENS, 1):
            config = cfg.ours(scenario.target, scenario.drafts, drafts, T, GREEDY, n, args.compiled)

            def run(config=config, key=drafts, n=n) -> None:
                out = measuring.run_all(config, work)
                if n == NEW_TOKENS:
                    outputs[key] = [sequences for sequences, _ in out]

            runs.append(run)
    print(f"batch {args.batch}: {len(HIERARCHIES)} hierarchies x {len(work)} requests, {args.passes} passes")
    timings = interleaved(runs, args.passes, CpuMeter())
    stream_spread = _spread_on(scenario, names, outputs[()], work[0][0].shape[1])

    rows, target = [], len(names) - 1
    for k, (drafts, T) in enumerate(HIERARCHIES):
        assert all(a.equal(b) for a, b in zip(outputs[drafts], outputs[()], strict=True)), drafts
        long, short = (sorted(timings.seconds[2 * k + j])[args.passes // 2] for j in (0, 1))
        measured = (long - short) / (len(work) * (NEW_TOKENS - 1))  # each row's: the batch makes B / it
        chain = (*(names.index(d) for d in drafts), target)
        replay = (costs, alpha, chain, T, args.batch, NEW_TOKENS)
        predicted = {
            "recursion": chain_latency(costs, alpha, chain, T),
            "replay, rows alike": chain_latency(*replay),
            "replay, calibration spread, lookup pooled": chain_latency(*replay, _pooled(spread)),
            "replay, calibration spread": chain_latency(*replay, spread),
            "replay, the stream's spread": chain_latency(*replay, stream_spread),
        }
        rows.append({
            "hierarchy": " > ".join([*drafts, "target"]), "T": list(T),
            "measured_ms": round(1e3 * measured, 2),
            **{f"{label} ms": round(1e3 * p, 2) for label, p in predicted.items()},
            **{f"measured / {label}": round(measured / p, 2) for label, p in predicted.items()},
        })  # fmt: skip
    pairs = [(names.index(d), target) for d in (LOOKUP, *scenario.drafts)]
    notes = [
        f"The zoo, greedy, fp32, {'compiled' if args.compiled else 'eager'} steps, 2 CPU threads; batch "
        f"{args.batch}; {len(work)} requests of the mixed stream (each set's first two batches, then the "
        f"register switches), {work[0][0].shape[1]} prompt tokens, {NEW_TOKENS} new tokens.",
        f"{args.passes} counted passes after warm-up, rotated; {timings.redone} redone for load.",
        "measured_ms: decode seconds per row-token, prefill excluded; the predictions are seconds per "
        "row-token from the same profile (costs timed at this batch; rates and spreads on the zoo's "
        "calibration text, except the last).",
        "Spread (log-odds std of the rows' rates, noise taken off; the lookup level: of its rows' "
        "first-token success, after shrinking) with the target, calibration vs the stream: "
        + ", ".join(
            f"{names[j]} {sigma_of(spread[j][m]):.2f} vs {sigma_of(stream_spread[j][m]):.2f}"
            for j, m in pairs
        ),
        "The lookup level's rows: each calibration row's lengths offered and rates, shrunk towards the "
        "pooled profile by the share of their spread that is not noise (row_spread.ProposalRows); a "
        "simulated row takes one of them whole.",
    ]
    meta = run_meta("cpu", batch=args.batch, sampling=GREEDY, passes=args.passes, compiled=args.compiled)
    write_results(
        f"batch_rows_b{args.batch}_cpu", "Rows that accept apart: batch predictions against the stream",
        notes, ["hierarchy", "T"], rows, meta,
    )  # fmt: skip


def _spread_on(
    scenario, names: list[str], sequences: list[torch.Tensor], prompt_len: int
) -> list[list[Spread]]:
    """The spread matrix over ``names`` measured on the requests' rows: the target's greedy
    continuations, each draft's argmax against the target's over the generated positions, and the
    lookup level replayed on them (its rows under each model)."""
    models = [scenario.drafts[n] for n in names[1:-1]] + [scenario.target]
    text = torch.cat(sequences)  # [requests x B, prompt + new]
    contexts = slice(prompt_len - 1, text.shape[1] - 1)
    _, measured = acceptance_and_spread(models, text, LogitsTransform(), True, False, contexts)
    lookup = LookupDraft()  # names[0]
    proposals = proposal_scores.replay(lookup, text, DEFAULT_MAX_T, start=prompt_len)
    pooled = proposal_replay.offered_lengths(proposals, DEFAULT_MAX_T)
    calls, lengths = proposal_replay.row_lengths(proposals, DEFAULT_MAX_T)
    rows = []
    for model in models:
        vocab = scenario.target.get_output_embeddings().weight.shape[0]
        scores = teacher_forced_scores(model, text, LogitsTransform(), True, vocab)
        own = proposal_replay.row_rates(proposals, text, scores, DEFAULT_MAX_T)
        rates = proposal_scores.acceptance_by_position(proposals, text, scores, DEFAULT_MAX_T)
        rows.append(ProposalRows.shrunk(calls, lengths, own, pooled, rates))
    return spread_over([lookup, *models], models, measured, {id(lookup): rows})


def _pooled(spread: list[list[Spread]]) -> list[list[float]]:
    """``spread`` with the lookup level's rows pooled (0.0), as before it had rows of its own."""
    return [[0.0 if isinstance(s, ProposalRows) else s for s in row] for row in spread]


if __name__ == "__main__":
    main()
