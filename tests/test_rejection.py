"""The verification op's torch reference (`verify_torch`): the contract the fused kernel matches."""

import pytest
import torch
from padded import pad_rows, row_columns

from hsd_fast.testing.exactness import pooled_chi_square
from hsd_fast.triton_kernels.keyed_random_torch import DRAFT
from hsd_fast.triton_kernels.rejection_torch import verify_torch
from hsd_fast.triton_kernels.sampling_torch import sample_torch

V = 6


def _verify(p_logits, q_logits, drafts, counts, seeds, positions=None, temperature=None, greedy=False):
    """Rows given one after the other (p: n_r + 1 per row, q and drafts: n_r), padded for the op."""
    rows = len(counts)
    temp = torch.ones(rows) if temperature is None else torch.full((rows,), temperature)
    ver, dft, tok, num = pad_rows(counts, p_logits, q_logits, drafts)
    q_lse = torch.logsumexp(dft.float() / temp[:, None, None], -1)
    positions = torch.full((rows,), 10, dtype=torch.int64) if positions is None else positions
    return verify_torch(ver, dft, q_lse, tok, num, temp, seeds, positions, level=1, greedy=greedy)


def test_one_draft_then_bonus_is_distributed_as_p() -> None:
    """x ~ q, verified against p: the emitted first token is a p sample, and so is the bonus."""
    gen = torch.Generator().manual_seed(0)
    n = 30_000
    q_row, p_row, p_next = (2.0 * torch.randn(V, generator=gen) for _ in range(3))
    seeds = torch.arange(n, dtype=torch.int64)
    q_logits = q_row.expand(n, V)
    drafts, _ = sample_torch(q_logits, torch.ones(n), seeds, torch.full((n,), 10), 0, DRAFT, False)
    p_logits = torch.stack([p_row, p_next]).repeat(n, 1)  # rows: [p at the draft, p at the bonus]
    res = _verify(p_logits, q_logits, drafts, [1] * n, seeds)
    first = torch.where(res.num_accepted == 1, drafts, res.next_token)
    p = torch.softmax(p_row.double(), -1).tolist()
    assert pooled_chi_square(first.tolist(), dict(enumerate(p))).p_value > 1e-3
    bonus = res.next_token[res.num_accepted == 1]
    p2 = torch.softmax(p_next.double(), -1).tolist()
    assert pooled_chi_square(bonus.tolist(), dict(enumerate(p2))).p_value > 1e-3
    accept_rate = res.num_accepted.double().mean().item()
    expected = torch.minimum(torch.softmax(p_row.double(), -1), torch.softmax(q_row.double(), -1)).sum()
    assert accept_rate == pytest.approx(expected.item(), abs=0.01)


def test_greedy_accepts_the_leading_argmax_matches() -> None:
    p_logits = torch.tensor([[0, 5.0, 0, 0, 0, 0], [0, 0, 5.0, 0, 0, 0], [0, 0, 0, 5.0, 0, 0]])
    q_logits = torch.zeros(2, V)
    for drafts, accepted, nxt in [([1, 2], 2, 3), ([1, 4], 1, 2), ([0, 2], 0, 1)]:
        res = _verify(p_logits, q_logits, torch.tensor(drafts), [2], torch.tensor([0]), greedy=True)
        assert (res.num_accepted.item(), res.next_token.item()) == (accepted, nxt)


def test_equal_distributions_accept_everything() -> None:
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(5, V, generator=gen)
    res = _verify(torch.cat([logits, torch.randn(1, V)]), logits, torch.arange(5), [5], torch.tensor([3]))
    assert res.num_accepted.item() == 5


def test_rows_are_independent_of_the_batch() -> None:
    """Ragged rows with 0, 1 and 5 drafts: each row's outcome equals running it alone."""
    gen = torch.Generator().manual_seed(2)
    counts = [0, 1, 5, 2]
    p_logits = 2 * torch.randn(sum(counts) + len(counts), V, generator=gen)
    q_logits = 2 * torch.randn(sum(counts), V, generator=gen)
    drafts = torch.randint(0, V, (sum(counts),), generator=gen)
    seeds = torch.tensor([11, 12, 13, 14])
    positions = torch.tensor([4, 9, 2, 30])
    batch = _verify(p_logits, q_logits, drafts, counts, seeds, positions)
    offsets = [0, *torch.tensor(counts).cumsum(0).tolist()]
    for r, n in enumerate(counts):
        d0, d1 = offsets[r], offsets[r + 1]
        alone = _verify(
            p_logits[d0 + r : d1 + r + 1],
            q_logits[d0:d1],
            drafts[d0:d1],
            [n],
            seeds[r : r + 1],
            positions[r : r + 1],
        )
        assert alone.num_accepted.item() == batch.num_accepted[r].item()
        assert alone.next_token.item() == batch.next_token[r].item()
        assert torch.equal(
            row_columns([n], alone.verifier_lse)[0], row_columns(counts, batch.verifier_lse)[r]
        )


def test_temperature_equals_pre_scaled_logits() -> None:
    gen = torch.Generator().manual_seed(3)
    p_logits, q_logits = torch.randn(4, V, generator=gen), torch.randn(3, V, generator=gen)
    drafts, seeds = torch.tensor([0, 1, 2]), torch.tensor([5])
    for seed in range(20):
        seeds = torch.tensor([seed])
        hot = _verify(p_logits, q_logits, drafts, [3], seeds, temperature=0.5)
        pre = _verify(p_logits / 0.5, q_logits / 0.5, drafts, [3], seeds)
        assert hot.num_accepted.item() == pre.num_accepted.item()
        assert hot.next_token.item() == pre.next_token.item()
        assert torch.allclose(hot.verifier_lse[0], torch.logsumexp(p_logits / 0.5, -1))


def test_masked_tokens_are_never_emitted() -> None:
    """Top-k style -inf logits: a draft the verifier excludes is always rejected, and the correction
    never picks an excluded token."""
    n = 2000
    p_row = torch.tensor([1.0, 0.5, -float("inf"), 0.0, -float("inf"), 0.2])
    p_logits = torch.stack([p_row, p_row]).repeat(n, 1)
    q_logits = torch.zeros(n, V)
    drafts = torch.full((n,), 2)
    res = _verify(p_logits, q_logits, drafts, [1] * n, torch.arange(n))
    assert res.num_accepted.sum().item() == 0
    assert not torch.isin(res.next_token, torch.tensor([2, 4])).any()
