"""The HSD loop on table models: exact target distribution for K = 1..3, and the properties of keyed
randomness (docs/design.md, "Why it is exact" and "Keyed randomness"). Significance level of every
distribution test: 1e-3."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from planted_bugs import residual_stored_as_q

from hsd_fast._C import Ledger
from hsd_fast.engine import run_hsd, speculative_window
from hsd_fast.testing.exactness import table_check
from hsd_fast.testing.tables import TableModel, TableRunner, table_family

ALPHA = 1e-3
SAMPLES = 40_000


@pytest.mark.parametrize(
    "block_sizes", [[1], [3], [1, 1], [3, 2], [1, 1, 1], [2, 3, 2]], ids=lambda t: f"T={t}"
)
def test_sampled_continuations_match_the_target(block_sizes: list[int]) -> None:
    check = table_check(block_sizes=block_sizes, num_samples=SAMPLES)
    assert check.chi_square.p_value > ALPHA, check.chi_square
    stats = check.result.stats
    for level in range(1, len(block_sizes) + 1):  # every path of the op was taken at every level
        assert stats.bonus[level] > 0 and stats.corrections[level] > 0
        assert 0 < stats.acceptance_rate(level) < 1
        if level >= 2 or block_sizes[0] > 1:  # blocks of more than one draft reach this level
            assert sum(stats.rejected_at[level][1:]) > 0, "no rejection inside a block"
    if block_sizes != [1]:
        assert sum(stats.cascade_depth[1:]) > 0, "no rollback cascaded into a lower cache"


def test_residual_as_q_is_caught() -> None:
    """Storing the residual as a correction's q is the known bug: the same test must fail it."""
    good = table_check(block_sizes=[3, 2], num_samples=SAMPLES)
    with residual_stored_as_q():
        bad = table_check(block_sizes=[3, 2], num_samples=SAMPLES)
    assert good.chi_square.p_value > ALPHA
    assert bad.chi_square.p_value < 1e-6, bad.chi_square


def test_eos_flushes_and_stays_exact() -> None:
    check = table_check(block_sizes=[2, 2], num_samples=SAMPLES, steps=4, eos_token_id=0)
    assert check.chi_square.p_value > ALPHA, check.chi_square
    lengths = {len(s) for s in check.samples}
    assert min(lengths) == 1 and max(lengths) == 4  # EOS ended some rows at once, others ran on


def test_temperature_is_exact() -> None:
    check = table_check(block_sizes=[2, 1, 2], num_samples=SAMPLES, temperature=0.6)
    assert check.chi_square.p_value > ALPHA, check.chi_square


def test_schedule_changes_only_timing() -> None:
    common = {"block_sizes": [2, 3], "num_samples": 300, "eos_token_id": 1, "steps": 6}
    most = table_check(**common, policy="most_rows")
    highest = table_check(**common, policy="highest_level")
    assert most.samples == highest.samples
    assert most.result.stats.forwards != highest.result.stats.forwards  # the schedules did differ


def _runners(block_sizes: list[int]) -> list[TableRunner]:
    return [TableRunner(m) for m in table_family(5, 2, len(block_sizes) + 1, spread=2.0, seed=4)]


@pytest.mark.parametrize("block_sizes", [[], [2], [3, 2], [1, 2, 3]], ids=lambda t: f"T={t}")
def test_a_row_alone_equals_the_row_in_a_batch(block_sizes: list[int]) -> None:
    prompts = [torch.tensor([0, 1, 2]), torch.tensor([4, 4]), torch.tensor([3, 1, 0, 2])]
    seeds = torch.tensor([101, 202, 303])
    kwargs = {"block_sizes": block_sizes, "max_new_tokens": 12, "eos_token_id": 4}
    batch = run_hsd(_runners(block_sizes), prompts, seeds=seeds, **kwargs)
    for r in range(3):
        alone = run_hsd(_runners(block_sizes), prompts[r : r + 1], seeds=seeds[r : r + 1], **kwargs)
        assert torch.equal(alone.sequences[0], batch.sequences[r])


@pytest.mark.parametrize("block_sizes", [[], [1], [4], [2, 2], [1, 3, 2]], ids=lambda t: f"T={t}")
def test_greedy_equals_the_target_argmax(block_sizes: list[int]) -> None:
    runners = _runners(block_sizes)
    target = runners[-1].model
    prompts = [torch.tensor([0, 1]), torch.tensor([2, 3, 4])]
    result = run_hsd(runners, prompts, block_sizes=block_sizes, max_new_tokens=20, greedy=True)
    for prompt, got in zip(prompts, result.sequences, strict=True):
        seq = prompt.tolist()
        for _ in range(20):
            seq.append(int(target.next_logits(torch.tensor([seq[-2:]]))[0].argmax()))
        assert got.tolist() == seq


def test_output_stops_after_eos_and_at_the_budget() -> None:
    prompts = [torch.tensor([0, 1])] * 50
    result = run_hsd(_runners([2, 2]), prompts, block_sizes=[2, 2], max_new_tokens=7, eos_token_id=3)
    for seq, n in zip(result.sequences, result.num_new_tokens, strict=True):
        new = seq[2:].tolist()
        assert len(new) == n <= 7
        assert 3 not in new[:-1]
        assert n == 7 or new[-1] == 3


def test_zero_new_tokens_returns_the_prompt() -> None:
    result = run_hsd(_runners([2]), [torch.tensor([1, 2])], block_sizes=[2], max_new_tokens=0)
    assert result.sequences[0].tolist() == [1, 2] and result.num_new_tokens == [0]


def test_errors_are_clear() -> None:
    runners = _runners([2])
    with pytest.raises(ValueError, match="vocab_size"):
        small = TableRunner(TableModel(torch.zeros(9, 3), order=2))
        run_hsd([small, runners[1]], [torch.tensor([0, 1])], block_sizes=[2], max_new_tokens=3)
    with pytest.raises(ValueError, match="block size"):
        run_hsd(runners, [torch.tensor([0, 1])], block_sizes=[0], max_new_tokens=3)
    with pytest.raises(ValueError, match="block_sizes"):
        run_hsd(runners, [torch.tensor([0, 1])], block_sizes=[2, 2], max_new_tokens=3)
    with pytest.raises(ValueError, match="order 2"):
        run_hsd(runners, [torch.tensor([0])], block_sizes=[2], max_new_tokens=3)
    with pytest.raises(ValueError, match="at least one runner"):
        run_hsd([], [torch.tensor([0])], block_sizes=[], max_new_tokens=3)


@given(st.lists(st.integers(1, 4), min_size=1, max_size=3), st.data())
def test_the_ring_holds_every_live_speculative_position(block_sizes: list[int], data) -> None:
    """The ring keeps q for positions [committed, seq_len] (the last one: a token being emitted);
    whatever the verifiers accept, that span never outgrows it, so no live slot is overwritten."""
    ledger = Ledger(len(block_sizes) + 1, block_sizes, [2], [40])
    widest = 0
    while (level := ledger.next_level()) >= 0:
        widest = max(widest, ledger.seq_len(0) + 1 - ledger.committed_len(0))
        if level == 0:
            ledger.commit_draft([0], [0])
        else:
            drafts = ledger.seq_len(0) - int(ledger.frontiers()[0, level])
            ledger.commit_verify(level, [0], [data.draw(st.integers(0, drafts))], [0])
    assert widest <= speculative_window(block_sizes)


def test_on_commit_streams_exactly_the_committed_tokens_in_order() -> None:
    prompts = [torch.tensor([0, 1]), torch.tensor([2, 3, 4]), torch.tensor([1, 1])]
    streamed: dict[int, list[int]] = {r: [] for r in range(3)}
    pieces = []

    def on_commit(row: int, tokens: torch.Tensor) -> None:
        streamed[row] += tokens.tolist()
        pieces.append(row)

    kwargs = {"block_sizes": [2, 2], "max_new_tokens": 15, "eos_token_id": 4, "seeds": 5}
    result = run_hsd(_runners([2, 2]), prompts, on_commit=on_commit, **kwargs)
    for r, (prompt, seq) in enumerate(zip(prompts, result.sequences, strict=True)):
        assert streamed[r] == seq[len(prompt) :].tolist()
    assert len(pieces) > 3  # handed out as the target committed them, not all at the end


class _BrokenRunner(TableRunner):
    """A table model whose logits turn to ``value`` once a row has ``after`` tokens."""

    def __init__(self, model: TableModel, value: float, after: int) -> None:
        super().__init__(model)
        self.value, self.after = value, after

    def forward(self, block, num_outputs: int) -> torch.Tensor:
        logits = super().forward(block, num_outputs)
        late = block.positions[:, block.positions.shape[1] - num_outputs :] >= self.after  # [B, O]
        return torch.where(late[..., None], self.value, logits)


@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=["nan", "+inf"])
@pytest.mark.parametrize("broken_level", [2])  # a draft's: tests/test_broken_draft.py
def test_broken_logits_stop_the_run_naming_the_level(value: float, broken_level: int) -> None:
    runners = _runners([2, 2])
    runners[broken_level] = _BrokenRunner(runners[broken_level].model, value, after=6)
    with pytest.raises(FloatingPointError, match=f"level {broken_level} produced NaN or \\+inf"):
        run_hsd(runners, [torch.tensor([0, 1])] * 3, block_sizes=[2, 2], max_new_tokens=12, seeds=1)


def test_minus_inf_logits_are_excluded_tokens_not_an_error() -> None:
    runners = _runners([2])
    runners[0] = _BrokenRunner(runners[0].model, -float("inf"), after=100)  # never: a control
    family = table_family(5, 2, 2, spread=2.0, seed=4)
    masked = family[-1].logits.clone()
    masked[:, 3] = -float("inf")  # token 3 excluded everywhere (as top-k would)
    runners[1] = TableRunner(TableModel(masked, order=2))
    out = run_hsd(runners, [torch.tensor([0, 1])] * 20, block_sizes=[2], max_new_tokens=10, seeds=2)
    assert all(3 not in s[2:].tolist() for s in out.sequences)
