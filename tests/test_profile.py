"""The profiler's arithmetic (fake clock), acceptance rates, and select_hierarchy end to end."""

import pytest
import torch
from hf_models import layer_dropped_copy, noisy_copy, tiny_model

import hsd_fast
from hsd_fast.profile import acceptance, forward_costs

pytestmark = pytest.mark.hf


class FakeClock:
    """Each timed forward over n tokens 'takes' 2 ms + 1 ms * n; warm-up calls take 1 s."""

    def __init__(self, spans, warmup, repeats) -> None:
        durations = []
        for n in spans:
            durations += [1.0] * warmup + [0.002 + 0.001 * n] * repeats
        self.ticks, now = [], 0.0
        for d in durations:
            self.ticks += [now, now + d]
            now += d + 5.0  # time between measurements is never counted
        self.ticks.reverse()

    def __call__(self) -> float:
        return self.ticks.pop()


def test_forward_costs_arithmetic_with_a_fake_clock() -> None:
    spans = (1, 2, 4, 8)
    clock = FakeClock(spans, warmup=2, repeats=3)
    profile = forward_costs(tiny_model("llama"), spans=spans, context=16, repeats=3, warmup=2, clock=clock)
    assert profile.seconds == pytest.approx([0.003, 0.004, 0.006, 0.010])
    assert profile.fit.fixed == pytest.approx(0.002) and profile.fit.per_token == pytest.approx(0.001)
    assert profile(16) == pytest.approx(0.018)
    assert not clock.ticks  # every reading was used: no forward went untimed


def test_acceptance_is_one_against_itself_and_symmetric() -> None:
    target = tiny_model("llama", lm_head_scale=2.0)
    models = [noisy_copy(target, 0.3, seed=1), target, target]
    ids = torch.randint(3, 96, (4, 24), generator=torch.Generator().manual_seed(0))
    for greedy in (False, True):
        alpha = acceptance(models, ids, greedy=greedy, progress=False)
        assert alpha[1][2] == pytest.approx(1.0) and alpha[0][0] == 1.0
        assert alpha[0][1] == alpha[1][0] and 0.0 < alpha[0][1] < 1.0
        assert alpha[0][1] == pytest.approx(alpha[0][2])


def test_select_hierarchy_end_to_end() -> None:
    target = tiny_model("llama", layers=6)
    candidates = [layer_dropped_copy(target, 1), layer_dropped_copy(target, 3)]
    prompts = torch.randint(3, 96, (2, 16), generator=torch.Generator().manual_seed(1))
    pick = hsd_fast.select_hierarchy(target, candidates, prompts, measure=True, max_new_tokens=16)
    assert pick.chain[-1] == 2 and len(pick.T) == len(pick.drafts) == len(pick.chain) - 1
    assert pick.speedup_over_ar >= 1.0 and pick.measured_latency > 0
    expected = target.generate(prompts[:1], do_sample=False, max_new_tokens=16)
    out = target.generate(prompts[:1], custom_generate=hsd_fast.generate, hierarchy=pick, max_new_tokens=16)
    assert out.tolist() == expected.tolist()
    assert (
        hsd_fast.wrap(target, hierarchy=pick).generate(prompts[:1], max_new_tokens=16).tolist()
        == expected.tolist()
    )
