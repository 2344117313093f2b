"""A proposal level's calls replayed on text, and models scored on the tokens they propose
(docs/design.md, "Profiling the lookup level"): what a profile measures on calibration text
(``profile/proposal_replay``) and a probe on a request's committed text (``probes``), with the
same code.

- ``replay``: the level's calls as a run under the target makes them: at position t of a row it
  proposes from the row's first t tokens (the longest proposal a block allows; a smaller block
  takes its prefix); the target accepts the proposed tokens that equal the text and emits the next
  one, so the next call is at t + accepted + 1. Under greedy decoding that is the run itself;
  sampled, it has the run's law: x is accepted with probability p(x), the chance the target's
  sample is x, and a rejection's correction is p without x, as the text's token is then. Calls, not
  positions: a matched passage takes one call for many tokens, fresh text one per token;
- ``scorable``: the proposed tokens whose context is known, teacher-forced: a token can only be
  scored while the proposal before it equals the text, so proposals are followed until they leave
  it;
- ``counts_by_position`` / ``rates_by_position``: per position j of a proposal, the rate a model
  accepts token j given it accepted tokens 1..j-1 (``latency.Acceptance``), under the sampling
  transform: p(x) for a sampled verification of a point-mass draft, min(1, p(x) / q(x)) for a level
  that draws its proposals from a q it hands up, argmax == x for a greedy one;
- ``kept_trials`` / ``correction_trials`` / ``own_trials``: in a chain proposal level > m > v, v's
  rate on the proposed tokens m kept, on m's corrections and on m's other own tokens
  (docs/design.md, "Tokens that came through").
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from hsd_fast.processors import LogitsTransform
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


class Scorable(NamedTuple):
    """The proposed tokens a model can be scored on, teacher-forced (``scorable``), ``[I]`` each, in
    call order and, within a call, by position."""

    call: np.ndarray  # the index of the call in the replay's list
    position: np.ndarray  # j: the j-th token of its proposal (from 1)
    row: np.ndarray  # the replayed row
    index: np.ndarray  # where the scores of the token sit: after the row's first index + 1 tokens
    token: np.ndarray
    q: np.ndarray  # its probability under the q it was drawn from (1: a point mass)


def scorable(proposals: list[Proposal], ids: torch.Tensor) -> Scorable:
    """Every proposed token whose context is known (``ids`` [N, L], the replayed text): a proposal's
    tokens while the ones before them equal the text."""
    length = ids.shape[1]
    items = []
    for k, (n, t, tokens, q) in enumerate(proposals):
        for j, token in enumerate(tokens, start=1):
            i = t + j - 2  # the scores of the token after the first t + j - 1 tokens
            if i >= length:
                break
            items.append((k, j, n, i, token, 1.0 if q is None else q[j - 1]))
            if t + j - 1 >= length or int(ids[n, t + j - 1]) != token:
                break  # the next token's context is not the text any more
    columns = zip(*items, strict=True) if items else ([],) * 6
    *integers, q_ = (np.asarray(column) for column in columns)
    return Scorable(*(c.astype(np.int64) for c in integers), q_.astype(np.float64))


def probabilities(items: Scorable, scores: torch.Tensor) -> np.ndarray:
    """[I] each of ``items``' probability under the model of ``scores`` ([N, L, V] probabilities, or
    [N, L] argmax when greedy: the token after ``ids[n, :i + 1]``): p(x), greedy 1 where x is the
    argmax and 0 elsewhere."""
    if items.token.size == 0:
        return np.zeros(0)
    n, i, x = (torch.from_numpy(c) for c in (items.row, items.index, items.token))
    return (scores[n, i] == x).double().numpy() if scores.dim() == 2 else scores[n, i, x].double().numpy()


def accepted(items: Scorable, p: np.ndarray) -> np.ndarray:
    """[I] the probability that a model whose ``probabilities`` are ``p`` accepts each of ``items``:
    min(1, p(x) / q(x)), which is p(x) for a point mass (greedy: 1 iff x is its argmax)."""
    return np.minimum(1.0, p / items.q)


def counts_by_position(items: Scorable, accepts: np.ndarray, max_T: int) -> tuple[np.ndarray, np.ndarray]:
    """Per position j = 1..max_T of a proposal (``[max_T]`` each), the trials a model passed and
    those it took: a trial of the j-th proposed token among proposals whose tokens 1..j-1 it
    accepted, weighted by the probability it did (``accepts``: ``accepted``'s)."""
    passed_at, tried_at = np.zeros(max_T), np.zeros(max_T)
    tried, passed = _weighted(items, np.ones_like(accepts), accepts)  # a trial where it took the ones before
    np.add.at(passed_at, items.position - 1, passed)  # positions run from 1 to at most max_T
    np.add.at(tried_at, items.position - 1, tried)
    return passed_at, tried_at


def rates_by_position(items: Scorable, accepts: np.ndarray, max_T: int) -> tuple[float, ...]:
    """(a_1, ..., a_max_T): a_j the rate at which a model accepts the j-th proposed token among
    proposals whose tokens 1..j-1 it accepted (``counts_by_position``). A position with nothing to
    score takes the rate before it (a_1: 0, as for a lookup that never matches)."""
    rates, previous = [], 0.0
    for passed, tried in zip(*counts_by_position(items, accepts, max_T), strict=True):
        previous = passed / tried if tried > 0 else previous
        rates.append(float(previous))
    return tuple(rates)


def acceptance_by_position(
    proposals: list[Proposal],
    ids: torch.Tensor,  # [N, L] the replayed text
    scores: torch.Tensor,  # [N, L, V] probabilities or [N, L] argmax (greedy): the token after ids[n, :i+1]
    max_T: int,
) -> tuple[float, ...]:
    """``rates_by_position`` of the model of ``scores`` on the proposals' ``scorable`` tokens."""
    items = scorable(proposals, ids)
    return rates_by_position(items, accepted(items, probabilities(items, scores)), max_T)


def accepted_through(items: Scorable, below: np.ndarray, above: np.ndarray) -> float | None:
    """The rate at which a model v accepts the proposed tokens that the model m under it accepted
    (``below``, ``above``: their ``probabilities``): in a chain proposal level > m > v, v's rate on
    the tokens m hands up from the proposals (docs/design.md, "Tokens that came through"), from
    ``kept_trials``. None where m accepted no proposed token."""
    return _rate(*kept_trials(items, below, above))


def kept_trials(items: Scorable, below: np.ndarray, above: np.ndarray) -> tuple[float, float]:
    """``accepted_through``'s trials, passed and taken: a trial is a token m accepted whose
    proposal's tokens before it both accepted. m keeps x with a_m = min(1, p_m(x) / q(x)) and hands
    it up as a sample of its own distribution, which v keeps with min(1, p_v(x) / p_m(x)); greedy,
    both are 1 iff x is the model's argmax."""
    taken = accepted(items, below)
    both = taken * np.minimum(1.0, np.divide(above, below, out=np.zeros_like(above), where=below > 0))
    tried, passed = _weighted(items, taken, both)
    return float(passed.sum()), float(tried.sum())


def choices(items: Scorable, scores: torch.Tensor) -> np.ndarray | None:
    """[I] a greedy model's argmax where each of ``items`` is scored (``scores`` [N, L] argmax); None
    for a sampled one."""
    if scores.dim() != 2:
        return None
    return scores[torch.from_numpy(items.row), torch.from_numpy(items.index)].numpy()


def corrected_through(
    items: Scorable, below: np.ndarray, below_choice: np.ndarray, above_choice: np.ndarray
) -> float | None:
    """Greedy: the rate at which a model v accepts the corrections of the model m under it, m's own
    token where it rejected a proposed token (``correction_trials``). Where m rejects a proposal the
    text repeats, the target usually sides with the proposal: its rate is far below m's own rate
    (docs/design.md, "Tokens that came through"). None where m rejected none."""
    return _rate(*correction_trials(items, below, below_choice, above_choice))


def correction_trials(
    items: Scorable, below: np.ndarray, below_choice: np.ndarray, above_choice: np.ndarray
) -> tuple[float, float]:
    """``corrected_through``'s trials, passed and taken (``below``: m's ``probabilities``;
    ``*_choice``: m's and v's ``choices``): a trial is a proposed token m rejected whose proposal's
    tokens before it both accepted; it passes where v's argmax is m's."""
    both = below * (below_choice == above_choice)  # both took the proposed token
    rejected = 1.0 - below
    tried, _ = _weighted(items, rejected, both)
    passed = tried * (below_choice == above_choice)
    return float(passed.sum()), float(tried.sum())


def own_trials(
    proposals: list[Proposal],
    below_choice: np.ndarray,  # [N, L] m's argmax after each prefix ids[n, :i + 1] (-1: unknown)
    above_choice: np.ndarray,  # [N, L] v's, the same way
) -> tuple[float, float]:
    """Greedy: in a chain proposal level > m > v, v's trials on m's other own tokens, passed and
    taken: m's token right after a proposal it took whole (its bonus) and where the level offered
    nothing (its own draft). A trial where m and v both took every proposed token (so m's token
    follows the text v continues) and both choices after them are known; it passes where they
    agree. On text that repeats, m's bonus after a whole passage is right far more often than its
    rate on ordinary text (docs/design.md, "Tokens that came through", *Past the kept proposals*)."""
    length = below_choice.shape[1]
    passed = tried = 0
    for n, t, tokens, _ in proposals:
        after = t - 1 + len(tokens)  # where the choices of the token after the proposal sit
        if after >= length or any(
            below_choice[n, t - 1 + j] != x or above_choice[n, t - 1 + j] != x for j, x in enumerate(tokens)
        ):
            continue
        mine, theirs = below_choice[n, after], above_choice[n, after]
        if mine >= 0 and theirs >= 0:
            tried += 1
            passed += int(mine == theirs)
    return float(passed), float(tried)


def _rate(passed: float, tried: float) -> float | None:
    return passed / tried if tried > 0 else None


def _weighted(items: Scorable, accepts: np.ndarray, both: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[I] each item's weight as a trial (the probability ``both`` accepted every token before it in
    its call, times ``accepts``'s of itself: the level under taking it) and as a pass (``both``'s
    of every token up to it)."""
    tried, passed = np.zeros(len(both)), np.zeros(len(both))
    weight, current = 1.0, -1
    for k, (call, a, b) in enumerate(zip(items.call.tolist(), accepts.tolist(), both.tolist(), strict=True)):
        if call != current:
            weight, current = 1.0, call
        tried[k], passed[k] = weight * a, weight * b
        weight *= b
    return tried, passed
