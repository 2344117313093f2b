"""Pairwise acceptance rates for the latency model, teacher-forced on token ids: alpha(j, m) =
E_h[sum_x min(p_j(x|h), p_m(x|h))] after the sampling transform (the probability that m accepts a
token of j, averaged over contexts h), or under greedy decoding how often the two argmaxes agree.
Symmetric: each unordered pair is measured once. The selector averages over the contexts a run
meets: the target's own continuations of calibration text (``run_text``)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch
from tqdm.auto import tqdm

from hsd_fast.compat import embeddable_ids, fit_logits
from hsd_fast.processors import LogitsTransform
from hsd_fast.row_spread import spread


@torch.inference_mode()
def acceptance(
    models: Sequence[torch.nn.Module],
    ids: torch.Tensor,  # [N, L] token ids, teacher-forced
    transform: LogitsTransform | None = None,
    greedy: bool = False,
    progress: bool = True,
    contexts: slice = slice(None),
) -> list[list[float]]:
    """The symmetric matrix alpha[j][m] over ``models`` (sharing one tokenizer; the last one's
    vocabulary, the target's, is the one decoding samples over) under the sampling ``transform``
    (default: none, temperature 1), averaged over the contexts ending at the positions ``contexts``
    of ``ids`` (default: all)."""
    return acceptance_and_spread(models, ids, transform, greedy, progress, contexts)[0]


@torch.inference_mode()
def acceptance_and_spread(
    models: Sequence[torch.nn.Module],
    ids: torch.Tensor,  # [N, L] token ids, teacher-forced
    transform: LogitsTransform | None = None,
    greedy: bool = False,
    progress: bool = True,
    contexts: slice = slice(None),
) -> tuple[list[list[float]], list[list[float]]]:
    """``acceptance``'s matrix and, from the same forwards, each pair's spread over the N rows of
    ``ids`` (``row_spread.spread``: how far apart the rows' own rates lie; 0.0 on the diagonal)."""
    transform = transform or LogitsTransform()
    vocab = models[-1].get_output_embeddings().weight.shape[0]  # the target's, as decoding uses it
    dists = [
        teacher_forced_scores(model, ids, transform, greedy, vocab, contexts)
        for model in tqdm(models, desc="teacher-forced forwards", disable=not progress)
    ]  # each [N, L', V], or [N, L'] under greedy
    alpha = [[1.0] * len(models) for _ in models]
    spreads = [[0.0] * len(models) for _ in models]
    for j, m in itertools.combinations(range(len(models)), 2):
        a, b = dists[j], dists[m].to(dists[j].device)
        scores = (a == b).float() if greedy else torch.minimum(a, b).sum(-1)  # [N, L'] per context
        alpha[j][m] = alpha[m][j] = float(scores.mean())
        spreads[j][m] = spreads[m][j] = spread(scores.double().cpu().numpy())
    return alpha, spreads


@torch.inference_mode()
def teacher_forced_scores(
    model: torch.nn.Module,
    ids: torch.Tensor,  # [N, L]
    transform: LogitsTransform,
    greedy: bool,
    vocab: int,
    contexts: slice = slice(None),
) -> torch.Tensor:
    """``model``'s distribution of the token after each prefix ``ids[n, :i + 1]`` that ends at one
    of the positions ``contexts`` (L' of them; default: all) under the sampling ``transform``, over
    the target's ``vocab``: probabilities [N, L', V], or under greedy decoding the argmax [N, L']."""
    flat = (
        teacher_forced_logits(model, ids, transform, vocab, contexts) / transform.temperature
    )  # [N * L', V]
    scores = flat.argmax(-1) if greedy else torch.softmax(flat, -1)
    return scores.unflatten(0, (ids.shape[0], -1))


@torch.inference_mode()
def teacher_forced_logits(
    model: torch.nn.Module,
    ids: torch.Tensor,  # [N, L]
    transform: LogitsTransform,
    vocab: int,
    contexts: slice = slice(None),
) -> torch.Tensor:
    """[N * L', V] fp32 ``model``'s logits after each prefix of ``ids`` that ends at one of the
    positions ``contexts`` (L' of them; default: all), through the sampling ``transform``
    (temperature not applied), over the target's ``vocab``."""
    ids = embeddable_ids(model, ids.to(next(model.parameters()).device))
    logits = fit_logits(model(ids).logits, vocab)[:, contexts]  # [N, L', V]
    return transform(logits.reshape(-1, vocab)).float()
