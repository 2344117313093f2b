"""Known bugs planted from outside the engine, so that the distribution tests can show they catch
them (a test that cannot fail proves nothing). Each is a context manager that patches one method."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from unittest import mock

import numpy as np
import torch

from hsd_fast.engine import DecodeState


@contextlib.contextmanager
def residual_stored_as_q() -> Iterator[None]:
    """Store normalize(max(0, p - q)) as a correction's q instead of p. A correction drawn from the
    residual is still marginally a sample of p, so p must be stored: with the residual the next
    level up verifies against the wrong q. Assumes temperature 1 (p = softmax of the logits)."""
    keep_emitted = DecodeState.keep_emitted

    def buggy(self, rows, outs, ends, logits, result) -> None:
        num_accepted = result.num_accepted.cpu().numpy()
        rejected = num_accepted < ends - outs - 1  # [R]
        at = outs + 1 + num_accepted  # [R] position of the correction (or bonus)
        slot = torch.from_numpy(at % self.window)
        q = torch.softmax(self.q_logits[rows, slot].float(), -1)  # the rejected draft's q
        first_row = np.cumsum(ends - outs) - (ends - outs)  # where each row's logits begin
        p = torch.softmax(logits[torch.from_numpy(first_row + num_accepted)].float(), -1)
        keep_emitted(self, rows, outs, ends, logits, result)
        log_residual = (p - q).clamp_min(0).log()[rejected]  # [R', V]
        mask = torch.from_numpy(rejected)
        self.q_logits[rows[rejected], slot[mask]] = log_residual.to(self.q_logits.dtype)
        self.q_lse[rows[rejected], slot[mask]] = torch.logsumexp(log_residual, -1)

    with mock.patch.object(DecodeState, "keep_emitted", buggy):
        yield
