"""One verification step of speculative sampling for a batch of rows (docs/design.md, "The verify op").

Row r verifies its ``n_r >= 0`` draft tokens ``x_0 .. x_{n_r-1}`` (absolute positions
``positions[r] + k``) against the verifier's distribution ``p``; the drafts came from ``q``:

    accept x_k  iff  u_k * q(x_k) <= p(x_k),  u_k = U(seed, level, pos_k, ACCEPT)   (stop at a no)
    rejected at j:   correction ~ normalize(max(0, p_j - q_j))   [p_j itself if that mass < eps]
    all accepted:    bonus      ~ p at the extra position

Layout: padded and right-aligned, so that every shape is static (a compiled step needs that) and a
level's forward output is used as it is. With D draft columns, row r's drafts occupy the last n_r of
them (columns D - n_r .. D - 1); the verifier has D + 1 columns: column c holds the distribution of
the token at draft column c, and column D the bonus distribution. Columns left of a row's drafts
are padding, ignored (any values). Logits are *processed* logits; ``temperature`` divides both sides
(1 when the logits are already processed), and ``draft_lse`` is the log-sum-exp of
``draft_logits / temperature``.

Point masses: ``draft_logits = draft_lse = None`` says every draft's q is a point mass on its token
(a deterministic draft, such as a lookup proposal): q(x_k) = 1, so x_k passes iff u_k <= p(x_k),
and a rejection's correction is drawn from p with x_k removed, renormalised (max(0, p - q)). The
same results as the point masses written out as logits (0 at x_k, -inf elsewhere, log-sum-exp 0),
without a ``[B, D, V]`` q.

Outputs: accepted count and the correction-or-bonus token per row, and the verifier's fp32
log-sum-exp at every column (meaningful where the row has a draft or the bonus), which is what the
next level up needs to use ``p`` as its ``q``. ``verify_torch`` here is the reference (the CPU path,
and what a compiled step traces) and imports no Triton; ``verify_triton`` (``rejection.py``) runs the
fused kernels and matches it token for token except where two candidates tie within float rounding;
``ops.verify`` picks the kernels for CUDA tensors. Both check their arguments first with ``checks.py``
(the same ``ValueError`` from either; out-of-range values flagged in ``error_flag`` where they are not
read on the host).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .checks import check_verify_args
from .keyed_random_torch import ACCEPT, BONUS, RESIDUAL, race_torch, uniform_torch

RESIDUAL_EPS = 1e-6
"""Below this residual mass p and q are equal up to rounding; the correction is drawn from p."""


class VerifyResult(NamedTuple):
    num_accepted: torch.Tensor  # [B] int64
    next_token: torch.Tensor  # [B] int64: correction (if num_accepted < n_r) else bonus
    verifier_lse: torch.Tensor  # [B, D + 1] fp32 log-sum-exp of verifier_logits / temperature


def verify_torch(
    verifier_logits: torch.Tensor,  # [B, D + 1, V]
    draft_logits: torch.Tensor | None,  # [B, D, V] logits of q at each draft column; None: point masses
    draft_lse: torch.Tensor | None,  # [B, D] fp32; None with draft_logits
    draft_tokens: torch.Tensor,  # [B, D] int64
    num_drafts: torch.Tensor,  # [B] int64 in [0, D]: row r's drafts are its last num_drafts[r] columns
    temperature: torch.Tensor,  # [B] fp32
    seeds: torch.Tensor,  # [B] int64
    positions: torch.Tensor,  # [B] int64 absolute position of each row's first draft
    level: int,
    greedy: bool,
    *,
    error_flag: torch.Tensor | None = None,  # [1] int32: value errors OR'd in where not raised (checks.py)
) -> VerifyResult:
    check_verify_args(
        verifier_logits, draft_logits, draft_lse, draft_tokens, num_drafts, temperature, seeds, positions,
        level, greedy, error_flag,
    )  # fmt: skip
    (num_rows, width), vocab = draft_tokens.shape, verifier_logits.shape[-1]  # B, D, V
    rows = torch.arange(num_rows, device=draft_tokens.device)  # [B]
    first_column = width - num_drafts  # [B]
    k = torch.arange(width, device=draft_tokens.device) - first_column[:, None]  # [B, D] draft index
    is_draft = k >= 0  # [B, D]

    logp_all = verifier_logits.float() / temperature[:, None, None]  # [B, D + 1, V]
    verifier_lse = torch.logsumexp(logp_all, dim=-1)  # [B, D + 1]

    # Accept test per draft, then the first rejection of each row.
    if greedy:
        accepted = draft_tokens == torch.argmax(verifier_logits[:, :width], dim=-1)  # [B, D]
    else:
        x = draft_tokens.clamp(0, vocab - 1)[..., None]  # [B, D, 1] (padding may hold anything)
        logp = logp_all[:, :width].gather(-1, x)[..., 0] - verifier_lse[:, :width]  # [B, D]
        if draft_logits is None:  # point masses: q(x) = 1
            logq = torch.zeros_like(logp)
        else:
            logq = draft_logits.gather(-1, x)[..., 0].float() / temperature[:, None] - draft_lse  # [B, D]
        u = uniform_torch(seeds[:, None].expand(-1, width), level, positions[:, None] + k, ACCEPT)
        accepted = torch.log(u) <= logp - logq  # [B, D]
    first_reject = torch.where(is_draft & ~accepted, k, num_drafts[:, None])  # [B, D]
    num_accepted = first_reject.amin(-1) if width > 0 else num_drafts.clone()  # [B]

    # Correction or bonus: one draw per row, at verifier column first_column + num_accepted.
    rejected = num_accepted < num_drafts  # [B]
    selected = first_column + num_accepted  # [B] in [D - n_r, D]
    if greedy:
        next_token = torch.argmax(verifier_logits[rows, selected], dim=-1)  # [B]
        return VerifyResult(num_accepted, next_token, verifier_lse)
    logp_sel = logp_all[rows, selected] - verifier_lse[rows, selected, None]  # [B, V]
    log_weights = logp_sel
    if width > 0:  # a shape test, no host sync
        at = selected.clamp(max=width - 1)  # [B] the rejected draft's column (unused when none was)
        if draft_logits is None:  # a point mass on the rejected x: max(0, p - q) is p without x
            x_sel = draft_tokens[rows, at].clamp(0, vocab - 1)  # [B]
            residual = logp_sel.exp().scatter(-1, x_sel[:, None], 0.0)  # [B, V]
        else:
            logq_sel = draft_logits[rows, at].float() / temperature[:, None] - draft_lse[rows, at, None]
            residual = (logp_sel.exp() - logq_sel.exp()).clamp_min(0.0)  # [B, V]
        use_residual = rejected & (residual.sum(-1) >= RESIDUAL_EPS)  # [B]
        log_weights = torch.where(use_residual[:, None], residual.log(), logp_sel)
    # One race serves correction and bonus; the purpose in the key keeps their uniforms apart.
    purpose = torch.where(rejected, RESIDUAL, BONUS)  # [B]
    next_token = race_torch(log_weights, seeds, level, positions + num_accepted, purpose)
    return VerifyResult(num_accepted, next_token, verifier_lse)
