"""Builds the verification op's padded, right-aligned inputs from per-row lists, with the padding
filled with garbage (the op must ignore it)."""

from __future__ import annotations

import torch


def pad_rows(
    counts: list[int],
    verifier: torch.Tensor,  # [sum(n + 1), V]: row after row, n_r + 1 distributions each
    drafts: torch.Tensor,  # [sum(n), V]
    tokens: torch.Tensor,  # [sum(n)]
    seed: int = 99,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(verifier [B, D + 1, V], drafts [B, D, V], tokens [B, D], num_drafts [B]), D = max(counts)."""
    gen = torch.Generator().manual_seed(seed)
    rows, width, vocab = len(counts), max(counts, default=0), verifier.shape[-1]
    garbage = 7.0 * torch.randn(rows, width + 1, vocab, generator=gen).to(verifier.dtype)
    ver, dft = garbage.clone(), garbage[:, :width].clone().to(drafts.dtype)
    tok = torch.randint(0, vocab, (rows, width), generator=gen)
    v0 = d0 = 0
    for r, n in enumerate(counts):
        ver[r, width - n :] = verifier[v0 : v0 + n + 1]
        if n:
            dft[r, width - n :] = drafts[d0 : d0 + n]
            tok[r, width - n :] = tokens[d0 : d0 + n]
        v0, d0 = v0 + n + 1, d0 + n
    return ver, dft, tok, torch.tensor(counts, dtype=torch.int64)


def row_columns(counts: list[int], lse: torch.Tensor) -> list[torch.Tensor]:
    """Row r's meaningful columns (its drafts and the bonus) of a [B, D + 1] output."""
    width = lse.shape[1] - 1
    return [lse[r, width - n :] for r, n in enumerate(counts)]
