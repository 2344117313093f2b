"""Levels 0 that propose from the host rather than run a step of the engine: the lookup level and a
draft with another tokenizer (docs/design.md, "Levels that propose from the host").

Terms:
    proposal level  the spec a user puts first in ``drafts`` (``LookupDraft``, ``OtherTokenizerDraft``);
                    per run it makes a proposer
    proposer        one run's state: ``propose`` hands the level above up to ``wanted`` tokens per row
                    (in the target's vocabulary), ``invalidate`` says which positions a verification
                    replaced

Why any proposal level is exact: a proposal's q is a point mass on the proposed token, and the level
above verifies it in the point-mass mode (accept x with probability p(x), else draw from p without
x): its p exactly, however the proposal was chosen, as long as the choice does not read the
verifier's randomness (docs/design.md, "The lookup level"). A level that draws its proposals from a
distribution over the target's vocabulary may hand that q up instead (``draws_q``: a draft with
another tokenizer sampling from the vocabulary it shares with the target); the level above then
verifies them as a model draft's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, Protocol

import numpy as np

if TYPE_CHECKING:
    import torch

    from hsd_fast.processors import LogitsTransform
    from hsd_fast.sampling_metadata import SamplingMetadata


class Proposals(NamedTuple):
    """One call's proposals: row i's first ``counts[i]`` tokens, cut after an EOS."""

    tokens: np.ndarray  # [R, W] int64, in the target's vocabulary
    counts: np.ndarray  # [R] int64
    last_is_eos: np.ndarray  # [R] bool
    # where the level draws_q: the q each token was drawn from ([R, W', V'], W' >= counts, V' <= the
    # target's vocabulary) and its fp32 log-sum-exp at the run's temperature ([R, W']); else None
    q_logits: torch.Tensor | None = None
    q_lse: torch.Tensor | None = None


class Proposer(Protocol):
    def propose(
        self,
        tokens: torch.Tensor,  # [B, S + 1] the run's token buffer (DecodeState.tokens)
        rows: np.ndarray,  # [R]
        ends: np.ndarray,  # [R] sequence lengths: the proposals go to ends, ends + 1, ...
        wanted: np.ndarray,  # [R] the most tokens each row may take
    ) -> Proposals:
        """Up to ``wanted[i]`` tokens for row ``rows[i]`` (``Proposals.tokens`` is [R, max(wanted)]),
        with their q where the level ``draws_q``."""
        ...

    def invalidate(self, rows: np.ndarray, first_changed: np.ndarray) -> None:
        """A verification of ``rows`` may have replaced the tokens from ``first_changed`` on ([R])."""
        ...


class ProposalLevel:
    """What the engine needs of a proposal level: one proposer per run (``compile``: whether the run
    compiles its steps, for a proposer that runs a model), and the models it runs, which the run
    holds as it holds its levels' models."""

    def proposer(
        self,
        num_rows: int,
        sampling: SamplingMetadata,
        compile: bool = False,
        transform: LogitsTransform | None = None,
    ) -> Proposer:
        """``transform``: the run's sampling transform, for a level that draws (``draws_q``)."""
        raise NotImplementedError

    @property
    def models(self) -> tuple[torch.nn.Module, ...]:
        return ()

    def draws_q(self, greedy: bool) -> bool:
        """Whether a run's proposals come with the q they were drawn from (the level above verifies
        them against it) rather than as point masses."""
        return False
