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
verifier's randomness (docs/design.md, "The lookup level").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import numpy as np
    import torch

    from hsd_fast.sampling_metadata import SamplingMetadata


class Proposer(Protocol):
    def propose(
        self,
        tokens: torch.Tensor,  # [B, S + 1] the run's token buffer (DecodeState.tokens)
        rows: np.ndarray,  # [R]
        ends: np.ndarray,  # [R] sequence lengths: the proposals go to ends, ends + 1, ...
        wanted: np.ndarray,  # [R] the most tokens each row may take
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The proposals ([R, max(wanted)], row i's first ``counts[i]`` tokens proposed, cut after an
        EOS), ``counts`` ([R]) and whether the last one is an EOS ([R] bool)."""
        ...

    def invalidate(self, rows: np.ndarray, first_changed: np.ndarray) -> None:
        """A verification of ``rows`` may have replaced the tokens from ``first_changed`` on ([R])."""
        ...


class ProposalLevel:
    """What the engine needs of a proposal level: one proposer per run (``compile``: whether the run
    compiles its steps, for a proposer that runs a model), and the models it runs, which the run
    holds as it holds its levels' models."""

    def proposer(self, num_rows: int, sampling: SamplingMetadata, compile: bool = False) -> Proposer:
        raise NotImplementedError

    @property
    def models(self) -> tuple[torch.nn.Module, ...]:
        return ()
