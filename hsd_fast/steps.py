"""Level steps: one forward of a level over its fed block, the sampling transform, then a draft
(level 0) or a verification (levels >= 1), on device tensors, in the padded layout of
``layout.py``. Each step is a pure function of tensors at static shapes, so the same code runs
eagerly or compiled (``torch.compile``: inductor on CPU, CUDA graphs on CUDA), once per level and
pair of widths (docs/design.md, "Compiled steps"). ``level_step.py`` picks and compiles them; the
token-tree steps (``tree_steps.py``) build on the helpers here.

Shapes: B rows in the run, L fed columns, O output columns (the last O of the L), D = O - 1 draft
columns of a verification, V vocabulary, S token positions, W ring slots.

A step writes its results into the run's tensors (the drawn or corrected token into ``tokens``, the
emitting level's distribution into the ring) and returns one small ``[3, B]`` int64 tensor, the
only thing the host reads back: per row the accepted (or drawn) count, whether the new token is an
EOS, and whether the logits it used were broken (NaN or +inf).
Rows that sit the step out write to trash slots (the last column of ``tokens``, the last ring slot).
"""

from __future__ import annotations

from typing import Protocol

import torch

from hsd_fast.decode_state import DecodeState
from hsd_fast.layout import FedBlock, fed_block
from hsd_fast.triton_kernels.keyed_random_torch import DRAFT
from hsd_fast.triton_kernels.ops import sample, verify
from hsd_fast.triton_kernels.rejection_torch import VerifyResult


class Runner(Protocol):
    """One level of the hierarchy: a model plus its cache.

    Optional: ``reuse_of(lower) -> Runner | None``, a runner this level verifies with when the level
    below (``lower``) is an early exit of its own model: its forward starts from the hidden states
    ``lower`` kept, so the engine feeds ``lower`` every position of a block before the step
    (docs/design.md, "Early-exit levels"); ``compilable = False``, a runner whose forward cannot be
    traced (host-side bookkeeping, as the table runners of the exactness tests), which
    ``compile="auto"`` then leaves eager."""

    vocab_size: int
    dtype: torch.dtype  # of the logits it returns

    def prepare(self, num_rows: int, capacity: int, tree_slots: int = 0) -> None:
        """Start a run: empty caches for ``num_rows`` rows of up to ``capacity`` positions, and
        ``tree_slots`` more slots past them (a token tree's nodes stand after a row's prefix)."""

    def forward(self, block: FedBlock, num_outputs: int) -> torch.Tensor:
        """Cache the valid tokens of ``block`` and return the raw logits of its last
        ``num_outputs`` columns, ``[B, num_outputs, V]`` (0: none, only cache)."""

    def move(self, tree_start: torch.Tensor, nodes: torch.Tensor, lengths: torch.Tensor) -> None:
        """After a token tree's verification: per row, copy the cache entries of tree slots
        ``tree_start + nodes[:, d]`` to slots ``tree_start + d`` for ``d < lengths`` (``[B]``,
        ``[B, K]``, ``[B]``), all read before any is written (docs/design.md, "Token trees in the
        engine")."""


def processed_logits(
    runner: Runner, state: DecodeState, block: FedBlock, num_outputs: int, *, with_raw: bool = False
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The level's logits at the block's last ``num_outputs`` columns through the sampling transform;
    a history processor (the repetition penalty, the n-gram ban, bad words) reads each column's own
    history, drafts included (``DecodeState.history_ids``: a chain's by position, a tree node's by its
    ancestors), a length processor each column's ``input_ids`` width (``DecodeState.lengths``), and
    any other processor is called with each column's own ``input_ids`` (``DecodeState.prefixes``).
    ``with_raw``: also the raw logits (the target keeping ``output_logits``)."""
    logits = runner.forward(block, num_outputs)  # [B, O, V]
    inputs = state.processor_inputs(block, num_outputs)
    processed = state.transform(logits.flatten(0, 1), inputs)  # [B * O, V]
    processed = processed.unflatten(0, logits.shape[:2])  # [B, O, V]
    return (processed, logits) if with_raw else processed


def broken_logits(logits: torch.Tensor, used: torch.Tensor) -> torch.Tensor:
    """[B] bool: a row whose used logits (``used``: [B] or [B, O]) hold a NaN or +inf (-inf marks an
    excluded token, which is fine): no distribution, so nothing drawn from it may be trusted."""
    bad = (torch.isnan(logits) | torch.isposinf(logits)).any(-1) & used  # [B] or [B, O]
    return bad if bad.dim() == 1 else bad.any(-1)


def point_masses_where_broken(
    logits: torch.Tensor,  # [..., V] a verifier's processed logits at the columns it emitted from
    lse: torch.Tensor,  # [...] fp32 their log-sum-exp
    tokens: torch.Tensor,  # [...] the token it emitted at each
) -> tuple[torch.Tensor, torch.Tensor]:
    """The distributions to keep as the next level's q: where a column's logits are broken (NaN or
    +inf), a point mass on its token instead (logits 0 there and -inf elsewhere, log-sum-exp 0).
    Verification against a point mass is exact whatever the token, and whether a column is broken
    depends only on the tokens before it (docs/design.md, "Why it is exact"). A NaN or +inf logit
    makes the log-sum-exp NaN or +inf, so that is read instead of scanning the vocabulary again."""
    bad = (torch.isnan(lse) | torch.isposinf(lse))[..., None]  # [..., 1]
    ids = torch.arange(logits.shape[-1], device=logits.device)  # [V]
    point = torch.where(ids == tokens[..., None], 0.0, -torch.inf).to(logits.dtype)  # [..., V]
    return torch.where(bad, point, logits), torch.where(bad[..., 0], 0.0, lse)


def step_result(
    num_accepted: torch.Tensor,
    token: torch.Tensor,
    eos_ids: torch.Tensor,
    active: torch.Tensor,
    broken: torch.Tensor,
) -> torch.Tensor:
    """[3, B] int64: accepted counts, whether the new token is an EOS, and whether the row's logits
    were broken (NaN or +inf), for active rows."""
    is_eos = (token[:, None] == eos_ids[None, :]).any(-1) & active  # [B]
    return torch.stack([num_accepted, is_eos.long(), broken.long()])


def draft_step(
    runner: Runner,
    state: DecodeState,
    spans: torch.Tensor,  # [5, B] int64 per row: starts, ends, outs, active (0/1), drafts wanted
    *,
    width: int,
    count: int,
    keep_q: bool,
    use_kernel: bool | None,
    below_target: bool,
) -> torch.Tensor:  # [3, B]
    """Level 0: feed the block, then draw up to ``count`` tokens one after the other at positions
    ``ends, ends + 1, ...``: row r stops after its wanted number, after an EOS, or before broken
    logits (docs/design.md, "Why it is exact"). Drafting a few tokens in one step draws exactly the
    tokens one-token steps would (keyed randomness: a token's uniforms depend on its position, not on
    the step) and saves a step's overhead per token. Returns per row the number drawn, whether the
    last one is an EOS, and whether it stopped at broken logits."""
    starts, ends, meta = spans[0], spans[1], state.sampling
    seeds = meta.seeds_at(below_target)  # [B]: level 0 is the target itself when nothing drafts
    going, wanted = spans[3].bool() & (spans[4] > 0), spans[4]  # [B]
    rows = torch.arange(state.num_rows, device=ends.device)
    block = fed_block(state.tokens, starts, ends, going, width)
    drawn_count = torch.zeros_like(ends)
    last_is_eos, broken = torch.zeros_like(going), torch.zeros_like(going)
    keeps = state.outputs is not None and not below_target  # the target draws: it keeps its outputs
    for k in range(count):
        if k > 0:  # feed the token drawn last
            block = fed_block(state.tokens, ends + k - 1, ends + k, going, 1)
        logits, raw = processed_logits(runner, state, block, 1, with_raw=True)
        logits = logits[:, 0]  # [B, V]
        bad = broken_logits(logits, going)  # [B]
        broken, going = broken | bad, going & ~bad  # nothing is drawn from broken logits
        position = ends + k  # [B]
        drawn, lse = sample(
            logits, meta.temperature, seeds, position, 0, DRAFT, meta.greedy, use_kernel=use_kernel
        )  # [B], [B]
        state.tokens[rows, torch.where(going, position, state.trash)] = drawn
        if keeps:
            state.outputs.keep(position[:, None], going[:, None], logits[:, None], raw)
        if keep_q:
            state.keep_p(rows, state.ring_slot(position, going), logits, lse)
        last_is_eos = torch.where(going, (drawn[:, None] == meta.eos_ids).any(-1), last_is_eos)
        drawn_count = drawn_count + going.long()
        going = going & ~last_is_eos & (k + 1 < wanted)
    return torch.stack([drawn_count, last_is_eos.long(), broken.long()])


def verify_step(
    runner: Runner,
    state: DecodeState,
    spans: torch.Tensor,  # [5, B] int64 per row: starts, ends, outs, active; drafts at [outs + 1, ends)
    *,
    level: int,
    width: int,
    out_width: int,
    keep_q: bool,
    use_kernel: bool | None,
    point_mass: bool = False,
    below_target: bool,
) -> torch.Tensor:  # [3, B]
    """Level >= 1: feed the block, verify each row's drafts at ``[outs + 1, ends)`` against the ring
    (``point_mass``: the drafts are a lookup level's, each q a point mass on its token, and no ring is
    read), write the correction or bonus, and (``keep_q``) keep this level's p for the tokens it
    emitted. Returns [3, B]: accepted counts, EOS flags and broken-logits flags."""
    starts, ends, outs, active = spans[0], spans[1], spans[2], spans[3].bool()
    meta, drafts = state.sampling, out_width - 1  # D draft columns
    rows = torch.arange(state.num_rows, device=ends.device)
    block = fed_block(state.tokens, starts, ends, active, width)
    logits, raw = processed_logits(runner, state, block, out_width, with_raw=True)  # [B, D + 1, V] each
    num_drafts = torch.where(active, ends - outs - 1, 0)  # [B]
    columns = torch.arange(drafts + 1, device=ends.device)  # [D + 1]
    positions = ends[:, None] - drafts + columns  # [B, D + 1]: the token each column's p is for
    draft_tokens = state.tokens.gather(1, positions[:, :drafts].clamp(min=0))  # [B, D]
    if meta.greedy:  # greedy verification reads no q
        draft_logits = logits.new_zeros(()).expand(state.num_rows, drafts, logits.shape[-1])
        draft_lse = logits.new_zeros((), dtype=torch.float32).expand(state.num_rows, drafts)
    elif point_mass:
        draft_logits = draft_lse = None
    else:
        assert state.q_logits is not None and state.q_lse is not None
        is_draft = columns[:drafts] >= drafts - num_drafts[:, None]  # [B, D]
        slots = state.ring_slot(positions[:, :drafts].clamp(min=0), is_draft)  # [B, D]
        draft_logits, draft_lse = state.q_logits[rows[:, None], slots], state.q_lse[rows[:, None], slots]
    result = verify(
        logits, draft_logits, draft_lse, draft_tokens, num_drafts, meta.temperature,
        meta.seeds_at(below_target), ends - num_drafts, level, meta.greedy, use_kernel=use_kernel,
    )  # fmt: skip
    emitted_at = ends - num_drafts + result.num_accepted  # [B]
    state.tokens[rows, torch.where(active, emitted_at, state.trash)] = result.next_token
    if state.outputs is not None and not below_target:  # the target: drafts accepted, then its token
        first = drafts - num_drafts[:, None]  # [B, 1] the first draft's column
        kept = active[:, None] & (columns >= first) & (columns <= first + result.num_accepted[:, None])
        state.outputs.keep(positions, kept, logits, raw)
    if keep_q:
        emitted = active[:, None] & (columns >= drafts - num_drafts[:, None])  # [B, D + 1]
        tokens = state.tokens.gather(1, positions.clamp(min=0))  # [B, D + 1] each column's emitted token
        kept, lse = point_masses_where_broken(logits, result.verifier_lse, tokens)
        slots = state.ring_slot(positions.clamp(min=0), emitted)
        keep_emitted(state, rows, slots, kept, result._replace(verifier_lse=lse))
    used = active[:, None] & (columns >= drafts - num_drafts[:, None])  # [B, D + 1]: drafts and bonus
    return step_result(
        result.num_accepted, result.next_token, meta.eos_ids, active, broken_logits(logits, used)
    )


def keep_emitted(
    state: DecodeState,
    rows: torch.Tensor,  # [B]
    slots: torch.Tensor,  # [B, D + 1] ring slots of the tokens at the verifier's columns (or trash)
    logits: torch.Tensor,  # [B, D + 1, V] the verifier's processed logits
    result: VerifyResult,
) -> None:
    """Keep the verifier's own p for every token it just emitted (accepted, correction or bonus):
    the q the next level up verifies them against. Never the residual a correction was drawn from:
    that token is still marginally a sample of p (docs/design.md, "Verify")."""
    state.keep_p(rows[:, None], slots, logits, result.verifier_lse)


def feed_step(runner: Runner, state: DecodeState, spans: torch.Tensor, *, width: int) -> None:
    """Only cache a span (a chunk of a prompt, an early exit caught up), ``width`` at a time: no
    outputs, so no LM head."""
    runner.forward(fed_block(state.tokens, spans[0], spans[1], spans[3].bool(), width), 0)
