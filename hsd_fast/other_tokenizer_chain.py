"""A hierarchy inside a draft with another tokenizer: models that share the draft's tokenizer draft
for it in its own token domain, greedily, so that the draft's ids come faster and stay the same
(docs/design.md, "Drafts with another tokenizer").

With ``drafts=[d0, d1]`` and ``draft_tokenizers=[None, tok_d]`` under a target in another tokenizer,
``d1`` is the level that crosses the boundary (an ``OtherTokenizerDraft``) and ``d0`` drafts for it
in ``tok_d``'s ids. Each round the bridge asks the top model for ``count`` ids after every row's
context (``other_tokenizer``); a ``ChainSteps`` produces exactly the ids the top model's own greedy
decoding would (``DraftSteps.advance``), by speculative decoding:

    until every row has count ids:
        lower: block_size ids after each row's ids          (a DraftSteps, or a ChainSteps below)
        top:   one forward over the row's unfed ids and them -> its most likely id after each
        keep the drafted ids that equal the top's choice, then the top's own id after the last kept

Exact whatever the lower levels propose: a kept id is the top model's most likely id at its
position, and the top's correction (or bonus id) is too. So the proposals the bridge hands up are the
same as with the top model alone, and the level above verifies them as point masses; the lower
levels only change how fast they come. A sampled run never draws inside the chain.

Terms:
    known    a row's draft ids as this chain knows them: its context, then the ids it decoded
    fed      per model, how many of a row's known ids are in its cache; a slot cache is never cut
             (``other_tokenizer_steps``): ids past ``fed`` are fed again, rewriting their slots
    overshoot the most ids a call may decode beyond ``count`` (a round of the chain keeps up to
             block_size + 1 ids): the caches hold that many more positions
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from hsd_fast.bridge import common_prefix
from hsd_fast.other_tokenizer_steps import Drafted, DraftSteps, SharedSampling


def chain_steps(
    models: Sequence[torch.nn.Module], block_sizes: Sequence[int], vocab: int, num_rows: int, compile: bool
) -> DraftSteps | ChainSteps:
    """The steps of ``models[-1]`` (a draft's own model) with ``models[:-1]`` under it, smallest first,
    each drafting ``block_sizes[i]`` ids per verification by the next; one model: its ``DraftSteps``."""
    steps = DraftSteps(models[0], vocab, num_rows, compile)
    for model, block_size in zip(models[1:], block_sizes, strict=True):
        steps = ChainSteps(DraftSteps(model, vocab, num_rows, compile), steps, block_size)
    return steps


class ChainSteps:
    """The steps of a top model with the levels below it (``lower``, which draft ``block_size`` ids
    per verification): ``DraftSteps``' interface, greedy only."""

    def __init__(self, top: DraftSteps, lower: DraftSteps | ChainSteps, block_size: int) -> None:
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
        """Positions every level can take before one needs a larger cache (the overshoot held back)."""
        return min(self.top.capacity, self.lower.capacity) - self.overshoot

    @property
    def overshoot(self) -> int:
        below = self.lower.overshoot if isinstance(self.lower, ChainSteps) else 0
        return self.block_size + 1 + below

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
        proposed = self.lower.advance(below, k).ids  # row -> k ids
        spans = {r: (int(self.top_fed[r]), self.known[r][self.top_fed[r] :] + proposed[r]) for r in rows}
        choices = self.top.verify(spans, k + 1)  # row -> the top's id after the context, then each
        kept = {}
        for r in rows:
            drafted, best = proposed[r], choices[r]
            a = 0
            while a < k and drafted[a] == best[a]:
                a += 1
            base = len(self.known[r])
            kept[r] = [*drafted[:a], best[a]]
            self.known[r] += kept[r]
            self.top_fed[r] = len(self.known[r]) - 1  # all but the top's own last id are cached
            self.lower_fed[r] = base + min(a, k - 1)  # the lower fed its ids but the last
            self.drafted, self.accepted = self.drafted + k, self.accepted + a
        return kept
