"""Reuse or recompute, per exit: the selector offers every early exit whose verifier may start from its
hidden states twice, as it is and as its recomputing twin (``EarlyExit(target, k, reuse=False)``), and
keeps the cheaper (``hierarchy.with_recomputing_exits``). On an eager CPU the exit's catch-up forward
costs more than the layers it saves; compiled, it saves.

What is checked: the twins' costs, acceptance and verifiers (a twin of a deeper exit still verifies a
shallower exit from its hidden states); the selector picks the twin exactly when recomputing is
predicted cheaper, and the pick binds the twin model (that it runs exactly, recomputing, is
test_exit_reuse.py's); an adaptive run started from such a pick takes the user's exit for it, and its
controller prices every verification in full; ``select_hierarchy`` offers the twins, its pick exact.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from exit_levels import affine_cost, deep_model, hsd, prompts

from hsd_fast.controller import LatencyController
from hsd_fast.early_exit import EarlyExit, recomputing_variant
from hsd_fast.hierarchy import select_hierarchy, with_recomputing_exits
from hsd_fast.hierarchy_types import Hierarchy, Profile
from hsd_fast.latency import LookupCost, expected_latency
from hsd_fast.lookup import LookupDraft
from hsd_fast.profile import ProfileCache
from hsd_fast.profile.costs import CostProfile
from hsd_fast.selector import select


@pytest.fixture(scope="module")
def deep() -> torch.nn.Module:
    return deep_model()


def _profile(deep, verify_after_exit3: CostProfile):
    """Candidates lookup, exit 1, exit 3 and the target, the exits reusing: exit 3's verification
    by the target costs ``verify_after_exit3``; exit 1 is verified from its hidden states by exit 3
    (cheaply) and by the target."""
    lookup_cost = LookupCost(0.0002, (0.5, 0.5))  # not an exit: never twinned
    target = affine_cost(0.010, 0.001)
    exit3 = replace(affine_cost(0.005, 0.0005), reused_by=((target, verify_after_exit3),))
    verifiers = ((target, affine_cost(0.009, 0.0009)), (exit3, affine_cost(0.003, 0.0003)))
    exit1 = replace(affine_cost(0.002, 0.0002), reused_by=verifiers)
    costs = [lookup_cost, exit1, exit3, target]
    alpha = [[1, 0.3, 0.3, 0.3], [0.3, 1, 0.6, 0.5], [0.3, 0.6, 1, 0.8], [0.3, 0.5, 0.8, 1]]
    everything = [LookupDraft(), EarlyExit(deep, 1), EarlyExit(deep, 3), deep]
    return costs, alpha, everything


def test_twins_cost_accept_and_verify_as_their_exits(deep) -> None:
    twin = EarlyExit(deep, 2, reuse=False)  # one object per (target, k, reuse): its compiled steps kept
    assert recomputing_variant(EarlyExit(deep, 2)) is twin and recomputing_variant(twin) is None
    assert recomputing_variant(deep) is None and recomputing_variant("lookup") is None
    costs, alpha, everything = _profile(deep, affine_cost(0.006, 0.0006))
    out_costs, out_alpha, out_levels = with_recomputing_exits(costs, alpha, everything)
    # the twins, deeper exit's first, just before the target
    assert out_levels[:3] == everything[:3] and out_levels[-1] is deep
    assert out_levels[3:5] == [EarlyExit(deep, 3, reuse=False), EarlyExit(deep, 1, reuse=False)]
    twin3, twin1 = out_costs[3], out_costs[4]
    assert twin3.reused_by == () and twin1.reused_by == ()
    assert twin3.seconds == costs[2].seconds and twin1.drafts == costs[1].drafts
    # exit 1's verifiers: the target, exit 3 and exit 3's twin (which reuses what is below it), each by
    # the object the recursion will meet
    assert [upper for upper, _ in out_costs[1].reused_by] == [out_costs[5], out_costs[2], twin3]
    assert out_costs[1].reused_by[2][1] is costs[1].reused_by[1][1]
    # acceptance copied from the exit, none between an exit and its twin
    assert (
        out_alpha[3][5] == alpha[2][3] and out_alpha[4][2] == alpha[1][2] and out_alpha[3][4] == alpha[2][1]
    )
    assert out_alpha[2][3] == out_alpha[3][2] == 0.0 and out_alpha[1][4] == 0.0
    assert all(out_alpha[i][j] == out_alpha[j][i] for i in range(6) for j in range(6))
    # nothing to twin: no reuse listed (an exit that cannot reuse), or the twin already a candidate
    plain = [replace(c, reused_by=()) if i in (1, 2) else c for i, c in enumerate(costs)]
    assert with_recomputing_exits(plain, alpha, everything)[2] == everything
    offered = [*everything[:3], EarlyExit(deep, 3, reuse=False), deep]
    more_costs = [*costs[:3], replace(costs[2], reused_by=()), costs[3]]
    more_alpha = [[1.0] * 5 for _ in range(5)]
    assert with_recomputing_exits(more_costs, more_alpha, offered)[2][4:6] == [
        EarlyExit(deep, 1, reuse=False),
        deep,
    ]


@pytest.mark.parametrize("reused_seconds, picks_twin", [(0.006, False), (0.016, True)])
def test_the_selector_keeps_whichever_verification_is_cheaper(deep, reused_seconds, picks_twin) -> None:
    """Exit 3 alone under the target: verifying from its hidden states costs 0.006 s + (cheaper than
    the target's 0.010 s), or 0.016 s (dearer: the catch-up forward more than the layers saved)."""
    costs, alpha, everything = _profile(deep, affine_cost(reused_seconds, 0.001))
    costs, alpha = [costs[2], costs[3]], [[1, 0.8], [0.8, 1]]
    out_costs, out_alpha, levels = with_recomputing_exits(costs, alpha, [everything[2], deep])
    pick = select(out_costs, out_alpha, max_T=6)
    assert levels[pick.chain[0]] is (EarlyExit(deep, 3, reuse=False) if picks_twin else EarlyExit(deep, 3))
    full = expected_latency([replace(costs[0], reused_by=()), costs[1]], [0.8], list(pick.T))
    assert (pick.predicted_latency == pytest.approx(full)) == picks_twin
    bound = Hierarchy.bind(pick, levels)
    assert bound.drafts == (levels[pick.chain[0]],)


@pytest.mark.hf
def test_an_adaptive_run_from_a_twin_pick_takes_the_users_exit(deep) -> None:
    """``adapt=True`` with ``drafts=[EarlyExit(t, 2)]`` and a pick that chose its twin: the run starts
    from the user's exit (an adaptive run recomputes either way), output exact; the controller built
    from the profile prices every verification in full."""
    exit2 = EarlyExit(deep, 2)
    costs, alpha, _ = _profile(deep, affine_cost(0.016, 0.001))
    costs, alpha = [costs[2], costs[3]], [[1, 0.8], [0.8, 1]]
    costs, alpha, levels = with_recomputing_exits(costs, alpha, [exit2, deep])
    pick = select(costs, alpha, max_T=4)
    bound = Hierarchy.bind(pick, levels)
    assert bound.drafts == (EarlyExit(deep, 2, reuse=False),)
    bound = replace(bound, profile=Profile(tuple(levels), tuple(costs), tuple(tuple(r) for r in alpha)))
    controller = LatencyController.from_hierarchy(bound, [exit2])
    assert all(getattr(c, "reused_by", ()) == () for c in controller.estimates.prior_costs)
    ids = prompts(deep, 1)[0]
    expected = deep.generate(ids, do_sample=False, max_new_tokens=24)
    out = hsd(deep, ids, drafts=[exit2], hierarchy=bound, adapt=True)
    assert torch.equal(out, expected)


@pytest.mark.hf
def test_select_hierarchy_offers_the_recomputing_twin(deep) -> None:
    """Profiled for real: the profile lists the exit and its twin (the twin's costs the exit's without
    reuse), whichever the pick is it binds a model that runs exactly."""
    exit2 = EarlyExit(deep, 2)
    ids = torch.cat(prompts(deep, 2))
    pick = select_hierarchy(
        deep, [exit2], ids, cache=ProfileCache(None), max_T=3, max_new_tokens=12, progress=False, min_gain=0
    )
    twin = EarlyExit(deep, 2, reuse=False)
    assert list(pick.profile.candidates) == [exit2, twin, deep]
    exit_cost, twin_cost, _ = pick.profile.costs
    assert exit_cost.reused_by and twin_cost.reused_by == () and twin_cost.seconds == exit_cost.seconds
    assert pick.profile.alpha[1][2] == pick.profile.alpha[0][2] and pick.profile.alpha[0][1] == 0.0
    assert set(pick.drafts) <= {exit2, twin}
    expected = deep.generate(ids[:1], do_sample=False, max_new_tokens=24)
    assert torch.equal(hsd(deep, ids[:1], hierarchy=pick), expected)
