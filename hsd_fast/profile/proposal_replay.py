"""A proposal level's profile for the latency model (docs/design.md, "The lookup level"; a draft with
another tokenizer is profiled the same way: "Drafts with another tokenizer"), measured by replaying
calibration text as the level would meet it in a run:

- the text (``run_text.continued``): each calibration row's first half followed by the target's
  own continuation of it. A lookup proposes while the target generates, and generated text repeats
  itself far more than held-out text does (a small model loops): replayed on the held-out text
  alone, the zoo's lookup level was predicted 2-3x below what it measured;
- ``proposal_scores.replay``: the level's calls as a run under the target makes them, and the
  models scored on what it proposed (``proposal_scores``, which a probe shares: the module doc
  there). Calls, not positions: weighting every position alike over-counted the matches (predicted
  1.7x what the zoo measured);
- ``offered_lengths``: how often a call offers 0, 1, ... tokens;
- ``row_lengths``, ``row_rates``: the same per calibration row, over its own calls (a batch waits
  for its slowest row: ``row_spread.ProposalRows``);
- ``proposal_scores.acceptance_by_position``: per position j of a proposal, the rate a model accepts
  token j given it accepted tokens 1..j-1 (a sampled replay of a level that ``draws_q`` draws them
  as the run would, seeded, and keeps each one's q);
- ``host_seconds``: the engine's work per call (propose, write the proposal; its q, a point mass,
  is never written): host work for the lookup level, the draft model's forwards too for a draft
  with another tokenizer, whose calls cost more for a larger block.

Text repeats in runs: a matched passage is accepted whole or not at all, so rates per position
predict the gain of a proposal far better than one rate (the rate of a model draft).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch

from hsd_fast.decode_state import DecodeState
from hsd_fast.processors import LogitsTransform
from hsd_fast.profile.costs import interleaved_medians
from hsd_fast.proposal_level import ProposalLevel
from hsd_fast.proposal_scores import Proposal, acceptance_by_position
from hsd_fast.sampling_metadata import SamplingMetadata


def offered_lengths(proposals: list[Proposal], max_T: int) -> tuple[float, ...]:
    """The fraction of calls that offer b tokens, b = 0..max_T (the last: at least max_T)."""
    counts = np.bincount([len(p.tokens) for p in proposals], minlength=max_T + 1)[: max_T + 1]
    return tuple(float(c) for c in counts / max(1, len(proposals)))


def rows_of(proposals: list[Proposal]) -> list[list[Proposal]]:
    """The calls of each replayed row, in row order (a row that made none is left out)."""
    rows: dict[int, list[Proposal]] = {}
    for proposal in proposals:
        rows.setdefault(proposal.row, []).append(proposal)
    return [rows[n] for n in sorted(rows)]


def row_lengths(proposals: list[Proposal], max_T: int) -> tuple[list[int], list[tuple[float, ...]]]:
    """Each replayed row's number of calls and its ``offered_lengths``, in row order."""
    by_row = rows_of(proposals)
    return [len(calls) for calls in by_row], [offered_lengths(calls, max_T) for calls in by_row]


def row_rates(
    proposals: list[Proposal],
    ids: torch.Tensor,  # [N, L] the replayed text
    scores: torch.Tensor,  # as ``acceptance_by_position`` takes them
    max_T: int,
) -> list[tuple[float, ...]]:
    """Each replayed row's ``acceptance_by_position`` over its own calls, in row order."""
    return [acceptance_by_position(calls, ids, scores, max_T) for calls in rows_of(proposals)]


def host_seconds(
    spec: ProposalLevel,
    ids: torch.Tensor,  # [N, L] text to propose from
    max_T: int,
    repeats: int = 5,
    clock: Callable[[], float] = time.perf_counter,
    batch: int = 1,
    compile: bool = False,
) -> tuple[float, float]:
    """Seconds of one call of the level as the engine makes it (read the new tokens, propose
    ``max_T`` tokens, write the proposal into the token buffer) for ``batch`` rows: a pass of calls
    over the second half of the first ``batch`` rows (repeated if fewer), timed as step costs are
    (warmed up, median of ``repeats``), per call; and the noise of that median
    (``costs.forward_costs``). ``compile``: a level that runs a model runs it compiled, as a
    compiled run would."""
    text = ids[torch.arange(batch) % ids.shape[0]]  # [B, L]
    length = text.shape[1]
    sampling = SamplingMetadata.build(batch, text.device, temperature=1.0, greedy=True)
    state = DecodeState(
        list(text), length + max_T + 1, 2 * (max_T + 1), 1, torch.float32, sampling, LogitsTransform(), False
    )
    rows, wanted = np.arange(batch, dtype=np.int64), np.full(batch, max_T, dtype=np.int64)
    ends = [np.full(batch, end, dtype=np.int64) for end in range(length // 2, length)]

    def one_pass() -> None:
        proposer = spec.proposer(batch, sampling, compile)  # fresh: each pass reads the rows again
        for end in ends:
            proposed = proposer.propose(state.tokens, rows, end, wanted)
            state.write_proposals(rows, end, proposed.tokens, proposed.counts)
        state.tokens[:, :length] = text  # the proposals overwrote text the next pass reads

    # a compiled step's shapes compile in the first warm-up pass (at their third use)
    medians, noise = interleaved_medians([one_pass], clock, text.device, warmup=2, repeats=repeats)
    return medians[0] / len(ends), noise
