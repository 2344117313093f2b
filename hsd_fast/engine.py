"""The HSD loop (docs/design.md, "The algorithm") over a stack of per-level runners, driven by the C++ ledger.

    while some row is unfinished:
        level = ledger.next_level()                  # lockstep: one level's forward at a time
        logits = runners[level].forward(its rows' spans of uncached tokens)
        level 0:  draw one token per row            -> ledger.commit_draft
        else:     verify the block of tag level-1   -> ledger.commit_verify (rollback, flush, end)

The ledger (integers only) decides what to feed and what to keep; this module moves the tensors:
the token buffer, and for every speculative token the distribution ``p`` of the level that tagged it
(processed logits + fp32 log-sum-exp), kept in a ring buffer over the speculative window. That
distribution is the ``q`` the next level up verifies against.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from hsd_fast._C import Ledger
from hsd_fast.sampling_metadata import SamplingMetadata
from hsd_fast.stats import HSDStats
from hsd_fast.triton_kernels.keyed_random_torch import DRAFT
from hsd_fast.triton_kernels.ops import sample, verify
from hsd_fast.triton_kernels.rejection_torch import VerifyResult


@dataclass(frozen=True)
class Feed:
    """What one level must process for the rows taking part in a forward.

    Row ``rows[j]`` feeds its tokens at positions ``[starts[j], ends[j])`` (those it has not
    cached) and returns logits for positions ``[out_starts[j], ends[j])``; the logits at position t
    give the distribution of the token at t + 1.
    """

    rows: np.ndarray  # [R] int64 row indices (host)
    starts: np.ndarray  # [R] int64
    ends: np.ndarray  # [R] int64
    out_starts: np.ndarray  # [R] int64
    tokens: torch.Tensor  # [sum(ends - starts)] int64, row after row

    @property
    def num_outputs(self) -> np.ndarray:  # [R]
        return self.ends - self.out_starts


class Runner(Protocol):
    """One level of the hierarchy: a model plus its cache."""

    vocab_size: int

    def prepare(self, num_rows: int, capacity: int) -> None:
        """Start a run: empty caches for ``num_rows`` rows of up to ``capacity`` positions."""

    def forward(self, feed: Feed) -> torch.Tensor:
        """Cache the fed tokens and return processed logits, ``[sum(feed.num_outputs), V]``."""


@dataclass
class HSDResult:
    sequences: list[torch.Tensor]  # per row: prompt + generated tokens, [len] int64
    num_new_tokens: list[int]
    stats: HSDStats


def ragged_arange(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For spans [starts[j], ends[j]): (index j of each element, its position), both [sum(len)]."""
    lens = ends - starts
    owner = np.repeat(np.arange(len(starts)), lens)
    first = np.cumsum(lens) - lens  # where each span begins in the flat output
    return owner, starts[owner] + np.arange(int(lens.sum())) - first[owner]


def speculative_window(block_sizes: Sequence[int]) -> int:
    """Ring size for per-position draft distributions. Level 0 holds at most T_0 pending tokens;
    a verification by level i adds at most (pending of level i-1) + 1 to a level that held fewer
    than T_i, so level i holds at most T_0 + ... + T_i. +2 covers the bonus slot and one beyond."""
    prefix = np.cumsum(block_sizes)
    return int(prefix.sum()) + 2


def run_hsd(
    runners: Sequence[Runner],
    prompts: Sequence[torch.Tensor],
    *,
    block_sizes: Sequence[int],
    max_new_tokens: int | Sequence[int],
    eos_token_id: int | Sequence[int] | None = None,
    seeds: torch.Tensor | int = 0,
    temperature: float | torch.Tensor = 1.0,
    greedy: bool = False,
    policy: str = "most_rows",
    on_commit: Callable[[int, torch.Tensor], None] | None = None,
    use_kernel: bool | None = None,
) -> HSDResult:
    """Generate with the hierarchy ``runners`` (level 0 drafts, the last is the target).

    ``block_sizes[i]`` is T_i: level i+1 verifies once level i has emitted at least T_i tokens.
    ``seeds``: one int (row seeds derived from it) or one int64 per row. ``temperature``: one float
    or one per row, applied to the runners' logits. ``on_commit(row, tokens)`` is called with every
    row's newly committed tokens, in order, as the target commits them (streaming). ``use_kernel``:
    draft and verify with the Triton kernels (default: on CUDA tensors) or the torch references.
    """
    num_levels, num_rows = len(runners), len(prompts)
    if num_levels < 1:
        raise ValueError("need at least one runner (the target)")
    vocab = runners[-1].vocab_size
    if any(r.vocab_size != vocab for r in runners):
        raise ValueError(f"runners disagree on vocab_size: {[r.vocab_size for r in runners]}")
    budget = np.broadcast_to(np.asarray(max_new_tokens, dtype=np.int64), (num_rows,))
    prompt_lens = np.array([p.numel() for p in prompts], dtype=np.int64)
    ledger = Ledger(num_levels, list(block_sizes), prompt_lens.tolist(), budget.tolist(), policy)
    # +1: a bonus drawn past the length budget is written before the ledger drops it
    capacity = int((prompt_lens + budget).max()) + 1
    sampling = SamplingMetadata.build(
        num_rows, prompts[0].device, seeds, temperature, eos_token_id, greedy, use_kernel
    )
    state = DecodeState(prompts, capacity, speculative_window(block_sizes), num_levels, vocab, sampling)
    stats = HSDStats(num_levels)
    for runner in runners:
        runner.prepare(num_rows, capacity)

    emitted = prompt_lens.copy()  # per row: tokens already handed to on_commit
    while (level := ledger.next_level()) >= 0:
        started = time.perf_counter()
        rows = ledger.rows_for(level)
        starts, ends, outs = ledger.spans(level, rows)
        logits = runners[level].forward(state.feed(rows, starts, ends, outs))  # [N, V]
        stats.record_forward(level, len(rows), int((ends - starts).sum()))
        if level == 0:
            ledger.commit_draft(rows, state.draft(rows, ends, logits))
            stats.record_draft(len(rows))
        else:
            accepted, next_is_eos = state.verify(level, rows, outs, ends, logits)
            kept, cascaded = ledger.commit_verify(level, rows, accepted, next_is_eos)
            stats.record_verify(level, ends - outs - 1, accepted, kept, cascaded)
        stats.wall_time[level] += time.perf_counter() - started  # each step ends in a host sync
        if on_commit is not None and level == num_levels - 1:
            lens = ledger.output_lens()
            for r in np.flatnonzero(lens > emitted):
                on_commit(int(r), state.tokens[r, emitted[r] : lens[r]])
            emitted = np.maximum(emitted, lens)

    lens = ledger.output_lens()
    sequences = [state.tokens[r, : lens[r]].clone() for r in range(num_rows)]
    return HSDResult(sequences, (lens - prompt_lens).tolist(), stats)


class DecodeState:
    """The tensors of one run: the tokens, and for every speculative position the distribution of
    the level that tagged it (processed logits + fp32 log-sum-exp), in a ring over the window."""

    def __init__(
        self,
        prompts: Sequence[torch.Tensor],
        capacity: int,
        window: int,
        num_levels: int,
        vocab: int,
        sampling: SamplingMetadata,
    ) -> None:
        num_rows, device = len(prompts), prompts[0].device
        self.device, self.window, self.top, self.vocab = device, window, num_levels - 1, vocab
        self.sampling = sampling
        self.tokens = torch.zeros(num_rows, capacity, dtype=torch.int64, device=device)  # [B, S]
        for r, p in enumerate(prompts):
            self.tokens[r, : p.numel()] = p
        self.q_logits: torch.Tensor | None = None  # [B, W, V], allocated at the first forward
        self.q_lse = torch.zeros(num_rows, window, dtype=torch.float32, device=device)  # [B, W]

    def _t(self, array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(array).to(self.device)

    def feed(self, rows: np.ndarray, starts: np.ndarray, ends: np.ndarray, outs: np.ndarray) -> Feed:
        owner, pos = ragged_arange(starts, ends)
        return Feed(rows, starts, ends, outs, self.tokens[rows[owner], pos])

    def keep_p(self, rows: np.ndarray, pos: np.ndarray, logits: torch.Tensor, lse: torch.Tensor) -> None:
        """Store the distribution of the tokens at (rows, pos): the q of the next level up."""
        if self.q_logits is None:
            shape = (self.tokens.shape[0], self.window, self.vocab)
            self.q_logits = logits.new_zeros(shape)
        elif self.q_logits.dtype != torch.promote_types(self.q_logits.dtype, logits.dtype):
            self.q_logits = self.q_logits.to(logits.dtype)  # levels differ: keep the widest dtype
        self.q_logits[rows, pos % self.window] = logits.to(self.q_logits.dtype)
        self.q_lse[rows, pos % self.window] = lse

    def draft(self, rows: np.ndarray, ends: np.ndarray, logits: torch.Tensor) -> np.ndarray:
        """Level 0 draws one token per row at position ``ends``; returns the EOS flags [R]."""
        r, new_pos, meta = self._t(rows), self._t(ends), self.sampling
        drawn, lse = sample(
            logits, meta.temperature[r], meta.seeds[r], new_pos, 0, DRAFT, meta.greedy,
            use_kernel=meta.use_kernel,
        )  # fmt: skip
        self.tokens[r, new_pos] = drawn
        if self.top > 0:
            self.keep_p(rows, ends, logits, lse)
        return torch.isin(drawn, meta.eos_ids).cpu().numpy()  # host sync: the ledger needs EOS flags

    def keep_emitted(
        self,
        rows: np.ndarray,  # [R]
        outs: np.ndarray,  # [R]
        ends: np.ndarray,  # [R]
        logits: torch.Tensor,  # [R + D, V] the verifier's, at positions [outs[j], ends[j]) per row
        result: VerifyResult,
    ) -> None:
        """Keep the verifier's own p for every token it just emitted (accepted, correction or
        bonus): the q the next level up verifies them against. Never the residual a correction was
        drawn from: that token is still marginally a sample of p (docs/design.md, "The algorithm")."""
        p_owner, p_pos = ragged_arange(outs + 1, ends + 1)
        self.keep_p(rows[p_owner], p_pos, logits, result.verifier_lse)

    def verify(
        self, level: int, rows: np.ndarray, outs: np.ndarray, ends: np.ndarray, logits: torch.Tensor
    ) -> tuple[np.ndarray, np.ndarray]:
        """``level`` verifies row j's drafts at positions [outs[j] + 1, ends[j]) with its logits at
        [outs[j], ends[j]). Returns the accepted counts and EOS flags of the correction/bonus."""
        assert self.q_logits is not None
        r, first_pos = self._t(rows), self._t(outs + 1)  # [R]
        num_drafts = ends - outs - 1
        offsets = self._t(np.concatenate([[0], np.cumsum(num_drafts)]))  # [R + 1]
        d_owner, d_pos = ragged_arange(outs + 1, ends)
        d_rows, d_slot = rows[d_owner], d_pos % self.window
        draft_logits = self.q_logits[d_rows, d_slot]  # [D, V] (a copy: p is stored below)
        meta = self.sampling
        result = verify(
            logits, draft_logits, self.q_lse[d_rows, d_slot], self.tokens[d_rows, d_pos],
            offsets, meta.temperature[r], meta.seeds[r], first_pos, level, meta.greedy,
            use_kernel=meta.use_kernel,
        )  # fmt: skip
        self.tokens[r, first_pos + result.num_accepted] = result.next_token
        if level < self.top:
            self.keep_emitted(rows, outs, ends, logits, result)
        is_eos = torch.isin(result.next_token, meta.eos_ids)
        host = torch.stack([result.num_accepted, is_eos]).cpu().numpy()  # the round's one sync
        return host[0], host[1]
