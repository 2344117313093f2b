"""Seconds per token of a hierarchy run over a batch: the engine's loop replayed on the real ledger
with random acceptance (docs/design.md, "Selecting for a batch").

The latency model (``hsd_fast.latency``) follows one row. That is exact for a batch whose rows stay
in step, which they do with one draft model: every row drafts T_0, then every row is verified. With
two or more levels below the target they fall apart: after a verification some rows have the
T_1 tokens their next level wants and others go back to drafting, and a step serves only the rows
that want its level (the ledger's policy picks the level most rows want). Every step still runs
all B rows (docs/design.md, "Padding and rows that sit out"), at the cost of B rows. So a batch pays
for steps that serve part of it, and the one-row model predicts it too fast.

``batch_latency`` measures that by Monte Carlo: B rows of the real ``Ledger`` (same spans, same
policy, same length budget) run the engine's loop, each row drawing its own acceptances (the
latency model's i.i.d. rates) and a lookup level's rows their own proposal lengths; every step is
charged the B-row cost of its widest fed span, on the compiled steps' buckets. The prefill is not
charged (the measured decode latency excludes it too).
"""

from __future__ import annotations

import itertools
import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from hsd_fast._C import Ledger
from hsd_fast.hierarchy_types import DEFAULT_MAX_T, Selection
from hsd_fast.latency import (
    Acceptance,
    Cost,
    Through,
    at_block_size,
    chain_rates,
    draft_seconds,
    draw_gain,
    expected_latency,
    sharing_the_cache,
    verify_tokens,
    verifying_costs,
)
from hsd_fast.layout import bucket
from hsd_fast.row_spread import ProposalRows, Spread, row_rate
from hsd_fast.schedule import draft_count, drafts_wanted
from hsd_fast.selector import select

PROMPT_TOKENS = 64
"""The prompt each simulated row starts from (its length sets the positions only: its prefill is
not charged)."""


def batch_latency(
    costs: Sequence[Cost],
    alphas: Sequence[Acceptance],
    T: Sequence[int],
    rows: int,
    max_new_tokens: int = 128,
    runs: int = 8,
    seed: int = 0,
    spreads: Sequence[Spread] | None = None,
) -> tuple[float, float]:
    """(mean seconds per token each row commits, its standard error over ``runs``) for ``rows``
    rows generating ``max_new_tokens`` each through levels with ``costs`` (measured at ``rows``
    rows), acceptance ``alphas[i]`` of level i's tokens by level i+1 and block sizes ``T``. A
    level 0 with a ``block`` distribution (a lookup level, a token tree) proposes its lengths.
    ``spreads[i]``: how far apart rows' rates of pair i lie (``row_spread``; default 0.0: every
    row accepts at ``alphas``); each row then draws its own rates, the same ``z`` for every pair.
    A proposal level's pair may instead hold its calibration rows (``ProposalRows``): each row then
    takes one of them whole, its lengths offered and its rates."""
    if rows < 1 or max_new_tokens < 1 or runs < 1:
        raise ValueError(
            f"batch_latency needs rows, max_new_tokens and runs >= 1, got {rows}, {max_new_tokens}, {runs}"
        )
    spreads = [0.0] * len(alphas) if spreads is None else list(spreads)
    if len(alphas) != len(costs) - 1 or len(T) != len(costs) - 1 or len(spreads) != len(alphas):
        raise ValueError(
            f"{len(costs) - 1} draft level(s) need as many alphas, T and spreads, got {len(alphas)}, "
            f"{len(T)} and {len(spreads)}"
        )
    own_rows = [i for i, s in enumerate(spreads) if isinstance(s, ProposalRows)]
    if own_rows and (own_rows != [0] or not hasattr(costs[0], "lengths")):
        raise ValueError("only a proposal level (level 0, with lengths offered) has rows of its own")
    rng = random.Random(seed)
    costs, alphas = at_block_size(sharing_the_cache(verifying_costs(costs)), alphas, T)
    per_token = [
        _run_seconds(costs, alphas, spreads, T, rows, max_new_tokens, rng) / max_new_tokens
        for _ in range(runs)
    ]
    error = statistics.stdev(per_token) / math.sqrt(runs) if runs > 1 else 0.0
    return statistics.fmean(per_token), error


def _run_seconds(
    costs: Sequence[Cost],
    alphas: Sequence[Acceptance],
    spreads: Sequence[Spread],
    T: Sequence[int],
    rows: int,
    new: int,
    rng: random.Random,
) -> float:
    """Seconds for ``rows`` rows to commit ``new`` tokens each through the engine's loop."""
    # [rows][pair]: each row's rates; no draw where no pair spreads (the rows' rates are alphas)
    sigmas = [0.0 if isinstance(s, ProposalRows) else s for s in spreads]
    z = [rng.gauss(0.0, 1.0) for _ in range(rows)] if any(s > 0 for s in sigmas) else [0.0] * rows
    row_alphas = [[row_rate(a, s, z[r]) for a, s in zip(alphas, sigmas, strict=True)] for r in range(rows)]
    ledger = Ledger(len(costs), list(T), [PROMPT_TOKENS] * rows, new)
    budget_end = np.full(rows, PROMPT_TOKENS + new, dtype=np.int64)
    # a lookup level or a token tree proposes a block of random (or fixed) length: sizes, probabilities
    proposed = costs[0].block(T[0]) if len(costs) > 1 and hasattr(costs[0], "block") else None
    proposed_by_row = None  # [rows] each row's own, where the level's rows are its calibration rows'
    if spreads and isinstance(spreads[0], ProposalRows):
        profiles = spreads[0]
        taken = [rng.randrange(len(profiles.lengths)) for _ in range(rows)]  # one calibration row each
        blocks = [replace(costs[0], lengths=profiles.lengths[i]).block(T[0]) for i in taken]
        proposed_by_row = [(list(block), list(block.values())) for block in blocks]  # sizes, probabilities
        for r, i in enumerate(taken):
            row_alphas[r][0] = profiles.rates[i]
    seconds = 0.0
    while (level := ledger.next_level()) >= 0:
        batch_rows = ledger.rows_for(level)
        starts, ends, outs = ledger.spans(level, batch_rows)
        starts = np.maximum(starts, PROMPT_TOKENS - 1)  # the prompt itself was fed by the prefill
        if level == 0:
            wanted = drafts_wanted(ledger, batch_rows, budget_end, T)
        if level == 0 and proposed is not None:
            if proposed_by_row is None:
                drawn = rng.choices(list(proposed), list(proposed.values()), k=len(batch_rows))
            else:
                drawn = [rng.choices(*proposed_by_row[r])[0] for r in batch_rows]
            counts = np.minimum(drawn, wanted)
            ledger.commit_proposal(batch_rows, counts, np.zeros_like(counts))
            seconds += draft_seconds(costs[0], T[0])
        elif level == 0:  # a compiled draft step always draws its full count (rows stop at wanted)
            longest = bucket(int((ends - starts).max()))  # catch-up tokens: the profile's step feeds 1
            seconds += draft_seconds(costs[0], draft_count(T)) + max(0.0, costs[0](longest) - costs[0](1))
            for k in range(int(wanted.max())):  # the ledger takes drafts one at a time
                now = wanted > k
                ledger.commit_draft(batch_rows[now], np.zeros(int(now.sum()), dtype=np.int64))
        else:
            blocks = ends - outs - 1  # [R] the tokens each row's verification checks
            catch_up = ends - starts - (blocks + 1)
            fed = catch_up + np.array([verify_tokens(costs[level - 1], int(b)) for b in blocks])
            rates = [row_alphas[r][level - 1] for r in batch_rows]  # each row's own
            gains = [draw_gain(rng, a, int(b)) for a, b in zip(rates, blocks, strict=True)]
            accepted = np.array(gains, dtype=np.int64) - 1
            ledger.commit_verify(level, batch_rows, accepted, np.zeros_like(accepted))
            seconds += costs[level](bucket(int(fed.max())))
    return seconds


def chain_latency(
    costs: Sequence[Cost],
    alpha: Sequence[Sequence[Acceptance]],
    chain: Sequence[int],
    T: Sequence[int],
    rows: int = 1,
    max_new_tokens: int = 128,
    spread: Sequence[Sequence[Spread]] | None = None,
    through: Through | None = None,
) -> float:
    """Predicted seconds per token of each row for the candidates ``chain`` (indices into ``costs``
    and the acceptance matrix ``alpha``, the target last; its pairs' rates as ``latency.chain_rates``
    has them with ``through``): the one-row recursion at batch 1, the batch's Monte Carlo
    (``batch_latency``) at more rows, its rows' rates apart by ``spread`` (a matrix like ``alpha``;
    default: all alike)."""
    levels = [costs[m] for m in chain]
    pairs = list(itertools.pairwise(chain))
    alphas = chain_rates(costs, alpha, chain, T, through)
    if rows == 1:
        return expected_latency(levels, alphas, list(T))
    spreads = None if spread is None else [spread[a][b] for a, b in pairs]
    return batch_latency(levels, alphas, T, rows, max_new_tokens, spreads=spreads)[0]


def select_for_batch(
    costs: Sequence[Cost],
    alpha: Sequence[Sequence[Acceptance]],
    rows: int,
    max_T: int = DEFAULT_MAX_T,
    max_new_tokens: int = 128,
    spread: Sequence[Sequence[Spread]] | None = None,
    through: Through | None = None,
) -> Selection:
    """``selector.select`` for a batch of ``rows`` rows (costs measured at ``rows`` rows, rows' rates
    apart by ``spread`` and pairs through a proposal level by ``through``, as in ``chain_latency``): its pick
    and runner-ups, which always include plain decoding and the best single draft, rescored by
    ``batch_latency`` and ranked again. The one-row recursion ranks the candidates, so a hierarchy
    outside its short list is not considered; the batch only penalises hierarchies (rows out of
    step, rows finishing apart), so the ones it would promote are the single drafts and plain
    decoding the list always holds."""
    first = select(costs, alpha, max_T=max_T, through=through)
    if rows == 1:
        return first
    candidates = [replace(first, runner_ups=()), *first.runner_ups]
    setting = (rows, max_new_tokens, spread, through)
    latency = {s: chain_latency(costs, alpha, s.chain, s.T, *setting) for s in candidates}
    ar = next(lat for s, lat in latency.items() if len(s.chain) == 1)
    best_single = min((lat for s, lat in latency.items() if len(s.chain) == 2), default=ar)
    ranked = [
        replace(
            s, predicted_latency=lat, speedup_over_ar=ar / lat, speedup_over_best_single=best_single / lat
        )
        for s, lat in sorted(latency.items(), key=lambda kv: kv[1])
    ]
    return replace(ranked[0], runner_ups=tuple(ranked[1:]))
