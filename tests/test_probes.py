"""Probes of idle candidates in an adaptive run (docs/design.md, "Probes"): what a probe counts is
the candidate's argmax agreement with the generated tokens (checked against a teacher-forced
forward of the whole output), and with a lookup level its scores on the lookup's proposals, the
output stays the target's, and a probed candidate joins with its cache current."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hf_models import derived_drafts, tiny_model

import hsd_fast
from hsd_fast import proposal_scores as scores
from hsd_fast.hierarchy_types import DEFAULT_MAX_T
from hsd_fast.lookup import LookupDraft
from hsd_fast.switching_types import Choice, Observation

pytestmark = pytest.mark.hf


class ProbeEveryLook:
    """Decodes ``schedule[round]`` (the last entry after it) and probes ``probed`` at every look,
    keeping what each look saw."""

    def __init__(self, schedule: list[Choice], probed: list[int]) -> None:
        self.schedule, self.probed = schedule, probed
        self.seen: list[Observation] = []
        self.probed_to: list[np.ndarray] = []  # per look: [B] where its probes ended (0: row finished)

    def __call__(self, seen: Observation) -> Choice:
        self.seen.append(seen)
        return self.schedule[min(seen.round, len(self.schedule) - 1)]

    def wants_probes(self, seen: Observation) -> list[int]:
        self.probed_to.append(np.where(seen.finished, 0, seen.committed - 1))
        return self.probed


@pytest.fixture(scope="module")
def family() -> tuple[torch.nn.Module, list[torch.nn.Module]]:
    target = tiny_model("llama")
    return target, derived_drafts(target, 2)


def test_a_probe_counts_where_the_candidates_argmax_is_the_generated_token(family) -> None:
    target, drafts = family
    ids = torch.randint(3, target.config.vocab_size, (2, 6), generator=torch.Generator().manual_seed(2))
    policy = ProbeEveryLook([Choice((0,), (3,))], probed=[1])  # drafts[0] decodes, drafts[1] is probed
    out = target.generate(
        ids, custom_generate=hsd_fast.generate, drafts=drafts, adapt=policy, do_sample=False,
        max_new_tokens=40, output_hsd_stats=True, compile=False,
    )  # fmt: skip
    assert out.sequences.tolist() == target.generate(ids, do_sample=False, max_new_tokens=40).tolist()
    probes = [p for s in policy.seen for p in s.probes]
    assert probes and all(p.candidate == 1 for p in probes)
    # the last look's probes are never shown: the earlier ones fed each row up to
    last_end = np.max(policy.probed_to[:-1], axis=0)  # [B]
    with torch.no_grad():
        logits = drafts[1](out.sequences).logits  # [B, L, V] teacher-forced over the whole output
    expected_agreed = expected_scored = 0
    for row in range(ids.shape[0]):
        positions = np.arange(ids.shape[1] - 1, last_end[row])  # next token generated, fed by a probe
        predicted = logits[row, positions].argmax(-1)
        expected_agreed += int((predicted == out.sequences[row, positions + 1]).sum())
        expected_scored += len(positions)
    assert sum(p.positions for p in probes) == expected_scored
    assert sum(p.agreed for p in probes) == expected_agreed
    assert 0 < expected_agreed < expected_scored  # a count that can be wrong either way
    assert out.hsd_stats.probe_seconds > 0


def test_a_probed_candidate_joins_with_its_cache_current(family) -> None:
    target, drafts = family
    ids = torch.randint(3, target.config.vocab_size, (1, 5), generator=torch.Generator().manual_seed(5))
    schedule = [Choice()] * 6 + [Choice((0,), (3,))]  # six rounds without drafts, then drafts[0] joins
    catch_up = {}
    for probed in ([], [0]):
        policy = ProbeEveryLook(schedule, probed)
        out = target.generate(
            ids, custom_generate=hsd_fast.generate, drafts=drafts, adapt=policy,
            do_sample=False, max_new_tokens=30, output_hsd_stats=True, compile=False,
        )  # fmt: skip
        joined = out.hsd_stats.hierarchies[1]
        assert joined.choice == Choice((0,), (3,))
        catch_up[bool(probed)] = joined.catch_up_tokens
    committed = [int(s.committed[0]) for s in policy.seen]  # at each look
    assert catch_up[False] == committed[6]  # the whole prefix: it never ran
    # probed at the look before: it lacks that look's last token and what the last round committed
    assert catch_up[True] == committed[6] - committed[5] + 1


def test_sampled_runs_and_the_lookup_level_are_not_probed(family) -> None:
    target, drafts = family
    ids = torch.randint(3, target.config.vocab_size, (1, 5), generator=torch.Generator().manual_seed(6))
    # lookup (0) and the active draft (1) are not probed
    policy = ProbeEveryLook([Choice((0, 1), (2, 2))], probed=[0, 1, 2])
    target.generate(
        ids, custom_generate=hsd_fast.generate, drafts=["lookup", *drafts], adapt=policy, do_sample=False,
        max_new_tokens=20, compile=False,
    )  # fmt: skip
    assert {p.candidate for s in policy.seen for p in s.probes} == {2}
    policy = ProbeEveryLook([Choice((0,), (2,))], probed=[1])
    target.generate(
        ids, custom_generate=hsd_fast.generate, drafts=drafts, adapt=policy, do_sample=True,
        max_new_tokens=20, compile=False,
    )  # fmt: skip
    assert not any(s.probes for s in policy.seen)  # argmax agreement is not the sampled acceptance


def test_with_a_lookup_level_a_probe_scores_the_candidate_on_its_proposals(family) -> None:
    """A probe in a run with a lookup level also scores the candidate as the level between the
    lookup and the target: the counts equal the profile's replay scoring (``proposal_scores``)
    applied to each probed stretch of the output with the candidate's teacher-forced argmax."""
    target, drafts = family
    ids = torch.tensor([[5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6], [3, 4, 3, 4, 3, 4, 3, 4, 3, 4, 3, 4]])
    max_T = DEFAULT_MAX_T  # an adaptive run's largest block size: the lookup is replayed at it
    policy = ProbeEveryLook([Choice((0,), (3,))], probed=[1])  # lookup > target; drafts[0] probed
    out = target.generate(
        ids, custom_generate=hsd_fast.generate, drafts=["lookup", *drafts], adapt=policy,
        do_sample=False, max_new_tokens=40, compile=False,
    )  # fmt: skip
    assert out.tolist() == target.generate(ids, do_sample=False, max_new_tokens=40).tolist()
    assert all(p.proposals is not None for s in policy.seen for p in s.probes if p.positions)
    with torch.no_grad():
        argmax = drafts[0](out).logits.argmax(-1)  # [B, L] teacher-forced over the whole output
    expected = np.zeros(2 * max_T + 6)  # passed, tried per position; kept, corrections, own
    found = np.zeros_like(expected)
    ends_before = np.zeros(ids.shape[0], dtype=np.int64)
    # the policy is asked for probes from the second look on (``probed_to[k]``: at look k + 1), and a
    # look shows the probes the look before it asked for
    for look, seen in enumerate(policy.seen[2:]):
        ends = policy.probed_to[look]  # [B] where they fed each row up to
        for probe in seen.probes:
            if probe.proposals is not None:
                p = probe.proposals
                found += np.concatenate([p.passed, p.tried, p.kept, p.corrections, p.own])
        for row in range(ids.shape[0]):
            first, last = max(int(ends_before[row]), ids.shape[1] - 1), int(ends[row]) - 1
            if first > last:
                continue
            text = out[row : row + 1, : last + 2]
            calls = scores.replay(LookupDraft(), text, max_T, start=first + 1)
            items = scores.scorable(calls, text)
            items = scores.Scorable(*(column[items.index <= last] for column in items))
            mine, committed = argmax[row, items.index].numpy(), text[0, items.index + 1].numpy()
            below, above = (mine == items.token) * 1.0, (committed == items.token) * 1.0
            expected += np.concatenate(
                [
                    *scores.counts_by_position(items, scores.accepted(items, below), max_T),
                    scores.kept_trials(items, below, above),
                    scores.correction_trials(items, below, mine, committed),
                    scores.own_trials(calls, *_choices_known(argmax[row], text, first, last)),
                ]
            )
        ends_before = np.where(ends > 0, ends, ends_before)
    assert found == pytest.approx(expected)
    passed, tried = expected[:max_T], expected[max_T : 2 * max_T]
    assert tried[0] > 0 and 0 < passed.sum() < tried.sum()  # counts that can be wrong either way
    assert expected[2 * max_T + 1] > 0  # the target scored on proposals the candidate kept
    assert expected[2 * max_T + 5] > 0  # and on the candidate's own tokens


def _choices_known(argmax: torch.Tensor, text: torch.Tensor, first: int, last: int) -> tuple[np.ndarray, ...]:
    """[1, L] each: the candidate's teacher-forced ``argmax`` ([L']) where the probe scored it
    (positions first..last) and the committed next tokens of ``text`` ([1, L]); -1 elsewhere."""
    mine = np.full(text.shape, -1)
    mine[0, first : last + 1] = argmax[first : last + 1].numpy()
    committed = np.append(text[0, 1:].numpy(), -1)[None]
    return mine, committed
