"""Rank acceptance of a draft under a verifier, for choosing token trees (docs/design.md, "Choosing a
tree"): ``rates[k]``, the probability that the verifier accepts the draft's rank-k candidate at a
context given that it rejected the candidates ranked before it, measured teacher-forced on token
ids after the sampling transform (the selector's ids: the run's own text, ``run_text``).

At every context the draft draws ``max_rank`` candidates exactly as the engine drafts a
tree's children (greedy: its top-k; sampling: Gumbel-top-k under a keyed seed) and the verifier tries
them with the engine's own rule (``verify_tree_torch`` on a one-depth tree: recursive rejection
sampling without replacement; greedy: the candidate equal to its argmax). ``rates[k]`` is the
number of contexts that accepted rank k over those that reached it (rejected every earlier rank).
"""

from __future__ import annotations

import torch

from hsd_fast.processors import LogitsTransform
from hsd_fast.profile.acceptance_rates import teacher_forced_logits
from hsd_fast.tree import Tree
from hsd_fast.triton_kernels.tree_torch import draft_children_torch, verify_tree_torch

ROWS_PER_CHUNK = 256
"""Contexts verified at once: the verification holds a few [rows, max_rank + 1, V] fp32 tensors."""


@torch.inference_mode()
def rank_acceptance(
    draft: torch.nn.Module,
    verifier: torch.nn.Module,
    calibration_ids: torch.Tensor,  # [N, L] token ids, teacher-forced
    max_rank: int = 4,
    transform: LogitsTransform | None = None,
    greedy: bool = False,
    seed: int = 0,
) -> tuple[float, ...]:
    """``(rates[0], ..., rates[max_rank - 1])`` of ``draft`` under ``verifier`` (module doc); a rank
    no context reached gets 0."""
    transform = transform or LogitsTransform()
    vocab = verifier.get_output_embeddings().weight.shape[0]  # the target's, as decoding uses it
    q = teacher_forced_logits(draft, calibration_ids, transform, vocab)  # [R, V]
    p = teacher_forced_logits(verifier, calibration_ids, transform, vocab).to(q.device)  # [R, V]
    return rank_acceptance_of_logits(q, p, max_rank, transform.temperature, greedy, seed)


def rank_acceptance_of_logits(
    draft_logits: torch.Tensor,  # [R, V] processed, one context per row
    verifier_logits: torch.Tensor,  # [R, V]
    max_rank: int,
    temperature: float,
    greedy: bool,
    seed: int = 0,
) -> tuple[float, ...]:
    """Rank acceptance from the two levels' processed logits at the same contexts (module doc)."""
    if not 1 <= max_rank <= draft_logits.shape[-1]:
        raise ValueError(
            f"max_rank must lie in [1, {draft_logits.shape[-1]}] (the vocabulary), got {max_rank}"
        )
    tree = Tree.full([max_rank])  # one context and its candidates; node k is rank k
    reached = torch.zeros(max_rank, dtype=torch.float64)
    accepted = torch.zeros(max_rank, dtype=torch.float64)
    for start in range(0, len(draft_logits), ROWS_PER_CHUNK):
        q, p = draft_logits[start : start + ROWS_PER_CHUNK], verifier_logits[start : start + ROWS_PER_CHUNK]
        rows = len(q)
        temperatures = torch.full((rows,), float(temperature), device=q.device)
        seeds = torch.full((rows,), seed, dtype=torch.int64, device=q.device)
        keys = torch.arange(start, start + rows, device=q.device)  # a context's key: its row
        candidates, _ = draft_children_torch(q, max_rank, temperatures, seeds, keys, 0, greedy)  # [rows, k]
        contexts = max_rank + 1  # the root, then the candidates (leaves: their logits are unused)
        result = verify_tree_torch(
            p[:, None].expand(-1, contexts, -1), None if greedy else q[:, None].expand(-1, contexts, -1),
            candidates, tree, temperatures, seeds, keys, 1, greedy,
        )  # fmt: skip
        chosen = result.path[:, 0].cpu()  # [rows] the accepted rank, -1 for none
        ranks = torch.arange(max_rank)
        reached += ((chosen[:, None] < 0) | (chosen[:, None] >= ranks)).sum(0)
        accepted += (chosen[:, None] == ranks).sum(0)
    return tuple(float(a / r) if r > 0 else 0.0 for a, r in zip(accepted, reached, strict=True))
