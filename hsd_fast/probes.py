"""Probes of idle candidates in an adaptive run (docs/design.md, "Probes").

A candidate that sits out learns nothing from the verifications, so the controller's estimate of
its acceptance stays the profile's, measured on other text. A *probe* feeds the candidate, at a
look, the committed tokens its cache lacks (positions ``[cached, committed - 1)``: the catch-up it
would feed on its return anyway, so its cache stays current), keeps the logits of that forward, and
counts at how many positions its argmax is the committed next token. Only positions whose next
token the target generated are scored (a prompt token is the user's text, not the target's
choice). In a greedy run each scored position is one draft the candidate would have proposed
directly under the target: the count is its acceptance rate there, on the request's own text.

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
from hsd_fast.steps import Runner, processed_logits
from hsd_fast.switching_types import Probe


def probe(
    runner: Runner,
    candidate: int,
    state: DecodeState,
    rows: np.ndarray,  # [R] rows to probe (unfinished ones)
    starts: np.ndarray,  # [R] the candidate's cached length in each row
    ends: np.ndarray,  # [R] committed - 1: the last committed token is fed by the next step
    prompt_lens: np.ndarray,  # [B] positions below these hold the prompt
) -> Probe:
    """Feed ``runner`` positions ``[starts, ends)`` of ``rows`` (its cache then holds them) and
    score its argmax where the next token was generated (module doc)."""
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
    agreed = (logits.argmax(-1) == following) & scored
    return Probe(candidate, int(scored.sum()), int(agreed.sum()), time.perf_counter() - started)


def _on(values: np.ndarray, device: torch.device) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.int64)).to(device)
