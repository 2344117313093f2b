"""Pricing an early exit's verifier as it runs: from the exit's hidden states (``exit_reuse``), the
level above an exit runs only its layers >= k plus the exit's one-token catch-up, and the latency
model and selector must use that cost, not a full verification's.

What is checked: ``reuse_costs`` times the path the engine takes (the verifier's first layers never
run in its steps: every token through layer 0 went through the exit's forwards, but for the
verifier's one-token cache probe); ``ProfileCache.with_exit_reuse`` attaches such a cost to each exit
for exactly the levels that verify it from hidden states (its target, timed; a deeper exit, derived;
none for an exit made with ``reuse=False``, none from another model) and reuses cached entries;
``latency.verifying_costs`` swaps it in by identity, so the recursion and the selector's pick follow
it; an adaptive controller drops it (an adaptive run recomputes).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from exit_levels import affine_cost, counted, deep_model
from hf_models import tiny_model

from hsd_fast.early_exit import EarlyExit
from hsd_fast.exit_reuse import refusal
from hsd_fast.latency import expected_latency, verifying_costs
from hsd_fast.profile import ProfileCache
from hsd_fast.profile.costs import crowd_bytes, reuse_costs
from hsd_fast.run_estimates import _without_reuse
from hsd_fast.selector import select

SPANS = (1, 2, 4)


# ----------------------------------------------------------------------------- the latency model


def test_verifying_costs_swap_in_the_reuse_cost_by_identity() -> None:
    target, reused = affine_cost(0.010, 0.001), affine_cost(0.004, 0.0007)
    exit_cost = replace(affine_cost(0.003, 0.0005), reused_by=((target, reused),))
    other = affine_cost(0.001, 0.0002)
    assert verifying_costs([exit_cost, target]) == [exit_cost, reused]
    assert verifying_costs([other, exit_cost, target])[1:] == [exit_cost, reused]
    assert verifying_costs([other, target]) == [other, target]  # not an exit: its verifier's own cost
    twin = replace(target)  # equal, but not the level the exit listed
    assert verifying_costs([exit_cost, twin])[1] is twin
    expected = expected_latency([exit_cost, reused], [0.85], [4])
    assert expected_latency([exit_cost, target], [0.85], [4]) == pytest.approx(expected)
    assert expected < expected_latency([_without_reuse(exit_cost), target], [0.85], [4])


def test_the_selector_picks_by_the_reuse_cost() -> None:
    """A draft D, an exit E of the target t: verifying from E's hidden states makes E worth a level
    between D and t, which at the full verification cost it is not."""
    draft, exit_cost = affine_cost(0.001, 0.0002), affine_cost(0.003, 0.0005)
    target = affine_cost(0.010, 0.001)
    reused = affine_cost(0.0045, 0.0007)
    alpha = [[1, 0.6, 0.75], [0.6, 1, 0.85], [0.75, 0.85, 1]]
    plain = select([draft, exit_cost, target], alpha)
    assert plain.chain == (0, 2)
    pick = select([draft, replace(exit_cost, reused_by=((target, reused),)), target], alpha)
    assert pick.chain == (0, 1, 2) and pick.predicted_latency < plain.predicted_latency
    by_hand = expected_latency([draft, exit_cost, reused], [0.6, 0.85], list(pick.T))
    assert pick.predicted_latency == pytest.approx(by_hand)


# ----------------------------------------------------------------------------- measuring it


@pytest.fixture(scope="module")
def deep() -> torch.nn.Module:
    return deep_model()


@pytest.mark.hf
def test_reuse_costs_time_the_verification_from_hidden_states(deep) -> None:
    exit_level = EarlyExit(deep, 2)
    assert refusal(exit_level, deep) is None  # decided (and its probe run) before counting
    with counted(deep.model.layers[0], exit_level) as counts:
        profile = reuse_costs(deep, exit_level, spans=SPANS, context=8, repeats=2, warmup=1)
    assert profile.spans == SPANS and len(profile.seconds) == 3 and profile.drafts == ()
    assert all(s > 0 for s in profile.seconds)
    assert counts["exit"] > 0 and counts["layer"] == counts["exit"] + 1  # + the verifier's probe
    with pytest.raises(ValueError, match="cannot verify"):
        reuse_costs(deep, EarlyExit(deep, 2, reuse=False), spans=SPANS, context=8, repeats=1, warmup=0)


def _bytes(*modules: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for m in modules for p in m.parameters())


@pytest.mark.hf
def test_levels_crowd_each_other_by_the_weights_they_do_not_share(deep) -> None:
    """An exit reads its target's own tensors: between two of the target's steps an exit's step
    reads nothing the target does not, and between two of an exit's steps the target's reads only
    its layers past the exit. A separate draft crowds both with all of its weights."""
    exit2, exit3 = EarlyExit(deep, 2), EarlyExit(deep, 3)
    past = [_bytes(*deep.model.layers[k:]) for k in (2, 3)]  # the target's layers past each exit
    assert crowd_bytes([exit2, deep]) == [past[0], 0]
    assert crowd_bytes([exit2, exit3, deep]) == [past[0], past[1], 0]
    other = tiny_model("llama", layers=1)
    assert crowd_bytes([other, exit2, deep]) == [_bytes(deep), _bytes(other) + past[0], _bytes(other)]


@pytest.mark.hf
def test_with_exit_reuse_attaches_each_exits_verifiers(deep) -> None:
    shallow, middle, recomputing = EarlyExit(deep, 1), EarlyExit(deep, 3), EarlyExit(deep, 2, reuse=False)
    other = tiny_model("llama", layers=1)  # a draft of its own: its weights crowd every other level
    models = [other, shallow, recomputing, middle, deep]
    cache = ProfileCache(None)
    timing = {"context": 8, "spans": SPANS, "drafts": (1,), "repeats": 2, "warmup": 1}
    crowds = crowd_bytes(models)
    costs = [cache.costs(m, crowd_bytes=crowd, **timing) for m, crowd in zip(models, crowds, strict=True)]
    out = cache.with_exit_reuse(models, costs, crowds, **{k: v for k, v in timing.items() if k != "drafts"})
    # exit 1 is verified from its hidden states by every deeper level (a recomputing exit too: reuse=False
    # keeps its own hidden states from the level above it); the recomputing exit by none, the other
    # draft by none
    assert [len(c.reused_by) for c in out] == [0, 3, 0, 1, 0]
    assert out[4] is costs[4] and out[2] is costs[2] and out[0] is costs[0]
    ((upper, reused),) = out[3].reused_by
    assert upper is out[4] and reused.spans == SPANS and reused.crowded is not None  # timed crowded
    (target, timed), *by_exits = out[1].reused_by
    assert target is out[4] and [u for u, _ in by_exits] == [out[2], out[3]]
    # a deeper exit's verification: the target's minus the layers that exit lacks
    for (_, derived), lacking in zip(by_exits, (costs[2], costs[3]), strict=True):
        less = [t - (costs[4](n) - lacking(n)) for n, t in zip(SPANS, timed.seconds, strict=True)]
        assert derived.seconds == pytest.approx([max(0.0, x) for x in less])
        assert derived.crowded is not None
    entries = len(cache.entries)
    again = cache.with_exit_reuse(models, costs, crowds, **{k: v for k, v in timing.items() if k != "drafts"})
    assert len(cache.entries) == entries  # cached: nothing timed again
    assert [r.seconds for _, r in again[0].reused_by] == [r.seconds for _, r in out[0].reused_by]
    assert _without_reuse(out[0]).reused_by == ()
