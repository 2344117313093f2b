"""The verification step of ``rejection_torch.py`` (which states the contract and holds the reference
``verify_torch``) as fused Triton kernels: ``verify_triton``, same signature and results, the
vocabulary split across programs, logits read once in blocks, no probability tensor materialised.
``verify`` (from ``ops.py``) picks the kernels for CUDA tensors and the reference elsewhere.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import checks, split
from .keyed_random import ACCEPT, BONUS, RESIDUAL, key_state, uniform_from_state
from .rejection_torch import RESIDUAL_EPS, VerifyResult
from .split import NO_SPECIALIZE, fold_argmax, fold_lse, plan, scan_chunk

__all__ = ["verify_triton"]


# ----------------------------------------------------------------------------- Triton kernels
# Split-and-reduce over the vocabulary (as FlashDecoding splits the sequence), so that a batch of
# one row still spreads over the whole GPU. Four launches (greedy: the first two):
#   1. _chunk_stats_kernel [B, C, S]  one vocabulary chunk of the row's verifier positions
#                                     s, s + S, ...: max, sum of exp, first argmax (greedy)
#   2. _accept_kernel      [B]        chunks -> log-sum-exp of every position (an output), the
#                                     accept tests of all drafts at once, the count; greedy: token
#   3. _chunk_race_kernel  [B, C']    the selected position, one chunk: exponential races over p
#                                     and over the residual max(0, p - q), residual mass
#   4. _race_pick_kernel   [B]        chunks -> the token
# Chunk c covers [c * chunk_size, min((c + 1) * chunk_size, V)). Partials are reduced in chunk order,
# so results do not depend on scheduling. Chunk counts and the level are runtime arguments that
# Triton must not specialise on: a new batch size or level never recompiles.
_ACCEPT: tl.constexpr = tl.constexpr(ACCEPT)
_RESIDUAL: tl.constexpr = tl.constexpr(RESIDUAL)
_BONUS: tl.constexpr = tl.constexpr(BONUS)
_BAD_COUNT: tl.constexpr = tl.constexpr(checks.NUM_DRAFTS_OUT_OF_RANGE)
_BAD_TOKEN: tl.constexpr = tl.constexpr(checks.DRAFT_TOKEN_OUT_OF_RANGE)
_BAD_TEMPERATURE: tl.constexpr = tl.constexpr(checks.TEMPERATURE_NOT_POSITIVE)


@triton.jit
def _row_layout(num_drafts_ptr, row, width):
    """Row ``row``'s draft count n and the flat indices of its first draft (in [B * D]) and of the
    verifier column of its first draft (in [B * (D + 1)]): drafts are the last n of D columns. A
    count outside [0, D] is clamped into it (before the int32 cast), so no program reads outside
    the row; the accept kernel flags it."""
    n = tl.minimum(tl.maximum(tl.load(num_drafts_ptr + row), 0), width).to(tl.int32)
    return n, row * width + width - n, row * (width + 1) + width - n


@triton.jit(do_not_specialize=NO_SPECIALIZE)
def _chunk_stats_kernel(
    ver_ptr, ver_stride, num_drafts_ptr, temp_ptr, max_ptr, sum_ptr, arg_ptr,
    V, width, chunk_size, num_chunks,
    GREEDY: tl.constexpr, BLOCK_V: tl.constexpr,
):  # fmt: skip
    row, chunk, first_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    n, _first_draft, v0 = _row_layout(num_drafts_ptr, row, width)
    temp = tl.load(temp_ptr + row)
    for k in range(first_k, n + 1, tl.num_programs(2)):
        vrow = ver_ptr + (v0 + k).to(tl.int64) * ver_stride
        run_max, run_sum, _, best_idx = scan_chunk(
            vrow, chunk, chunk_size, V, temp, 0, ARGMAX=GREEDY, RACE=False, BLOCK_V=BLOCK_V
        )
        out = (v0 + k) * num_chunks + chunk
        tl.store(max_ptr + out, run_max)
        tl.store(sum_ptr + out, run_sum)
        if GREEDY:
            tl.store(arg_ptr + out, best_idx)


@triton.jit(do_not_specialize=NO_SPECIALIZE)
def _accept_kernel(
    ver_ptr, ver_stride, draft_ptr, draft_stride, draft_lse_ptr, draft_tok_ptr, num_drafts_ptr,
    temp_ptr, seeds_ptr, positions_ptr, max_ptr, sum_ptr, arg_ptr, num_acc_ptr, next_tok_ptr, lse_ptr,
    err_ptr, V, level, width, num_chunks,
    GREEDY: tl.constexpr, POINT_MASS: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_C: tl.constexpr,
    HAS_FLAG: tl.constexpr,
):  # fmt: skip
    """All positions of a row side by side ([BLOCK_K, BLOCK_C] tiles of partials): a row's tests
    cost a few dependent memory round trips, not one chain per draft. Out-of-range values (count,
    draft tokens, temperature) are OR'd into ``err_ptr`` (checks.py) where the caller passed a flag
    (``HAS_FLAG``): one predicated atomic.
    ``POINT_MASS``: q(x) = 1, no q is read."""
    row = tl.program_id(0)
    n, d0, v0 = _row_layout(num_drafts_ptr, row, width)
    n_given = tl.load(num_drafts_ptr + row)
    temp = tl.load(temp_ptr + row)
    err = tl.where((n_given < 0) | (n_given > width), _BAD_COUNT, 0)
    err |= tl.where(temp > 0, 0, _BAD_TEMPERATURE)  # NaN included
    seed = tl.load(seeds_ptr + row)
    pos0 = tl.load(positions_ptr + row)
    chunks = tl.arange(0, BLOCK_C)[None, :]
    num_acc = n
    for k0 in range(0, n + 1, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)  # [K] positions; k == n is the bonus position
        vpos = v0 + k
        base = vpos[:, None] * num_chunks
        lse_max = tl.full((BLOCK_K,), -float("inf"), tl.float32)
        lse_sum = tl.zeros((BLOCK_K,), tl.float32)
        best = tl.full((BLOCK_K,), -float("inf"), tl.float32)
        best_chunk = tl.zeros((BLOCK_K,), tl.int32)
        for c0 in range(0, num_chunks, BLOCK_C):
            c = c0 + chunks
            valid = (k <= n)[:, None] & (c < num_chunks)
            part_max = tl.load(max_ptr + base + c, mask=valid, other=-float("inf"))  # [K, C]
            part_sum = tl.load(sum_ptr + base + c, mask=valid, other=0.0)
            lse_max, lse_sum = fold_lse(lse_max, lse_sum, part_max, part_sum, 1)
            if GREEDY:
                best, best_chunk = fold_argmax(best, best_chunk, part_max, c, num_chunks, 1)
        lse = lse_max + tl.log(tl.where(k <= n, lse_sum, 1.0))  # lanes past the row: no log(0)
        tl.store(lse_ptr + vpos, lse, mask=k <= n)

        is_draft = k < n
        tok = tl.load(draft_tok_ptr + d0 + k, mask=is_draft, other=0)
        bad_tok = is_draft & ((tok < 0) | (tok >= V))
        err |= tl.where(tl.max(bad_tok.to(tl.int32), axis=0) > 0, _BAD_TOKEN, 0)
        tok = tl.where(bad_tok, 0, tok)  # never read outside the row
        if GREEDY:
            argmax = tl.load(arg_ptr + vpos * num_chunks + best_chunk, mask=k <= n, other=0)
            accepted = tok == argmax
        else:
            vrow = ver_ptr + vpos.to(tl.int64) * ver_stride
            drow = draft_ptr + (d0 + k).to(tl.int64) * draft_stride
            logp = tl.load(vrow + tok, mask=is_draft, other=0.0).to(tl.float32) / temp - lse
            if POINT_MASS:
                logq = tl.zeros((BLOCK_K,), tl.float32)
            else:
                logq = tl.load(drow + tok, mask=is_draft, other=0.0).to(tl.float32) / temp
                logq -= tl.load(draft_lse_ptr + d0 + k, mask=is_draft, other=0.0)
            u = uniform_from_state(key_state(seed, level, pos0 + k, _ACCEPT), tl.full((), 0, tl.int32))
            accepted = tl.log(u) <= logp - logq
        # Blocks come in order, so an earlier block's rejection is never overridden.
        num_acc = tl.minimum(num_acc, tl.min(tl.where(is_draft & ~accepted, k, n), axis=0))
        if GREEDY:  # the correction (num_acc < n) or the bonus: in exactly one block
            tl.store(next_tok_ptr + row + 0 * k, argmax.to(tl.int64), mask=k == num_acc)
    tl.store(num_acc_ptr + row, num_acc)
    if HAS_FLAG:
        tl.atomic_or(err_ptr, err, mask=err != 0)


@triton.jit(do_not_specialize=NO_SPECIALIZE)
def _chunk_race_kernel(
    ver_ptr, ver_stride, draft_ptr, draft_stride, draft_lse_ptr, draft_tok_ptr, num_drafts_ptr, temp_ptr,
    seeds_ptr, positions_ptr, num_acc_ptr, lse_ptr, key_p_ptr, idx_p_ptr, key_r_ptr, idx_r_ptr,
    mass_r_ptr, V, level, width, chunk_size, num_chunks,
    POINT_MASS: tl.constexpr, BLOCK_V: tl.constexpr,
):  # fmt: skip
    """Races at the selected position over one chunk. The race over p and the race over the
    residual share their uniforms (one key: the purpose says correction or bonus); which one wins
    is decided by the residual mass, known only once all chunks are in. ``POINT_MASS``: the residual
    is p without the rejected token (its q is 1 there, 0 elsewhere); no q is read."""
    row, chunk = tl.program_id(0), tl.program_id(1)
    n, d0, v0 = _row_layout(num_drafts_ptr, row, width)
    num_acc = tl.load(num_acc_ptr + row).to(tl.int32)
    temp = tl.load(temp_ptr + row)
    rejected = num_acc < n
    state = key_state(
        tl.load(seeds_ptr + row),
        level,
        tl.load(positions_ptr + row) + num_acc,
        tl.where(rejected, _RESIDUAL, _BONUS),
    )
    lse_p = tl.load(lse_ptr + v0 + num_acc)
    vrow = ver_ptr + (v0 + num_acc).to(tl.int64) * ver_stride
    d_sel = d0 + tl.minimum(num_acc, n - 1)  # the rejected draft's q (unused when none was)
    drow = draft_ptr + d_sel.to(tl.int64) * draft_stride
    if POINT_MASS:
        rejected_tok = tl.load(draft_tok_ptr + d_sel, mask=rejected, other=-1)
        lse_q = 0.0
    else:
        rejected_tok = -1
        lse_q = tl.load(draft_lse_ptr + d_sel, mask=rejected, other=0.0)
    lo = chunk * chunk_size
    hi = tl.minimum(lo + chunk_size, V)
    cols = tl.arange(0, BLOCK_V)
    best_p = -float("inf")
    idx_p = 0
    best_r = -float("inf")
    idx_r = 0
    mass_r = 0.0
    for start in range(lo, hi, BLOCK_V):
        idx = start + cols
        in_chunk = idx < hi
        logp = tl.load(vrow + idx, mask=in_chunk, other=-float("inf")).to(tl.float32) / temp - lse_p
        gumbel = -tl.log(-tl.log(uniform_from_state(state, idx)))
        best_p, idx_p = fold_argmax(best_p, idx_p, logp + gumbel, idx, V, 0)  # -inf past the chunk
        if rejected:
            if POINT_MASS:
                r = tl.where(idx == rejected_tok, 0.0, tl.exp(logp))
            else:
                logq = tl.load(drow + idx, mask=in_chunk, other=-float("inf")).to(tl.float32) / temp - lse_q
                r = tl.maximum(tl.exp(logp) - tl.exp(logq), 0.0)
            mass_r += tl.sum(r, axis=0)
            key_r = tl.where(r > 0, tl.log(tl.where(r > 0, r, 1.0)) + gumbel, -float("inf"))
            best_r, idx_r = fold_argmax(best_r, idx_r, key_r, idx, V, 0)
    out = row * num_chunks + chunk
    tl.store(key_p_ptr + out, best_p)
    tl.store(idx_p_ptr + out, idx_p)
    tl.store(key_r_ptr + out, best_r)
    tl.store(idx_r_ptr + out, idx_r)
    tl.store(mass_r_ptr + out, mass_r)


@triton.jit(do_not_specialize=NO_SPECIALIZE)
def _race_pick_kernel(
    num_drafts_ptr, num_acc_ptr, key_p_ptr, idx_p_ptr, key_r_ptr, idx_r_ptr, mass_r_ptr, next_tok_ptr,
    eps, width, num_chunks,
    BLOCK_C: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    n, _, _ = _row_layout(num_drafts_ptr, row, width)
    rejected = tl.load(num_acc_ptr + row) < n
    chunks = tl.arange(0, BLOCK_C)
    base = row * num_chunks
    best_p = -float("inf")
    chunk_p = 0
    best_r = -float("inf")
    chunk_r = 0
    mass_r = 0.0
    for c0 in range(0, num_chunks, BLOCK_C):
        c = c0 + chunks
        valid = c < num_chunks
        key_p = tl.load(key_p_ptr + base + c, mask=valid, other=-float("inf"))
        best_p, chunk_p = fold_argmax(best_p, chunk_p, key_p, c, num_chunks, 0)
        key_r = tl.load(key_r_ptr + base + c, mask=valid, other=-float("inf"))
        best_r, chunk_r = fold_argmax(best_r, chunk_r, key_r, c, num_chunks, 0)
        mass_r += tl.sum(tl.load(mass_r_ptr + base + c, mask=valid, other=0.0), axis=0)
    # Below eps the residual is rounding noise: p and q agree, and the draw comes from p (§2).
    if rejected and mass_r >= eps:
        token = tl.load(idx_r_ptr + base + chunk_r)
    else:
        token = tl.load(idx_p_ptr + base + chunk_p)
    tl.store(next_tok_ptr + row, token.to(tl.int64))


BLOCK_K = 16
"""Verifier positions of a row tested side by side by the accept kernel."""


def verify_triton(
    verifier_logits: torch.Tensor,
    draft_logits: torch.Tensor | None,
    draft_lse: torch.Tensor | None,
    draft_tokens: torch.Tensor,
    num_drafts: torch.Tensor,
    temperature: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    level: int,
    greedy: bool,
    block_v: int | None = None,
    num_chunks: int | None = None,
    *,
    error_flag: torch.Tensor | None = None,
) -> VerifyResult:
    """The fused kernels: same signature, results and argument errors as ``verify_torch``.
    ``block_v`` and ``num_chunks`` override the vocabulary block and split (tests and benchmarks).
    ``error_flag`` ([1] int32, zeroed by the caller): where values are not checked on the host (CUDA
    tensors), the kernels OR into it the bits of ``checks.py`` for out-of-range counts, draft tokens
    and temperatures; read it at a sync you make anyway (``checks.raise_on_error_flag``). Without
    one (the engine, whose values come from its own steps) nothing is flagged: bad values then give
    wrong numbers, never an out-of-bounds read."""
    num_rows, width, vocab = checks.check_verify_args(
        verifier_logits, draft_logits, draft_lse, draft_tokens, num_drafts, temperature, seeds, positions,
        level, greedy, error_flag, flag_with_tensor_ops=False,
    )  # fmt: skip
    checks.check_split(block_v, num_chunks)
    device = verifier_logits.device
    num_accepted = torch.empty(num_rows, dtype=torch.int64, device=device)
    next_token = torch.empty(num_rows, dtype=torch.int64, device=device)
    verifier_lse = torch.empty(num_rows, width + 1, dtype=torch.float32, device=device)
    if num_rows == 0:
        return VerifyResult(num_accepted, next_token, verifier_lse)

    # Stats programs: (row, chunk, position split). A row has at most D + 1 positions; spreading them
    # over programs keeps each program to about one position.
    position_split = width + 1
    block, stats_chunks, stats_size = plan(num_rows * position_split, vocab, device, block_v, num_chunks)
    _, race_chunks, race_size = plan(num_rows, vocab, device, block_v, num_chunks)

    verifier_logits = verifier_logits.reshape(num_rows * (width + 1), vocab).contiguous()  # [B (D + 1), V]
    point_mass = draft_logits is None  # q is 1 at each draft token: nothing to read
    if width == 0 or point_mass:  # keep valid pointers; no row reads them
        draft_logits, draft_lse = verifier_logits[:1], verifier_lse
    draft_logits = draft_logits.reshape(-1, vocab).contiguous()  # [B D, V]
    draft_lse = draft_lse.float().contiguous()
    draft_tokens = draft_tokens.contiguous()
    num_drafts = num_drafts.to(torch.int64).contiguous()
    temperature = temperature.float().contiguous()
    seeds, positions = seeds.to(torch.int64), positions.to(torch.int64)
    # Partials each in their own allocation: Triton specialises on 16-byte pointer alignment, and
    # views into one buffer would flip it with the sizes (a recompile).
    num_vrows = num_rows * (width + 1)
    part_max = torch.empty(num_vrows * stats_chunks, device=device)
    part_sum = torch.empty_like(part_max)
    part_arg = torch.empty(num_vrows * stats_chunks if greedy else 1, dtype=torch.int32, device=device)

    _chunk_stats_kernel[(num_rows, stats_chunks, position_split)](
        verifier_logits, verifier_logits.stride(0), num_drafts, temperature, part_max, part_sum, part_arg,
        vocab, width, stats_size, stats_chunks, GREEDY=greedy, BLOCK_V=block,
    )  # fmt: skip
    # Without a flag any tensor stands in for its pointer: the kernel never touches it then.
    _accept_kernel[(num_rows,)](
        verifier_logits, verifier_logits.stride(0), draft_logits, draft_logits.stride(0), draft_lse,
        draft_tokens, num_drafts, temperature, seeds, positions, part_max, part_sum,
        part_arg, num_accepted, next_token, verifier_lse, num_accepted if error_flag is None else error_flag,
        vocab, level, width, stats_chunks, GREEDY=greedy, POINT_MASS=point_mass, BLOCK_K=BLOCK_K,
        BLOCK_C=split.BLOCK_C, HAS_FLAG=error_flag is not None,
    )  # fmt: skip
    if greedy:
        return VerifyResult(num_accepted, next_token, verifier_lse)

    key_p, key_r, mass_r = (torch.empty(num_rows * race_chunks, device=device) for _ in range(3))
    idx_p, idx_r = (torch.empty(num_rows * race_chunks, dtype=torch.int32, device=device) for _ in range(2))
    _chunk_race_kernel[(num_rows, race_chunks)](
        verifier_logits, verifier_logits.stride(0), draft_logits, draft_logits.stride(0), draft_lse,
        draft_tokens, num_drafts, temperature, seeds, positions, num_accepted, verifier_lse,
        key_p, idx_p, key_r, idx_r, mass_r, vocab, level, width, race_size, race_chunks,
        POINT_MASS=point_mass, BLOCK_V=block,
    )  # fmt: skip
    _race_pick_kernel[(num_rows,)](
        num_drafts, num_accepted, key_p, idx_p, key_r, idx_r, mass_r, next_token,
        RESIDUAL_EPS, width, race_chunks, BLOCK_C=split.BLOCK_C,
    )  # fmt: skip
    return VerifyResult(num_accepted, next_token, verifier_lse)
