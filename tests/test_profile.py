"""The profiler's arithmetic (fake clock), acceptance rates, and select_hierarchy end to end."""

import copy
import json

import pytest
import torch
from hf_models import layer_dropped_copy, noisy_copy, tiny_model

import hsd_fast
from hsd_fast.processors import LogitsTransform, generation_sampling
from hsd_fast.profile import ProfileCache, acceptance, forward_costs, measured_latency, model_identity

pytestmark = pytest.mark.hf


class FakeClock:
    """Time that only the model's forwards advance: the k-th forward takes ``durations[k]``. The
    profiler may read the clock as often as it likes; only the forwards inside a reading pair count."""

    def __init__(self, durations: list[float]) -> None:
        self.now, self.durations, self.forwards = 0.0, durations, 0

    def __call__(self) -> float:
        return self.now

    def forward_hook(self, module, args) -> None:  # a forward pre-hook on the model
        self.now += self.durations[self.forwards]
        self.forwards += 1


def test_forward_costs_arithmetic_with_a_fake_clock() -> None:
    """A forward over n tokens 'takes' 2 ms + 1 ms * n, the prefill 100 s and every warm-up 1 s: a
    median holding the prefill, a warm-up or two forwards would be off by a second or more. A draft
    step of k tokens makes k forwards (one over its fed token, k - 1 over the token drawn last)."""
    spans, drafts, warmup, repeats = (1, 2, 4, 8), (1, 2, 4), 3, 3  # as many warm-ups as repeats
    durations = [100.0]  # the prefill of the context
    for n in spans:
        durations += [1.0] * warmup + [0.002 + 0.001 * n] * repeats
    for k in drafts:
        durations += [1.0 / k] * k * warmup + [0.003] * k * repeats
    clock = FakeClock(durations)
    model = tiny_model("llama")
    model.register_forward_pre_hook(clock.forward_hook)
    profile = forward_costs(
        model, spans=spans, drafts=drafts, context=16, repeats=repeats, warmup=warmup, clock=clock
    )
    assert profile.seconds == pytest.approx([0.003, 0.004, 0.006, 0.010])
    assert profile.fit.fixed == pytest.approx(0.002) and profile.fit.per_token == pytest.approx(0.001)
    assert profile(16) == pytest.approx(0.018)
    assert profile.draft_seconds == pytest.approx([0.003, 0.006, 0.012])
    assert profile.draft(8) == pytest.approx(0.024) and profile.decode() == pytest.approx(0.003)
    assert clock.forwards == len(durations)  # one forward per measurement, none extra


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


def test_model_identity_follows_the_weights() -> None:
    model = tiny_model("llama")
    assert model_identity(model) == model_identity(copy.deepcopy(model))
    assert model_identity(model) != model_identity(noisy_copy(model, 1e-3, seed=0))
    assert model_identity(model) != model_identity(copy.deepcopy(model).half())


def test_profile_cache_reuses_measurements(tmp_path, monkeypatch) -> None:
    import hsd_fast.profile.cache as profile  # where ProfileCache looks the measurements up

    target = tiny_model("llama")
    draft = layer_dropped_copy(target, 1)
    ids = torch.randint(3, 96, (2, 12), generator=torch.Generator().manual_seed(0))
    calls = {"costs": 0, "alpha": 0}
    real_costs, real_alpha = profile.forward_costs, profile.acceptance

    def counting_costs(*args, **kwargs):
        calls["costs"] += 1
        return real_costs(*args, repeats=1, warmup=0, **kwargs)

    def counting_alpha(*args, **kwargs):
        calls["alpha"] += 1
        return real_alpha(*args, **kwargs)

    monkeypatch.setattr(profile, "forward_costs", counting_costs)
    monkeypatch.setattr(profile, "acceptance", counting_alpha)
    path = tmp_path / "profiles.json"
    cache = ProfileCache(path)
    first = [cache.costs(m, 12) for m in (draft, target)]
    identity = LogitsTransform()
    greedy = cache.acceptance([draft, target], ids, identity, greedy=True, progress=False)
    cache.save()
    assert calls == {"costs": 2, "alpha": 1}

    reread = ProfileCache(tmp_path / "other.json", fallbacks=[path])  # a committed profile as fallback
    assert [reread.costs(m, 12).seconds for m in (draft, target)] == [p.seconds for p in first]
    assert reread.acceptance([target, draft], ids, identity, greedy=True, progress=False) == [
        row[::-1] for row in greedy[::-1]
    ]
    assert calls == {"costs": 2, "alpha": 1}  # nothing re-measured
    reread.costs(target, 24)  # another context length: a new measurement
    transform, is_greedy = generation_sampling(target, do_sample=True, temperature=0.5)
    assert not is_greedy
    reread.acceptance([draft, target], ids, transform, is_greedy, progress=False)  # other sampling too
    assert calls == {"costs": 3, "alpha": 2}
    reread.save()
    entries = [json.loads(p.read_text())["entries"] for p in (path, tmp_path / "other.json")]
    assert len(entries[1]) == len(entries[0]) + 2  # only the two new measurements were added


def test_generation_sampling_captures_hf_default_top_k() -> None:
    """Profiles are measured under what ``generate`` applies: HF adds top_k=50 when sampling unless
    told otherwise, and a temperature alone becomes the transform's fast path."""
    target = tiny_model("llama")
    transform, greedy = generation_sampling(target, do_sample=True, temperature=0.5)
    assert not greedy and transform.temperature == 1.0  # not the fast path: top-k rides along
    assert [type(p).__name__ for p in transform.processors] == ["TemperatureLogitsWarper", "TopKLogitsWarper"]
    assert transform.processors[1].top_k == 50
    alone, _ = generation_sampling(target, do_sample=True, temperature=0.5, top_k=0)
    assert alone.temperature == 0.5 and not alone.processors
    assert generation_sampling(target, do_sample=False)[1]


def test_measured_latency_excludes_the_prefill_with_a_fake_clock() -> None:
    target = tiny_model("llama")
    prompts = torch.randint(3, 96, (2, 8), generator=torch.Generator().manual_seed(0))
    # readings: warm-up (0, 5), then per row: long run 10 s, one-token run 2 s
    ticks = iter([0.0, 5.0, 0.0, 10.0, 0.0, 2.0, 0.0, 10.0, 0.0, 2.0])
    seconds = measured_latency(target, None, prompts, max_new_tokens=5, clock=lambda: next(ticks))
    assert seconds == pytest.approx((8.0 + 8.0) / (2 * 4))
