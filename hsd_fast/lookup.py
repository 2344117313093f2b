"""The lookup level: a model-free level 0 that proposes continuations found in a row's own context
(prompt lookup), verified by the smallest model above it (docs/design.md, "The lookup level").

Terms:
    proposal    the tokens that followed the most recent earlier occurrence of the row's longest
                matching suffix (n-gram, n from ``max_ngram`` down to ``min_ngram``), read on into the
                proposal itself where the row ends first (a loop continues); 0..T_0 tokens
    valid       per row, how many leading tokens of the index still equal the row's tokens: a
                verification replaces the token at its cut and drops everything after it

Why it is exact: a proposal is a deterministic function of tokens already drawn, so as a draft its
distribution q is a point mass on the proposed token. Verification against a point mass accepts x
with probability min(1, p(x) / 1) = p(x) and on a rejection draws from max(p - q, 0), which is p
with x removed, renormalised: the verifier's p exactly, as for any draft. How many tokens a call
proposes (0 when nothing matches) is decided from the same drawn tokens, so it cannot bias what is
accepted either; with nothing proposed, level 1's verification is an ordinary decoding step.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from hsd_fast._C import LookupLevel
from hsd_fast.proposal_level import ProposalLevel, Proposals

if TYPE_CHECKING:
    from hsd_fast.sampling_metadata import SamplingMetadata

MAX_NGRAM = 64
"""The longest suffix a lookup level matches (``_C.MAX_NGRAM``, checked in C++ too): the index keeps
one entry per n-gram size for every token, and hashes n tokens per size at every append, so its work
per token grows as ``max_ngram ** 2``, while useful suffixes are a few tokens long (the default: 3)."""


@dataclass(frozen=True)
class LookupDraft(ProposalLevel):
    """A lookup level, in the place of the smallest draft (``drafts=[LookupDraft(), d0, ...]``, or
    the string ``"lookup"`` for the defaults). ``max_ngram`` / ``min_ngram``: the longest and the
    shortest suffix matched, ``1 <= min_ngram <= max_ngram <= MAX_NGRAM``; the longest that occurred
    before wins."""

    max_ngram: int = 3
    min_ngram: int = 1

    def __post_init__(self) -> None:
        for name in ("max_ngram", "min_ngram"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"LookupDraft: {name} must be an int, got {value!r}")
        if not 1 <= self.min_ngram <= self.max_ngram <= MAX_NGRAM:
            raise ValueError(
                f"LookupDraft: need 1 <= min_ngram <= max_ngram <= {MAX_NGRAM} (MAX_NGRAM), got "
                f"min_ngram={self.min_ngram}, max_ngram={self.max_ngram}"
            )

    def proposer(
        self, num_rows: int, sampling: SamplingMetadata, compile: bool = False, transform: object = None
    ) -> LookupProposer:
        return LookupProposer(self, num_rows, sampling.eos_ids.tolist())


PROPOSAL_RULE = "overlapping"
"""Names the proposal rule in profile keys (``profile/cache.py``): rates and costs measured under the
first rule (a proposal cut where the sequence ended, before 2026-12-05) are not this one's."""

LOOKUP = "lookup"
"""The name of the lookup level (with default settings) wherever levels are listed."""


def level_identity(level: object) -> object:
    """What names a level across a request's lists: the lookup level by kind (``"lookup"`` or any
    ``LookupDraft``), a model by the object."""
    return LOOKUP if as_lookup(level) is not None else id(level)


def as_lookup(level: object) -> LookupDraft | None:
    """The lookup level ``level`` stands for (``LOOKUP`` or a ``LookupDraft``), or None."""
    if isinstance(level, LookupDraft):
        return level
    return LookupDraft() if isinstance(level, str) and level == LOOKUP else None


class LookupProposer:
    """The lookup level of one run: an incremental n-gram index per row (``_C.LookupLevel``, in
    C++: a round's bookkeeping for all its rows is one call), kept in step with the rows' tokens
    (``invalidate`` after every verification, ``propose`` reads only what changed)."""

    def __init__(self, spec: LookupDraft, num_rows: int, eos_ids: Iterable[int]) -> None:
        self.level = LookupLevel(num_rows, spec.max_ngram, spec.min_ngram, [int(e) for e in eos_ids])

    def invalidate(self, rows: np.ndarray, first_changed: np.ndarray) -> None:  # see proposal_level.Proposer
        self.level.invalidate(rows, first_changed)

    def propose(
        self, tokens: torch.Tensor, rows: np.ndarray, ends: np.ndarray, wanted: np.ndarray
    ) -> Proposals:
        """``proposal_level.Proposer.propose`` (shapes there): the index reads only the window of
        each row past its last cut."""
        low, high = self.level.window_start(rows), int(ends.max())
        if tokens.device.type == "cpu":  # the buffer's own memory: a numpy slice costs a third of a tensor op
            window = tokens.numpy()[rows, low:high]  # [R, high - low]
        else:  # the lookup runs on the host: one device-to-host copy of what changed
            window = tokens[torch.from_numpy(rows).to(tokens.device), low:high].cpu().numpy()
        return Proposals(*self.level.propose(rows, window, ends, wanted))
