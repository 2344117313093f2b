"""A proposal level's profile for the latency model (docs/design.md, "The lookup level"; a draft with
another tokenizer is profiled the same way: "Drafts with another tokenizer"), measured by replaying
calibration text as the level would meet it in a run:

- the text (``run_text.continued``): each calibration row's first half followed by the target's
  own continuation of it. A lookup proposes while the target generates, and generated text repeats
  itself far more than held-out text does (a small model loops): replayed on the held-out text
  alone, the zoo's lookup level was predicted 2-3x below what it measured;
- ``replay``: the lookup's calls as a run under the target makes them: at position t of a
  generated row it proposes from the row's first t tokens (the longest proposal a block allows; a
  smaller block takes its prefix); the target accepts the proposed tokens that equal the text and
  emits the next one, so the next call is at t + accepted + 1. Under greedy decoding that is the
  run itself; sampled, it has the run's law: x is accepted with probability p(x), the chance the
  target's sample is x, and a rejection's correction is p without x, as the text's token is then.
  Calls, not positions: a matched passage takes one call for many tokens, fresh text one per token;
  weighting every position alike over-counted the matches (predicted 1.7x what the zoo measured);
- ``offered_lengths``: how often a call offers 0, 1, ... tokens;
- ``row_lengths``, ``row_rates``: the same per calibration row, over its own calls (a batch waits
  for its slowest row: ``row_spread.ProposalRows``);
- ``acceptance_by_position``: per position j of a proposal, the rate a model accepts token j given
  it accepted tokens 1..j-1 (``latency.Acceptance``), under the sampling transform: p(x) for a
  sampled verification of a point-mass draft, min(1, p(x) / q(x)) for a level that draws its
  proposals from a q it hands up (``draws_q``: a sampled replay draws them as the run would, seeded,
  and keeps each one's q), argmax == x for a greedy one. Teacher-forced, so a
  token can only be scored while the proposal before it equals the text (its context is then
  known): proposals are followed until they leave the text;
- ``host_seconds``: the engine's work per call (propose, write the proposal; its q, a point mass,
  is never written): host work for the lookup level, the draft model's forwards too for a draft
  with another tokenizer, whose calls cost more for a larger block.

Text repeats in runs: a matched passage is accepted whole or not at all, so rates per position
predict the gain of a proposal far better than one rate (the rate of a model draft).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch

from hsd_fast.decode_state import DecodeState
from hsd_fast.processors import LogitsTransform
from hsd_fast.profile.costs import interleaved_medians
from hsd_fast.proposal_level import ProposalLevel, Proposals
from hsd_fast.sampling_metadata import SamplingMetadata


class Proposal(NamedTuple):
    """One call of a proposal level in a replay."""

    row: int
    t: int  # the call proposes after the row's first t tokens
    tokens: list[int]
    q: list[float] | None = None  # each token's probability under the q it was drawn from (draws_q)


def replay(
    spec: ProposalLevel,
    ids: torch.Tensor,
    max_T: int,
    start: int = 1,
    compile: bool = False,
    transform: LogitsTransform | None = None,
) -> list[Proposal]:
    """The level's calls (proposals of at most ``max_T`` tokens) on each row of ``ids`` ([N, L]) as
    a run under the target makes them (module doc): the first after the row's first ``start``
    tokens, each next one after the tokens of the proposal that equal the text and one more. The
    rows are replayed side by side, as a batch of that many rows would be (one call for all rows
    at each step, each row at its own position); the calls come back ordered by row and position.
    ``transform``: a sampled run's, for a level that ``draws_q`` then (its draws seeded, each
    token's q kept); None replays a greedy run."""
    num_rows, length = ids.shape
    sampled = transform is not None and spec.draws_q(greedy=False)
    temperature = transform.temperature if sampled else 1.0
    sampling = SamplingMetadata.build(num_rows, ids.device, temperature=temperature, greedy=not sampled)
    proposer = spec.proposer(num_rows, sampling, compile, transform)
    text = ids.tolist()
    at = np.full(num_rows, start, dtype=np.int64)  # [N] each row's next call: after its first `at` tokens
    calls = []
    with torch.inference_mode():  # the draft of a bridged level runs a model
        while (rows := np.flatnonzero(at <= length)).size:
            wanted = np.full(rows.size, max_T, dtype=np.int64)  # [R]
            proposals = proposer.propose(ids, rows, at[rows], wanted)
            proposed, counts, q = proposals.tokens, proposals.counts, _drawn_q(proposals, sampling)
            accepted = np.zeros(rows.size, dtype=np.int64)  # [R] the proposed tokens that equal the text
            for i, (n, t) in enumerate(zip(rows.tolist(), at[rows].tolist(), strict=True)):
                proposal = proposed[i, : counts[i]].tolist()
                calls.append(Proposal(n, t, proposal, None if q is None else q[i, : counts[i]].tolist()))
                while accepted[i] < len(proposal) and t + accepted[i] < length:
                    if proposal[accepted[i]] != text[n][t + accepted[i]]:
                        break
                    accepted[i] += 1
            proposer.invalidate(rows, at[rows] + accepted)  # the target's own token follows them
            at[rows] += accepted + 1
    return sorted(calls, key=lambda call: call[:2])


def _drawn_q(proposals: Proposals, sampling: SamplingMetadata) -> np.ndarray | None:
    """[R, W'] each proposed token's probability under the q it was drawn from (None: point
    masses)."""
    if proposals.q_logits is None:
        return None
    q_logits = proposals.q_logits  # [R, W', V']
    tokens = torch.from_numpy(proposals.tokens[:, : q_logits.shape[1]]).to(q_logits.device)  # [R, W']
    logits = q_logits.gather(-1, tokens[..., None])[..., 0].float()  # [R, W']
    temperature = sampling.temperature[: logits.shape[0], None]  # [R, 1]: every row's is the run's
    return (logits / temperature - proposals.q_lse).exp().cpu().numpy()


def offered_lengths(proposals: list[Proposal], max_T: int) -> tuple[float, ...]:
    """The fraction of calls that offer b tokens, b = 0..max_T (the last: at least max_T)."""
    counts = np.bincount([len(p.tokens) for p in proposals], minlength=max_T + 1)[: max_T + 1]
    return tuple(float(c) for c in counts / max(1, len(proposals)))


def acceptance_by_position(
    proposals: list[Proposal],
    ids: torch.Tensor,  # [N, L] the replayed text
    scores: torch.Tensor,  # [N, L, V] probabilities or [N, L] argmax (greedy): the token after ids[n, :i+1]
    max_T: int,
) -> tuple[float, ...]:
    """(a_1, ..., a_max_T): a_j the weighted rate at which the model accepts the j-th proposed token
    among proposals whose tokens 1..j-1 it accepted (weight: the probability it did). A position
    with nothing to score takes the rate before it (a_1: 0, as for a lookup that never matches)."""
    greedy = scores.dim() == 2
    length = ids.shape[1]
    # The scorable tokens: (proposal, j, row, index of the scores, token, its q), while the proposal is text.
    items = []
    for k, (n, t, tokens, q) in enumerate(proposals):
        for j, token in enumerate(tokens, start=1):
            i = t + j - 2  # the scores of the token after the first t + j - 1 tokens
            if i >= length:
                break
            items.append((k, j, n, i, token, 1.0 if q is None else q[j - 1]))
            if t + j - 1 >= length or int(ids[n, t + j - 1]) != token:
                break  # the next token's context is not the text any more
    if not items:
        return (0.0,) * max_T
    k_, j_, n_, i_, x_, q_ = (torch.tensor(column) for column in zip(*items, strict=True))
    # greedy accepts iff x is the argmax; sampling accepts x with probability min(1, p(x) / q(x)), which
    # is p(x) for a point mass
    accepted = (scores[n_, i_] == x_).double() if greedy else (scores[n_, i_, x_].double() / q_).clamp(max=1)
    numerator, denominator = np.zeros(max_T + 1), np.zeros(max_T + 1)
    weight, current = 1.0, -1
    for k, j, a in zip(k_.tolist(), j_.tolist(), accepted.tolist(), strict=True):
        if k != current:
            weight, current = 1.0, k
        numerator[j] += weight * a
        denominator[j] += weight
        weight *= a
    rates, previous = [], 0.0
    for j in range(1, max_T + 1):
        previous = numerator[j] / denominator[j] if denominator[j] > 0 else previous
        rates.append(float(previous))
    return tuple(rates)


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
