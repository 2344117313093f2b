"""A hierarchy inside a draft with another tokenizer: models that share the draft's tokenizer draft
for it in its own token domain, greedily, so that the draft's ids come faster and stay the same
(docs/design.md, "Drafts with another tokenizer").

With ``drafts=[d0, d1]`` and ``draft_tokenizers=[None, tok_d]`` under a target in another tokenizer,
``d1`` is the level that crosses the boundary (an ``OtherTokenizerDraft``) and ``d0`` drafts for it
in ``tok_d``'s ids. Each round the bridge asks the top model for ``count`` ids after every row's
context (``other_tokenizer``); a ``ChainSteps`` produces exactly the ids the top model's own greedy
decoding would (``DraftSteps.advance``), by speculative decoding:

    until every row has count ids:
        lower: block_size ids after each row's ids   (a DraftSteps, a ChainSteps, or LookupSteps: 0..)
        top:   one forward over the row's unfed ids and them -> its most likely id after each
        keep the drafted ids that equal the top's choice, then the top's own id after the last kept

Exact whatever the lower levels propose: a kept id is the top model's most likely id at its
position, and the top's correction (or bonus id) is too. So the proposals the bridge hands up are the
same as with the top model alone, and the level above verifies them as point masses; the lower
levels only change how fast they come. A sampled run never draws inside the chain.

Terms:
    known    a row's draft ids as this chain knows them: its context, then the ids it decoded
    fed      per level, how many of a row's known ids it holds (a model: in its cache; the lookup
             level: in its token buffer); a slot cache is never cut (``other_tokenizer_steps``):
             ids past ``fed`` are fed again, rewriting their slots
    overshoot the most ids a call may decode beyond ``count`` (a round of the chain keeps up to
             block_size + 1 ids): the caches hold that many more positions
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import torch

from hsd_fast.bridge import common_prefix
from hsd_fast.lookup import LookupDraft, LookupProposer
from hsd_fast.other_tokenizer_steps import Drafted, DraftSteps, SharedSampling


def chain_steps(
    levels: Sequence[torch.nn.Module | LookupDraft],
    block_sizes: Sequence[int],
    vocab: int,
    num_rows: int,
    compile: bool,
    eos_ids: Sequence[int] = (),
) -> DraftSteps | ChainSteps:
    """The steps of ``levels[-1]`` (a draft's own model) with ``levels[:-1]`` under it, smallest first
    (the first may be the lookup level, which stops after ``eos_ids``), each drafting
    ``block_sizes[i]`` ids per verification by the next; one model: its ``DraftSteps``."""
    first = levels[0]
    if isinstance(first, LookupDraft):
        steps = LookupSteps(first, num_rows, eos_ids)
    else:
        steps = DraftSteps(first, vocab, num_rows, compile)
    for model, block_size in zip(levels[1:], block_sizes, strict=True):
        steps = ChainSteps(DraftSteps(model, vocab, num_rows, compile), steps, block_size)
    return steps


class ChainSteps:
    """The steps of a top model with the levels below it (``lower``, which draft ``block_size`` ids
    per verification): ``DraftSteps``' interface, greedy only."""

    def __init__(
        self, top: DraftSteps, lower: DraftSteps | ChainSteps | LookupSteps, block_size: int
    ) -> None:
        self.top, self.lower, self.block_size = top, lower, block_size
        self.device = top.device
        self.known: list[list[int]] = [[] for _ in range(top.num_rows)]
        self.top_fed = np.zeros(top.num_rows, dtype=np.int64)  # [B]
        self.lower_fed = np.zeros(top.num_rows, dtype=np.int64)  # [B]
        self.drafted = self.accepted = 0  # the lower levels' proposals and how many the top kept

    @property
    def seconds(self) -> float:
        return self.top.seconds + self.lower.seconds

    @property
    def capacity(self) -> int:
        """Positions every level can take before one needs a larger cache (the overshoot held back;
        a chain below holds back its own)."""
        return min(self.top.capacity, self.lower.capacity) - self.overshoot

    @property
    def overshoot(self) -> int:
        return self.block_size + 1

    def fits(self, positions: int) -> bool:
        return self.top.fits(positions + self.overshoot) and self.lower.fits(positions + self.overshoot)

    def count_for(self, steps: int) -> int:
        return self.top.count_for(steps)

    def reserve(self, positions: int, expected: int = 0) -> bool:
        """As ``DraftSteps.reserve``, for every level: where any cache is made anew, every level
        forgets its rows' cached ids (True)."""
        grown = self.top.reserve(positions + self.overshoot, expected + self.overshoot)
        grown = self.lower.reserve(positions + self.overshoot, expected + self.overshoot) or grown
        if grown:
            self.forget()
        return grown

    def forget(self) -> None:
        """No level holds any row's ids (new caches)."""
        self.top_fed[:] = self.lower_fed[:] = 0
        if isinstance(self.lower, ChainSteps):
            self.lower.forget()

    def advance(
        self,
        spans: dict[int, tuple[int, list[int]]],
        count: int,
        shared: SharedSampling | None = None,
        first_positions: np.ndarray | None = None,
    ) -> Drafted:
        """``DraftSteps.advance`` of the top model, greedy: the same ids, decoded speculatively."""
        if shared is not None:
            raise ValueError("a draft with models under it proposes greedily: it cannot draw from q")
        for r, (start, ids) in spans.items():
            known = self.known[r]
            same = start + common_prefix(known[start:], ids)
            self.lower_fed[r] = min(self.lower_fed[r], same)  # what changed is fed again
            self.top_fed[r] = start
            known[start:] = ids
        decoded = {r: [] for r in spans}
        while active := [r for r in spans if len(decoded[r]) < count]:
            for r, ids in self._round(active).items():
                decoded[r] += ids
        return Drafted({r: ids[:count] for r, ids in decoded.items()}, None, None, None)

    def _round(self, rows: list[int]) -> dict[int, list[int]]:
        """One speculative round for ``rows``: the ids each keeps (the top's choices)."""
        k = self.block_size
        below = {}
        for r in rows:
            fed = min(int(self.lower_fed[r]), len(self.known[r]) - 1)  # at least one id to feed
            below[r] = (fed, self.known[r][fed:])
        proposed = self.lower.advance(below, k).ids  # row -> k ids (the lookup level: 0..k)
        spans = {r: (int(self.top_fed[r]), self.known[r][self.top_fed[r] :] + proposed[r]) for r in rows}
        last = max(len(ids) for ids in proposed.values()) + 1
        choices = self.top.verify(spans, last)  # row -> the top's id after each of its last `last` ids
        kept = {}
        for r in rows:
            drafted = proposed[r]
            n = len(drafted)
            best = choices[r][last - n - 1 :]  # after the context's last id, then after each drafted one
            a = 0
            while a < n and drafted[a] == best[a]:
                a += 1
            base = len(self.known[r])
            kept[r] = [*drafted[:a], best[a]]
            self.known[r] += kept[r]
            self.top_fed[r] = len(self.known[r]) - 1  # all but the top's own last id are cached
            self.lower_fed[r] = base + min(a, n - 1)  # the lower took its ids in but the last
            self.drafted, self.accepted = self.drafted + n, self.accepted + a
        return kept


class LookupSteps:
    """The lookup level at the bottom of a chain (``DraftSteps``' interface): proposals found in each
    row's own ids (``lookup.LookupProposer``, its n-gram index kept in step with a token buffer of
    the draft's ids), 0 to ``count`` per row. Its proposals are written to the buffer as a model
    feeds its drafted ids, so a row's ids up to the chain's ``lower_fed`` are always there."""

    def __init__(self, spec: LookupDraft, num_rows: int, eos_ids: Sequence[int]) -> None:
        self.proposer = LookupProposer(spec, num_rows, eos_ids)
        self.tokens = torch.zeros((num_rows, 0), dtype=torch.int64)  # [B, S] the rows' draft ids
        self.seconds = 0.0  # host time (the chain's models count theirs)
        self.capacity = 1 << 62  # no cache: nothing to reserve

    def fits(self, positions: int) -> bool:
        return True

    def reserve(self, positions: int, expected: int = 0) -> bool:
        return False

    def advance(self, spans: dict[int, tuple[int, list[int]]], count: int) -> Drafted:
        """Up to ``count`` ids after each row's span, from its own earlier ids."""
        started = time.perf_counter()
        rows = np.array(sorted(spans), dtype=np.int64)  # [R]
        starts = np.array([spans[r][0] for r in rows], dtype=np.int64)  # [R]
        ends = np.array([start + len(spans[r][1]) for r, start in zip(rows, starts, strict=True)])  # [R]
        self._hold(int(ends.max()) + count + 1)
        for r, start, end in zip(rows.tolist(), starts.tolist(), ends.tolist(), strict=True):
            self.tokens[r, start:end] = torch.tensor(spans[r][1])
        self.proposer.invalidate(rows, starts)
        proposals = self.proposer.propose(self.tokens, rows, ends, np.full(len(rows), count))
        ids = {}
        for i, (r, end) in enumerate(zip(rows.tolist(), ends.tolist(), strict=True)):
            ids[r] = proposals.tokens[i, : proposals.counts[i]].tolist()
            self.tokens[r, end : end + len(ids[r])] = torch.tensor(ids[r], dtype=torch.int64)
        self.seconds += time.perf_counter() - started
        return Drafted(ids, None, None, None)

    def _hold(self, positions: int) -> None:
        """A buffer of at least ``positions`` columns (doubled when it grows: few copies)."""
        if positions > self.tokens.shape[1]:
            grown = torch.zeros(
                (self.tokens.shape[0], max(positions, 2 * self.tokens.shape[1])), dtype=torch.int64
            )
            grown[:, : self.tokens.shape[1]] = self.tokens
            self.tokens = grown
