"""The model of a draft with another tokenizer, run on its own token domain: one slot cache for all
rows of a run, each forward batched over the rows that draft, compiled as the engine's level steps
are (docs/design.md, "Drafts with another tokenizer").

Terms:
    draft position  the index of an id in a row's draft ids (``other_tokenizer``); the id at draft
                    position t is cached in slot t of the draft's ``HFRunner``
    span            what a row feeds in one call: its ids from a draft position on

Greedy and point-mass runs decode the draft's most likely ids; a run that samples from the shared
vocabulary (``SharedSampling``) draws each id from the draft's q over the ids it shares with the
target, and hands that q up in the target's vocabulary.

A row's cache is never cut: a row whose ids changed from draft position f on feeds again from f,
and the slots past f are rewritten before any position reads them (a token sees the slots up to
its own position only). So a rollback costs nothing, and the bridge only lowers a row's count of
cached ids.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch

from hsd_fast.attached import attached
from hsd_fast.compile_policy import (
    COMPILE_AFTER_USES,
    COMPILED_MAX_WIDTH,
    Compiling,
    compiled_step,
    fingerprint,
)
from hsd_fast.hf_runner import HFRunner
from hsd_fast.layout import MAX_WIDTH, FedBlock, bucket, capacity_bucket, capacity_key
from hsd_fast.positions import max_positions
from hsd_fast.triton_kernels.keyed_random_torch import DRAFT
from hsd_fast.triton_kernels.ops import sample


class SharedSampling(NamedTuple):
    """What a draft samples with where it shares part of its vocabulary with the target
    (docs/design.md, "Drafts with another tokenizer"): it draws only shared ids, so that each is
    one target id and its q is a distribution over the target's vocabulary."""

    sources: torch.Tensor  # [M] int64 draft ids that spell exactly one target id each
    targets: torch.Tensor  # [M] int64 those target ids
    to_draft: torch.Tensor  # [V_target] int64 target id -> the draft id spelling it (0: never drawn)
    scale: torch.Tensor  # [] fp32: 1 / a temperature the run applies among its processors, else 1
    temperature: torch.Tensor  # [B] fp32 (sampling_metadata)
    seeds: torch.Tensor  # [B] int64: the keyed randomness of a level 0's draws


class Drafted(NamedTuple):
    """One call's decoded ids per row; where it sampled, also their target ids and q."""

    ids: dict[int, list[int]]  # row -> the draft ids decoded
    target_ids: dict[int, list[int]] | None  # row -> the same ids in the target's vocabulary
    q_logits: torch.Tensor | None  # [B, count, V_target] the q each id was drawn from (-inf: not shared)
    q_lse: torch.Tensor | None  # [B, count] fp32 log-sum-exp of q_logits / temperature


def _decode(
    runner: HFRunner,
    input_ids: torch.Tensor,  # [B, L] right-aligned
    positions: torch.Tensor,  # [B, L]
    valid: torch.Tensor,  # [B, L]
    count: int,
    choose: Callable[[torch.Tensor, int], torch.Tensor],  # (logits [B, V_draft], k) -> draft ids [B]
) -> None:
    """Feed the block, then decode ``count`` ids, each chosen from the logits after the last and
    fed back for the next (rows that sit out write the scratch slot only, and nobody reads their
    ids). A row whose draft ends its text keeps decoding: the caller cuts there."""
    logits = runner.forward(FedBlock(input_ids, positions, valid), 1)  # [B, 1, V]
    last = choose(logits[:, -1], 0)  # [B]
    position, takes_part = positions[:, -1:], valid[:, -1:]  # [B, 1] each
    for k in range(1, count):
        position = position + 1
        logits = runner.forward(FedBlock(last[:, None], position, takes_part), 1)
        last = choose(logits[:, -1], k)


def _draft_ids(
    runner: HFRunner, input_ids: torch.Tensor, positions: torch.Tensor, valid: torch.Tensor, *, count: int
) -> torch.Tensor:
    """Each row's ``count`` most likely next ids after a block ``[B, L]``: ``[B, count]``."""
    drafted = []

    def most_likely(logits: torch.Tensor, k: int) -> torch.Tensor:
        drafted.append(logits.argmax(-1))
        return drafted[-1]

    _decode(runner, input_ids, positions, valid, count, most_likely)
    return torch.stack(drafted, 1)


def _most_likely_after_each(
    runner: HFRunner, input_ids: torch.Tensor, positions: torch.Tensor, valid: torch.Tensor
) -> torch.Tensor:
    """The most likely id after each position of a block ``[B, L]``: ``[B, L]`` (a verification of
    greedy proposals by the model, ``other_tokenizer_chain``)."""
    return runner.forward(FedBlock(input_ids, positions, valid), input_ids.shape[1]).argmax(-1)


def _sampled_draft_ids(
    runner: HFRunner,
    input_ids: torch.Tensor,  # [B, L]
    positions: torch.Tensor,  # [B, L]
    valid: torch.Tensor,  # [B, L]
    first_positions: torch.Tensor,  # [B] the target position each row's first id is drawn for
    shared: SharedSampling,
    *,
    count: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each row's ``count`` ids after a block, each drawn from the draft's q over the shared ids
    (its logits there, -inf at every other target id), keyed by the target position it is drawn
    for as a model draft's are. Returns draft ids and target ids ``[B, count]``, q logits
    ``[B, count, V_target]`` and their fp32 log-sum-exp ``[B, count]``."""
    drawn = []

    def draw(logits: torch.Tensor, k: int) -> torch.Tensor:
        q = logits.new_full((logits.shape[0], shared.to_draft.shape[0]), -torch.inf)  # [B, V_target]
        q = q.index_copy(1, shared.targets, logits.index_select(1, shared.sources) * shared.scale)
        token, lse = sample(q, shared.temperature, shared.seeds, first_positions + k, 0, DRAFT, False)
        drawn.append((token, q, lse))
        return shared.to_draft[token]

    _decode(runner, input_ids, positions, valid, count, draw)
    targets, q, lse = (torch.stack(parts, 1) for parts in zip(*drawn, strict=True))
    return shared.to_draft[targets], targets, q, lse


class DraftSteps:
    """The draft model's forwards for one run: ``advance`` feeds spans and decodes after them.
    ``compile``: block widths up to ``COMPILED_MAX_WIDTH`` run in compiled graphs from their
    ``COMPILE_AFTER_USES``-th use (kept with the runner for later runs); prompts run eagerly."""

    def __init__(self, model: torch.nn.Module, vocab: int, num_rows: int, compile: bool) -> None:
        self.runner = HFRunner.of(model, vocab)
        self.num_rows, self.compile = num_rows, compile
        self.device = next(model.parameters()).device
        self.limit = max_positions(model.config)  # None: the model states no position limit
        self.capacity = 0  # draft positions the cache holds now (0: not prepared yet)
        self.uses: dict[tuple[int, int, bool], int] = {}  # (block width, draft count, sampled) -> calls
        self.compiled: dict[tuple, Callable] | None = None  # (rows, slots, width, count, sampled) -> step
        if compile:  # the runner's graphs serve later runs, unless its weights changed since
            kept = attached(self.runner, "draft steps")  # the graphs, and the weights they were built for
            if kept.get("fingerprint") != fingerprint(self.runner):
                kept.update(fingerprint=fingerprint(self.runner), graphs={})
            self.compiled = kept["graphs"]
        self.seconds = 0.0  # in the draft model's forwards

    def reserve(self, positions: int, expected: int = 0) -> bool:
        """Room for draft positions ``[0, positions)`` in every row: where there is none, a cache for
        at least ``expected`` positions (or twice the current size), which forgets every row's
        cached ids (True: each row feeds again from position 0). False: room was there already.
        ``positions`` must be within ``fits``."""
        if positions <= self.capacity:
            return False
        size = capacity_bucket(max(positions, expected, 2 * self.capacity))  # grow in few, large steps
        self.capacity = size if self.limit is None else min(size, self.limit)
        self.runner.prepare(self.num_rows, self.capacity)
        return True

    def count_for(self, steps: int) -> int:
        """The draft count of a call that needs ``steps`` ids: as many when eager, a bucket of it when
        compiled (a graph per count: few counts, each compiled once)."""
        return steps if self.compiled is None else bucket(min(steps, MAX_WIDTH))

    def fits(self, positions: int) -> bool:
        """Whether the draft model can hold ``positions`` draft positions (its position limit)."""
        return self.limit is None or positions <= self.limit

    def advance(
        self,
        spans: dict[int, tuple[int, list[int]]],
        count: int,
        shared: SharedSampling | None = None,
        first_positions: np.ndarray | None = None,  # [B] with ``shared``: see _sampled_draft_ids
    ) -> Drafted:
        """Feed each row's span (row -> (first draft position, ids), at least one id), then decode
        ``count`` ids after it, each fed back for the next but the last: the most likely ids, or
        with ``shared`` ids drawn from the shared vocabulary. Rows not named sit out (they write the
        scratch slot only)."""
        started = time.perf_counter()
        spans = dict(spans)
        while max(len(ids) for _, ids in spans.values()) > MAX_WIDTH:
            spans = self._feed_heads(spans)  # prompts: MAX_WIDTH at a time, no logits
        width = bucket(max(len(ids) for _, ids in spans.values()))
        block = self._block(spans, width)
        if shared is None:
            drafted = self._step(width, count, False)(*block).tolist()  # the one host sync
            result = Drafted({r: drafted[r] for r in spans}, None, None, None)
        else:
            firsts = torch.from_numpy(first_positions).to(self.device)
            ids, targets, q_logits, q_lse = self._step(width, count, True)(*block, firsts, shared)
            ids, targets = ids.tolist(), targets.tolist()  # the one host sync
            result = Drafted({r: ids[r] for r in spans}, {r: targets[r] for r in spans}, q_logits, q_lse)
        self.seconds += time.perf_counter() - started
        return result

    def verify(self, spans: dict[int, tuple[int, list[int]]], last: int) -> dict[int, list[int]]:
        """Feed each row's span (as ``advance``) and return the model's most likely id after each of
        the block's last ``last`` columns (spans are right-aligned: for a span shorter than that, the
        first entries belong to no id of it, so callers read the tail): the verification of greedy
        proposals (``other_tokenizer_chain``)."""
        started = time.perf_counter()
        spans = dict(spans)
        while max(len(ids) for _, ids in spans.values()) > MAX_WIDTH:
            spans = self._feed_heads(spans, keep=last)
        width = bucket(max(len(ids) for _, ids in spans.values()))
        best = self._step(width, 0, False)(*self._block(spans, width)).tolist()  # the one host sync
        self.seconds += time.perf_counter() - started
        return {r: best[r][width - last :] for r in spans}

    def _feed_heads(
        self, spans: dict[int, tuple[int, list[int]]], keep: int = 0
    ) -> dict[int, tuple[int, list[int]]]:
        """Cache the first ``MAX_WIDTH`` ids of every span longer than that (eagerly, no LM head),
        leaving at least ``keep`` ids of each; returns the spans left."""
        heads = {
            r: (start, ids[: min(MAX_WIDTH, len(ids) - keep)])
            for r, (start, ids) in spans.items()
            if len(ids) > MAX_WIDTH
        }
        input_ids, positions, valid = self._block(heads, MAX_WIDTH)
        self.runner.forward(FedBlock(input_ids, positions, valid), 0)
        rest = {r: (start + len(head), spans[r][1][len(head) :]) for r, (start, head) in heads.items()}
        return spans | rest

    def _block(
        self, spans: dict[int, tuple[int, list[int]]], width: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The right-aligned block ``[B, width]`` of ``spans``: ids, positions, validity."""
        input_ids = np.zeros((self.num_rows, width), dtype=np.int64)  # [B, L]
        positions = np.zeros((self.num_rows, width), dtype=np.int64)  # [B, L]
        valid = np.zeros((self.num_rows, width), dtype=bool)  # [B, L]
        for r, (start, ids) in spans.items():
            n = len(ids)
            input_ids[r, width - n :] = ids
            positions[r, width - n :] = np.arange(start, start + n)
            valid[r, width - n :] = True
        return tuple(torch.from_numpy(a).to(self.device) for a in (input_ids, positions, valid))

    def _step(self, width: int, count: int, sampled: bool) -> Callable:
        """The step of this block width and draft count (count 0: ``_most_likely_after_each``;
        ``sampled``: ``_sampled_draft_ids``): compiled where the run compiles, the block is narrow
        and the shape has been used ``COMPILE_AFTER_USES`` times; else eager."""
        shape = (width, count, sampled)
        self.uses[shape] = self.uses.get(shape, 0) + 1
        if count == 0:
            eager = functools.partial(_most_likely_after_each, self.runner)
        else:
            eager = functools.partial(_sampled_draft_ids if sampled else _draft_ids, self.runner, count=count)
        if self.compiled is None or width > COMPILED_MAX_WIDTH:
            return eager
        key = (self.num_rows, capacity_key(self.capacity, self.device), *shape)
        if key not in self.compiled:
            if self.uses[shape] < COMPILE_AFTER_USES:
                return eager
            name = f"other-tokenizer draft {width}x{count or 'verify'}{' sampled' if sampled else ''}"
            self.compiled[key] = Compiling(
                compiled_step(eager, self.device), name, self.device, self.runner.model
            )
        return self.compiled[key]
