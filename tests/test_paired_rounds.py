"""Level 0's draft and level 1's verification launched back to back, read once
(``round_steps.draft_and_verify``; docs/design.md, "Draft and verification without a host sync"):
taken wherever the chain allows it, the same tokens and counters as steps read one at a time (keyed
randomness: sampled runs too, token for token), and a verification fed past a draft that stopped
early is caught by the ledger's replay. The target's distribution with pairs on is the subject of
every chi-square in test_engine.py (pairs are the default)."""

from collections.abc import Callable

import numpy as np
import pytest
import torch
from hf_models import derived_drafts, tiny_model

import hsd_fast
from hsd_fast import round_steps
from hsd_fast.engine import run_hsd
from hsd_fast.switching_types import Adaptive, Choice, Observation
from hsd_fast.testing.tables import TableRunner, table_family

ROWS, STEPS, VOCAB = 400, 9, 4


@pytest.fixture
def pairs_taken(monkeypatch) -> list[int]:
    """Counts the rows of every paired round (``draft_and_verify``'s calls)."""
    taken: list[int] = []
    paired = round_steps.draft_and_verify

    def counting(chain, rows, *args):
        taken.append(len(rows))
        return paired(chain, rows, *args)

    monkeypatch.setattr(round_steps, "draft_and_verify", counting)
    return taken


def _run(block_sizes: list[int], paired: bool, lookup: bool = False, **kwargs):
    """``len(block_sizes)`` levels under the target (the lowest a lookup level with ``lookup``) over
    ``ROWS`` rows of every budget, paired or not; with ``adapt=`` the policy sets the block sizes."""
    family = table_family(VOCAB, 2, len(block_sizes) + 1 - lookup, spread=2.0, seed=4)
    runners = [TableRunner(m) for m in family]
    if lookup:
        runners.insert(0, hsd_fast.LookupDraft(max_ngram=2))
    prompts = [torch.tensor([r % VOCAB, (r // VOCAB) % VOCAB, 1]) for r in range(ROWS)]
    budgets = np.arange(ROWS) % STEPS + 1  # rows end at every point of a block
    round_steps.PAIRED_ROUNDS = paired
    try:
        fixed = {} if "adapt" in kwargs else {"block_sizes": block_sizes}  # adaptive: the policy's
        return run_hsd(
            runners, prompts, max_new_tokens=budgets, eos_token_id=0, seeds=7, **fixed, **kwargs
        )  # fmt: skip
    finally:
        round_steps.PAIRED_ROUNDS = True


@pytest.mark.parametrize(
    ("block_sizes", "lookup", "greedy"),
    [
        ([3], False, False),
        ([2, 3], False, False),
        ([2, 3], False, True),
        ([1, 2, 2], False, False),
        ([2, 2], True, False),
    ],
    ids=["T=[3]", "T=[2, 3]", "T=[2, 3] greedy", "T=[1, 2, 2]", "lookup, T=[2, 2]"],
)
def test_paired_rounds_change_nothing_but_the_host_reads(
    pairs_taken: list[int], block_sizes: list[int], lookup: bool, greedy: bool
) -> None:
    """Rows of every budget, EOS id 0 (drafts stop mid-block), sampled at temperature 1 or greedy:
    the same sequences and the same counters per level with pairs as without."""
    paired = _run(block_sizes, True, lookup, greedy=greedy)
    assert pairs_taken == [] if lookup else len(pairs_taken) > 0  # a lookup level 0 proposes on the host
    taken = len(pairs_taken)
    single = _run(block_sizes, False, lookup, greedy=greedy)
    assert len(pairs_taken) == taken, "PAIRED_ROUNDS=False still paired"
    assert [s.tolist() for s in paired.sequences] == [s.tolist() for s in single.sequences]
    for counter in ("forwards", "row_forwards", "fed_tokens", "drafted", "accepted", "bonus", "corrections"):
        assert getattr(paired.stats, counter) == getattr(single.stats, counter), counter
    ended_early = [len(s) - 3 < b for s, b in zip(paired.sequences, np.arange(ROWS) % STEPS + 1, strict=True)]
    assert any(ended_early), "no row met an EOS: the test would not see a draft stopped early"


def test_a_verification_fed_past_a_stopped_draft_is_caught(monkeypatch) -> None:
    """Planted bug: the device moves every row's end past a full block, as if no draft stopped at an
    EOS or the length budget; the ledger's replay refuses the round."""

    verify_spans = round_steps.verify_spans

    def full_block(before: torch.Tensor, drawn: torch.Tensor) -> torch.Tensor:
        return verify_spans(before, torch.full_like(drawn, int(drawn.max())))

    monkeypatch.setattr(round_steps, "verify_spans", full_block)
    with pytest.raises(RuntimeError, match="internal error: level 1 verified spans"):
        _run([3], True)


def test_adaptive_runs_pair_and_switch_as_steps_read_one_at_a_time(pairs_taken: list[int]) -> None:
    """An adaptive run (a policy cycling through hierarchies with and without a pair to take, and no
    draft) pairs wherever its current chain allows, switches at the same rounds and gives the same
    sequences and counters as with every step read first; its observations time both steps of a
    pair."""
    order = [Choice((0,), (2,)), Choice((0, 1), (1, 2)), Choice((), ()), Choice((1,), (3,))]
    seen_seconds: list[list[int]] = []

    def cycle() -> Callable[[Observation], Choice]:  # one per run: a policy's second run is keyed apart
        def policy(seen: Observation) -> Choice:
            seen_seconds.append([len(s) for s in seen.step_seconds])
            return order[seen.round % len(order)]

        return policy

    paired = _run([2, 2], True, adapt=Adaptive(cycle(), max_T=3))
    taken = len(pairs_taken)
    single = _run([2, 2], False, adapt=Adaptive(cycle(), max_T=3))
    assert taken > 0 and len(pairs_taken) == taken
    assert [s.tolist() for s in paired.sequences] == [s.tolist() for s in single.sequences]
    assert [h.choice for h in paired.stats.hierarchies] == [h.choice for h in single.stats.hierarchies]
    for counter in ("forwards", "row_forwards", "fed_tokens", "drafted", "accepted", "bonus", "corrections"):
        assert getattr(paired.stats, counter) == getattr(single.stats, counter), counter
    half = len(seen_seconds) // 2  # the paired run's looks, then the other's
    assert seen_seconds[:half] == seen_seconds[half:]  # as many timed steps per level at every look


def test_a_gpu_pair_divides_its_seconds_by_the_device_times(monkeypatch) -> None:
    """On a GPU the launches return at once: the events recorded around them (faked here: the draft
    1 ms, the verification 3 ms on the device) divide the pair's seconds; on a CPU the host clock."""
    device_ms = iter([0.0, 1.0, 4.0])  # when each event completes

    class Event:
        def __init__(self, enable_timing: bool) -> None:
            assert enable_timing

        def record(self) -> None:
            self.at = next(device_ms)

        def elapsed_time(self, later: "Event") -> float:
            return later.at - self.at

    monkeypatch.setattr(torch.cuda, "Event", Event)
    clock = round_steps._DeviceClock(torch.device("cuda"))
    clock.mark(), clock.mark()
    assert clock.first_share(0.008, host_first=0.0001) == pytest.approx(0.002)
    cpu = round_steps._DeviceClock(torch.device("cpu"))
    cpu.mark(), cpu.mark()
    assert cpu.first_share(0.008, host_first=0.003) == 0.003


def test_rounds_where_rows_want_other_levels_are_not_paired(pairs_taken: list[int]) -> None:
    """Three levels with T_0 = 1: rows drift apart (some want level 2 while others draft), and a pair
    is launched only when every waiting row wants level 0, so the schedule stays the ledger's own:
    some of level 0's steps run paired, some alone."""
    for policy in ("most_rows", "highest_level"):
        pairs_taken.clear()
        result = _run([1, 2], True, policy=policy)
        assert 0 < len(pairs_taken) < result.stats.forwards[0], policy


@pytest.mark.hf
@pytest.mark.slow
def test_compiled_pairs_equal_the_targets_greedy_output(pairs_taken: list[int]) -> None:
    """The same steps compiled (CPU: no CUDA graphs), a left-padded batch: paired and one at a time
    both give the target's own greedy tokens."""
    target = tiny_model("llama", layers=2)
    drafts = derived_drafts(target, 1)
    ids = torch.tensor([[0, 0, 5, 9, 11, 40], [8, 9, 10, 11, 12, 13]])
    mask = (ids != 0).long()
    kwargs = {"attention_mask": mask, "do_sample": False, "max_new_tokens": 24, "eos_token_id": None}
    expected = target.generate(ids, **kwargs)
    for paired in (True, False):
        round_steps.PAIRED_ROUNDS = paired
        try:
            out = target.generate(
                ids, custom_generate=hsd_fast.generate, drafts=drafts, T=[3], compile=True, **kwargs
            )
        finally:
            round_steps.PAIRED_ROUNDS = True
        assert out.tolist() == expected.tolist(), paired
    assert pairs_taken, "no round was paired"
