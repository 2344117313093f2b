"""One verification step of speculative sampling for a ragged batch (docs/design.md, "verify").

Row r verifies its ``n_r >= 0`` draft tokens ``x_0 .. x_{n_r-1}`` (absolute positions
``positions[r] + k``) against the verifier's distribution ``p``; the drafts came from ``q``:

    accept x_k  iff  u_k * q(x_k) <= p(x_k),  u_k = U(seed, level, pos_k, ACCEPT)   (stop at a no)
    rejected at j:   correction ~ normalize(max(0, p_j - q_j))   [p_j itself if that mass < eps]
    all accepted:    bonus      ~ p at the extra position

Ragged layout: drafts of row r occupy ``[draft_offsets[r], draft_offsets[r+1])`` of the draft
tensors; its verifier rows occupy ``[draft_offsets[r] + r, draft_offsets[r+1] + r]`` (one more:
the bonus position). Logits are *processed* logits; ``temperature`` divides both sides (1 when the logits are
already processed), and ``draft_lse`` is the log-sum-exp of ``draft_logits / temperature``.

Outputs: accepted count and the correction-or-bonus token per row, and the verifier's fp32
log-sum-exp at every verifier row, which is what the next level up needs to use ``p`` as its ``q``.
``verify_torch`` here is the reference (and the CPU path) and imports no Triton; ``verify_triton``
(``rejection.py``) runs the fused kernels and matches it token for token except where two candidates
tie within float rounding; ``ops.verify`` picks the kernels for CUDA tensors.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .keyed_random_torch import ACCEPT, BONUS, RESIDUAL, race_torch, uniform_torch

RESIDUAL_EPS = 1e-6
"""Below this residual mass p and q are equal up to rounding; the correction is drawn from p."""


class VerifyResult(NamedTuple):
    num_accepted: torch.Tensor  # [B] int64
    next_token: torch.Tensor  # [B] int64: correction (if num_accepted < n_r) else bonus
    verifier_lse: torch.Tensor  # [B + D] fp32 log-sum-exp of verifier_logits / temperature


def verify_torch(
    verifier_logits: torch.Tensor,  # [B + D, V]
    draft_logits: torch.Tensor,  # [D, V] logits of q at each draft position
    draft_lse: torch.Tensor,  # [D] fp32
    draft_tokens: torch.Tensor,  # [D] int64
    draft_offsets: torch.Tensor,  # [B + 1] int64, draft_offsets[0] == 0
    temperature: torch.Tensor,  # [B] fp32
    seeds: torch.Tensor,  # [B] int64
    positions: torch.Tensor,  # [B] int64 absolute position of each row's first draft
    level: int,
    greedy: bool,
) -> VerifyResult:
    device = verifier_logits.device
    num_rows = draft_offsets.numel() - 1
    counts = draft_offsets[1:] - draft_offsets[:-1]  # [B]
    row_ids = torch.arange(num_rows, device=device)  # [B]
    draft_row = torch.repeat_interleave(row_ids, counts)  # [D]
    draft_k = torch.arange(draft_row.numel(), device=device) - draft_offsets[draft_row]  # [D]
    draft_vrow = torch.arange(draft_row.numel(), device=device) + draft_row  # [D]
    verifier_row = torch.repeat_interleave(row_ids, counts + 1)  # [B + D]

    logp_all = verifier_logits.float() / temperature[verifier_row, None]  # [B + D, V]
    verifier_lse = torch.logsumexp(logp_all, dim=-1)  # [B + D]

    # Accept test per draft, then the first rejection of each row.
    if greedy:
        accepted = draft_tokens == torch.argmax(verifier_logits[draft_vrow], dim=-1)  # [D]
    else:
        x = draft_tokens[:, None]
        logp = logp_all[draft_vrow].gather(1, x)[:, 0] - verifier_lse[draft_vrow]  # [D]
        temp_d = temperature[draft_row]
        logq = draft_logits.gather(1, x)[:, 0].float() / temp_d - draft_lse  # [D]
        u = uniform_torch(seeds[draft_row], level, positions[draft_row] + draft_k, ACCEPT)  # [D]
        accepted = torch.log(u) <= logp - logq
    first_reject = torch.where(accepted, counts[draft_row], draft_k)  # [D]
    num_accepted = counts.clone().scatter_reduce_(0, draft_row, first_reject, "amin")  # [B]

    # Correction or bonus: one draw per row at verifier row offsets[r] + r + num_accepted[r].
    rejected = num_accepted < counts  # [B]
    sel_vrow = draft_offsets[:-1] + row_ids + num_accepted  # [B]
    if greedy:
        next_token = torch.argmax(verifier_logits[sel_vrow], dim=-1)
        return VerifyResult(num_accepted, next_token, verifier_lse)
    logp_sel = logp_all[sel_vrow] - verifier_lse[sel_vrow, None]  # [B, V]
    log_weights = logp_sel
    if draft_tokens.numel() > 0:  # a shape test, no host sync
        sel_d = (draft_offsets[:-1] + num_accepted).clamp(max=draft_tokens.numel() - 1)  # [B]
        logq_sel = draft_logits[sel_d].float() / temperature[:, None] - draft_lse[sel_d, None]
        residual = (logp_sel.exp() - logq_sel.exp()).clamp_min(0.0)  # [B, V]
        use_residual = rejected & (residual.sum(-1) >= RESIDUAL_EPS)  # [B]
        log_weights = torch.where(use_residual[:, None], residual.log(), logp_sel)
    # One race serves correction and bonus; the purpose in the key keeps their uniforms apart.
    purpose = torch.where(rejected, RESIDUAL, BONUS)  # [B]
    next_token = race_torch(log_weights, seeds, level, positions + num_accepted, purpose)
    return VerifyResult(num_accepted, next_token, verifier_lse)
