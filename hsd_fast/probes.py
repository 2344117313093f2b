"""Probes of idle candidates in an adaptive run (docs/design.md, "Probes").

A candidate that sits out learns nothing from the verifications, so the controller's estimate of
its acceptance stays the profile's, measured on other text. A *probe* feeds the candidate, at a
look, the committed tokens its cache lacks (positions ``[cached, committed - 1)``: the catch-up it
would feed on its return anyway, so its cache stays current), keeps the logits of that forward, and
counts at how many positions its argmax is the committed next token. Only positions whose next
token the target generated are scored (a prompt token is the user's text, not the target's
choice). In a greedy run each scored position is one draft the candidate would have proposed
directly under the target: the count is its acceptance rate there, on the request's own text.

Where a lookup level is a candidate too, the probe also scores the candidate m as the level
between the lookup and the target (``lookup > m > target``): it replays the lookup's calls on the
probed stretch of committed text as it proposes under the target and counts, with the scoring of a
profile's replay (``proposal_scores``), how m takes the proposals (per block position) and
how the target takes what m hands up of them: the proposals m kept, m's corrections of those it
rejected, whose rates move with the text more than any, and m's other own tokens (its bonus after a
proposal it took whole, its draft where the lookup offered nothing; docs/design.md, "Tokens that
came through"). A chain with m over the lookup level is then judged on this request's text too.

Exactness: a probe reads committed tokens only and writes only an idle candidate's cache, at
positions of its committed prefix (what it would write there on return). No randomness is drawn,
the target and the token buffer are untouched; the switching machinery's argument (any policy,
any information it sees at round ends) covers it.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from hsd_fast.decode_state import DecodeState
from hsd_fast.layout import MAX_WIDTH, fed_block, head_chunks
from hsd_fast.lookup import LookupDraft
from hsd_fast.proposal_scores import (
    Scorable,
    accepted,
    choices,
    correction_trials,
    counts_by_position,
    kept_trials,
    own_trials,
    probabilities,
    replay,
    scorable,
)
from hsd_fast.steps import Runner, processed_logits
from hsd_fast.switching_types import Probe, ProposalsProbed


def probe(
    runner: Runner,
    candidate: int,
    state: DecodeState,
    rows: np.ndarray,  # [R] rows to probe (unfinished ones)
    starts: np.ndarray,  # [R] the candidate's cached length in each row
    ends: np.ndarray,  # [R] committed - 1: the last committed token is fed by the next step
    prompt_lens: np.ndarray,  # [B] positions below these hold the prompt
    lookup: tuple[int, LookupDraft, int] | None = None,  # the lookup candidate's index, spec and largest T
) -> Probe:
    """Feed ``runner`` positions ``[starts, ends)`` of ``rows`` (its cache then holds them) and
    score its argmax where the next token was generated, and with ``lookup`` also on the lookup's
    proposals there (module doc)."""
    started = time.perf_counter()
    num_rows, device = state.num_rows, state.tokens.device
    cursor = np.zeros(num_rows, dtype=np.int64)  # [B] per row: the first position still to feed
    until = np.zeros(num_rows, dtype=np.int64)  # [B]
    cursor[rows], until[rows] = starts, ends
    active = torch.zeros(num_rows, dtype=torch.bool, device=device)
    active[torch.from_numpy(rows).to(device)] = True
    for head_start, head_end in head_chunks(cursor, until, MAX_WIDTH):  # long gaps: cache only
        block = fed_block(state.tokens, _on(head_start, device), _on(head_end, device), active, MAX_WIDTH)
        runner.forward(block, 0)
        cursor = head_end
    width = int((until - cursor).max(initial=0))
    if width == 0:
        return Probe(candidate, 0, 0, time.perf_counter() - started)
    block = fed_block(state.tokens, _on(cursor, device), _on(until, device), active, width)
    logits = processed_logits(runner, state, block, width)  # [B, W, V]
    following = state.tokens.gather(1, block.positions + 1)  # [B, W] the committed next tokens
    generated = block.positions + 1 >= _on(prompt_lens, device)[:, None]  # [B, W]
    scored = block.valid & generated  # [B, W]
    argmax = logits.argmax(-1)  # [B, W]
    agreed = (argmax == following) & scored
    found = None
    if lookup is not None:
        found = _on_proposals(*lookup, state.tokens, rows, block.positions, argmax, scored)
    return Probe(candidate, int(scored.sum()), int(agreed.sum()), time.perf_counter() - started, found)


def _on_proposals(
    index: int,
    lookup: LookupDraft,
    max_T: int,
    tokens: torch.Tensor,  # [B, S] the run's token buffer
    rows: np.ndarray,  # [R]
    positions: torch.Tensor,  # [B, W] the probed positions
    argmax: torch.Tensor,  # [B, W] the candidate's argmax after each
    scored: torch.Tensor,  # [B, W] where the next token was generated
) -> ProposalsProbed:
    """The candidate as the level between the lookup and the target on each row's scored stretch
    (module doc): the lookup's calls replayed from the stretch's first position to its end, greedy,
    the committed text standing for the target's choices."""
    passed, tried = np.zeros(max_T), np.zeros(max_T)
    kept, corrections, own = np.zeros(2), np.zeros(2), np.zeros(2)
    positions, argmax, scored = (t.cpu().numpy() for t in (positions, argmax, scored))
    for r in rows.tolist():
        at = positions[r, scored[r]]  # [N] consecutive positions, each the index of a token's scores
        if at.size == 0:
            continue
        first, last = int(at[0]), int(at[-1])
        text = tokens[r : r + 1, : last + 2].cpu()  # [1, L] ends with the last scored next token
        mine = torch.full_like(text, -1)  # [1, L] the candidate's argmax after each position (-1: unknown)
        mine[0, at] = torch.from_numpy(argmax[r, scored[r]])
        target = torch.cat([text[:, 1:], torch.full_like(text[:, :1], -1)], 1)  # [1, L]: the committed
        calls = replay(lookup, text, max_T, start=first + 1)
        items = scorable(calls, text)
        known = items.index <= last  # [I] past the last scored position neither choice is known
        items = Scorable(*(column[known] for column in items))
        below, above = probabilities(items, mine), probabilities(items, target)  # [I] each, greedy: 0 or 1
        below_choice, above_choice = choices(items, mine), choices(items, target)  # [I] each
        by_position = counts_by_position(items, accepted(items, below), max_T)
        passed, tried = passed + by_position[0], tried + by_position[1]
        kept += kept_trials(items, below, above)
        corrections += correction_trials(items, below, below_choice, above_choice)
        own += own_trials(calls, mine.numpy(), target.numpy())
    return ProposalsProbed(index, passed, tried, tuple(kept), tuple(corrections), tuple(own))


def _on(values: np.ndarray, device: torch.device) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.int64)).to(device)
