"""One verification step of speculative sampling for a ragged batch (DESIGN.md §2).

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
``verify_torch`` is the reference (and the CPU path); ``verify_triton`` is the fused kernel (one
program per row, logits read in vocabulary blocks, no probability tensor materialised) and matches it
token for token except where two candidates tie within float rounding. ``verify`` picks the kernel
for CUDA tensors.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .keyed_random import ACCEPT, BONUS, RESIDUAL, key_state, race_torch, uniform_from_state, uniform_torch

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


# ----------------------------------------------------------------------------- Triton kernel
_ACCEPT: tl.constexpr = tl.constexpr(ACCEPT)
_RESIDUAL: tl.constexpr = tl.constexpr(RESIDUAL)
_BONUS: tl.constexpr = tl.constexpr(BONUS)


@triton.jit
def _verify_kernel(
    ver_ptr, ver_stride, draft_ptr, draft_stride, draft_lse_ptr, draft_tok_ptr, offsets_ptr,
    temp_ptr, seeds_ptr, positions_ptr, num_acc_ptr, next_tok_ptr, lse_ptr,
    V, level, eps,
    GREEDY: tl.constexpr, BLOCK_V: tl.constexpr,
):  # fmt: skip
    """One program verifies one row: its n drafts, then draws the correction or the bonus."""
    row = tl.program_id(0)
    d0 = tl.load(offsets_ptr + row).to(tl.int32)
    n = tl.load(offsets_ptr + row + 1).to(tl.int32) - d0
    temp = tl.load(temp_ptr + row)
    seed = tl.load(seeds_ptr + row)
    pos0 = tl.load(positions_ptr + row)
    cols = tl.arange(0, BLOCK_V)

    # Pass 1, per verifier position k: the log-sum-exp (an output for every position, so the next
    # level up can use p as its q) and, while no draft was rejected, the accept test of draft k.
    num_acc = n
    lse_sel = 0.0
    arg_sel = 0
    for k in range(0, n + 1):
        vrow = ver_ptr + (d0 + row + k).to(tl.int64) * ver_stride
        run_max = -float("inf")
        run_sum = 0.0
        best_val = -float("inf")
        best_idx = 0
        for start in range(0, V, BLOCK_V):
            idx = start + cols
            x = tl.load(vrow + idx, mask=idx < V, other=-float("inf")).to(tl.float32) / temp
            new_max = tl.maximum(run_max, tl.max(x, axis=0))
            run_sum = run_sum * tl.exp(run_max - new_max) + tl.sum(tl.exp(x - new_max), axis=0)
            run_max = new_max
            if GREEDY:  # first maximal index, as torch.argmax
                block_best = tl.max(x, axis=0)
                block_idx = tl.min(tl.where(x == block_best, idx, V), axis=0)
                take = block_best > best_val
                best_idx = tl.where(take, block_idx, best_idx)
                best_val = tl.where(take, block_best, best_val)
        lse = run_max + tl.log(run_sum)
        tl.store(lse_ptr + d0 + row + k, lse)
        if k < n and num_acc == n:
            tok = tl.load(draft_tok_ptr + d0 + k)
            if GREEDY:
                accepted = tok == best_idx
            else:
                logp = tl.load(vrow + tok).to(tl.float32) / temp - lse
                drow = draft_ptr + (d0 + k).to(tl.int64) * draft_stride
                logq = tl.load(drow + tok).to(tl.float32) / temp - tl.load(draft_lse_ptr + d0 + k)
                state = key_state(seed, level, pos0 + k, _ACCEPT)
                u = uniform_from_state(state, tl.full((), 0, tl.int32))
                accepted = tl.log(u) <= logp - logq
            if not accepted:
                num_acc = k
        if k == num_acc:  # the position that draws the correction (k < n) or the bonus (k == n)
            lse_sel = lse
            arg_sel = best_idx
    tl.store(num_acc_ptr + row, num_acc)

    if GREEDY:
        tl.store(next_tok_ptr + row, arg_sel.to(tl.int64))
    else:
        # Pass 2: exponential races over p and over the residual max(0, p - q), sharing uniforms.
        rejected = num_acc < n
        purpose = tl.where(rejected, _RESIDUAL, _BONUS)
        state = key_state(seed, level, pos0 + num_acc, purpose)
        vrow = ver_ptr + (d0 + row + num_acc).to(tl.int64) * ver_stride
        drow = draft_ptr + (d0 + tl.minimum(num_acc, n - 1)).to(tl.int64) * draft_stride
        q_lse = tl.load(draft_lse_ptr + d0 + tl.minimum(num_acc, n - 1), mask=rejected, other=0.0)
        best_p = -float("inf")
        idx_p = 0
        best_r = -float("inf")
        idx_r = 0
        mass_r = 0.0
        for start in range(0, V, BLOCK_V):
            idx = start + cols
            in_vocab = idx < V
            logp = tl.load(vrow + idx, mask=in_vocab, other=-float("inf")).to(tl.float32) / temp - lse_sel
            gumbel = -tl.log(-tl.log(uniform_from_state(state, idx)))
            key_p = tl.where(in_vocab, logp + gumbel, -float("inf"))
            m = tl.max(key_p, axis=0)
            i = tl.min(tl.where(key_p == m, idx, V), axis=0)
            idx_p = tl.where(m > best_p, i, idx_p)
            best_p = tl.maximum(best_p, m)
            if rejected:
                logq = tl.load(drow + idx, mask=in_vocab, other=-float("inf")).to(tl.float32) / temp - q_lse
                r = tl.maximum(tl.exp(logp) - tl.exp(logq), 0.0)
                mass_r += tl.sum(r, axis=0)
                key_r = tl.where(r > 0, tl.log(tl.where(r > 0, r, 1.0)) + gumbel, -float("inf"))
                m = tl.max(key_r, axis=0)
                i = tl.min(tl.where(key_r == m, idx, V), axis=0)
                idx_r = tl.where(m > best_r, i, idx_r)
                best_r = tl.maximum(best_r, m)
        use_r = rejected & (mass_r >= eps)
        tl.store(next_tok_ptr + row, tl.where(use_r, idx_r, idx_p).to(tl.int64))


def verify_triton(
    verifier_logits: torch.Tensor,
    draft_logits: torch.Tensor,
    draft_lse: torch.Tensor,
    draft_tokens: torch.Tensor,
    draft_offsets: torch.Tensor,
    temperature: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    level: int,
    greedy: bool,
    block_v: int | None = None,
) -> VerifyResult:
    """The fused kernel: same signature and results as ``verify_torch``."""
    num_rows, vocab = draft_offsets.numel() - 1, verifier_logits.shape[-1]
    device = verifier_logits.device
    verifier_logits = verifier_logits.contiguous()
    if draft_logits.shape[0] == 0:  # keep a valid pointer; no row reads it
        draft_logits = verifier_logits[:1]
    draft_logits = draft_logits.contiguous()
    num_accepted = torch.empty(num_rows, dtype=torch.int64, device=device)
    next_token = torch.empty(num_rows, dtype=torch.int64, device=device)
    verifier_lse = torch.empty(verifier_logits.shape[0], dtype=torch.float32, device=device)
    block = block_v or min(triton.next_power_of_2(vocab), 4096)
    _verify_kernel[(num_rows,)](
        verifier_logits, verifier_logits.stride(0), draft_logits, draft_logits.stride(0),
        draft_lse.float().contiguous(), draft_tokens.contiguous(), draft_offsets.to(torch.int64),
        temperature.float().contiguous(), seeds.to(torch.int64), positions.to(torch.int64),
        num_accepted, next_token, verifier_lse,
        vocab, level, RESIDUAL_EPS, GREEDY=greedy, BLOCK_V=block,
    )  # fmt: skip
    return VerifyResult(num_accepted, next_token, verifier_lse)


def verify(*args, use_kernel: bool | None = None, **kwargs) -> VerifyResult:
    """The kernel on CUDA tensors (or when ``use_kernel``), the reference elsewhere."""
    if use_kernel is None:
        use_kernel = args[0].is_cuda if args else kwargs["verifier_logits"].is_cuda
    return (verify_triton if use_kernel else verify_torch)(*args, **kwargs)
