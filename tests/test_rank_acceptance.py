"""Rank acceptance (hsd_fast/profile/rank_acceptance.py) against its exact value: on random
distributions over 4 tokens, sampled (recursive rejection sampling without replacement, enumerated
over every ordered draw of the candidates) and greedy (top-k agreement); on tiny HF models the first
rank's rate is the chain's acceptance rate."""

from __future__ import annotations

import itertools

import pytest
import torch
from hf_models import noisy_copy, tiny_model

from hsd_fast.profile.acceptance_rates import acceptance
from hsd_fast.profile.rank_acceptance import rank_acceptance, rank_acceptance_of_logits

VOCAB, CONTEXTS, COPIES = 4, 6, 4000


def _exact_sampled(q: torch.Tensor, p: torch.Tensor, k: int) -> tuple[list[float], list[float]]:
    """Per rank, P(the walk reaches it) and P(it is accepted) at one context, by enumerating every
    ordered draw of k distinct candidates from q and following the recursive rule exactly."""
    reach, accept = [0.0] * k, [0.0] * k
    for draw in itertools.permutations(range(len(q)), k):
        weight, left = 1.0, 1.0
        for x in draw:  # drawn without replacement
            weight *= float(q[x]) / left if left > 0 else 0.0
            left -= float(q[x])
        if weight == 0.0:
            continue
        p_now, q_now, alive = p.clone(), q.clone(), 1.0
        for rank, x in enumerate(draw):
            reach[rank] += weight * alive
            ok = min(1.0, float(p_now[x] / q_now[x])) if q_now[x] > 0 else 0.0
            accept[rank] += weight * alive * ok
            alive *= 1.0 - ok
            residual = (p_now - q_now).clamp_min(0)
            p_now = residual / residual.sum() if residual.sum() > 1e-12 else p
            q_now = q_now.clone()
            q_now[x] = 0
            q_now = q_now / q_now.sum() if q_now.sum() > 0 else q_now
    return reach, accept


def _contexts(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    p = 2.0 * torch.randn(CONTEXTS, VOCAB, generator=gen)
    return p + 1.5 * torch.randn(CONTEXTS, VOCAB, generator=gen), p  # draft, verifier logits


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_rank_acceptance_matches_its_exact_value(temperature: float) -> None:
    q_logits, p_logits = _contexts(0)
    k = 3
    reach, accept = torch.zeros(k, dtype=torch.float64), torch.zeros(k, dtype=torch.float64)
    for q_row, p_row in zip(q_logits, p_logits, strict=True):
        r, a = _exact_sampled(
            torch.softmax(q_row.double() / temperature, -1),
            torch.softmax(p_row.double() / temperature, -1),
            k,
        )
        reach, accept = reach + torch.tensor(r), accept + torch.tensor(a)
    exact = accept / reach
    rates = rank_acceptance_of_logits(
        q_logits.repeat(COPIES, 1), p_logits.repeat(COPIES, 1), k, temperature, greedy=False, seed=3
    )
    # standard error of a rate over >= (reach share) * CONTEXTS * COPIES contexts: below 0.01
    assert torch.allclose(torch.tensor(rates, dtype=torch.float64), exact, atol=0.03), (rates, exact)


def test_greedy_rank_acceptance_is_top_k_agreement() -> None:
    q_logits, p_logits = _contexts(1)
    k = 3
    order = q_logits.argsort(-1, descending=True)[:, :k]  # the draft's top-k
    match = order == p_logits.argmax(-1, keepdim=True)  # [C, k]
    reached = torch.cat([torch.ones(CONTEXTS, 1, dtype=torch.bool), ~match.cumsum(1).bool()[:, :-1]], 1)
    exact = [float(match[:, r].sum() / reached[:, r].sum()) if reached[:, r].any() else 0.0 for r in range(k)]
    assert rank_acceptance_of_logits(q_logits, p_logits, k, 1.0, greedy=True) == pytest.approx(exact)


@pytest.mark.hf
def test_the_first_rank_is_the_chains_acceptance_rate() -> None:
    target = tiny_model("llama", vocab_size=16, layers=2, lm_head_scale=3.0)
    draft = noisy_copy(target, 0.5, seed=1)
    ids = torch.randint(3, 16, (8, 48), generator=torch.Generator().manual_seed(0))
    rates = rank_acceptance(draft, target, ids, max_rank=3)
    alpha = acceptance([draft, target], ids, progress=False)[0][1]
    assert rates[0] == pytest.approx(alpha, abs=0.04)  # 384 contexts, one draw each
    assert all(0.0 < r < 1.0 for r in rates), rates
