"""The profiler's arithmetic (fake clock), acceptance rates, select_hierarchy end to end, and
profiling on a busy machine: robust fits, interleaved repeats, noise reported.
Every timing here reads a fake clock; nothing depends on the real machine's speed."""

import copy
import functools
import json
import math
import random
import warnings

import pytest
import torch
from hf_models import layer_dropped_copy, noisy_copy, tiny_model

import hsd_fast
from hsd_fast import row_spread
from hsd_fast.batch_latency import select_for_batch
from hsd_fast.latency import AffineCost
from hsd_fast.processors import LogitsTransform, generation_sampling
from hsd_fast.profile import (
    ProfileCache,
    ProfileNoiseWarning,
    acceptance,
    forward_costs,
    measured_latency,
    model_identity,
)
from hsd_fast.profile.costs import EXTRA_SECONDS, MAX_REPEATS, NOISE_GOAL, interleaved_medians
from hsd_fast.profile.run_text import continued
from hsd_fast.row_spread import ProposalRows

pytestmark = pytest.mark.hf


class FakeClock:
    """Time that only the models' forwards advance: a forward over B rows of w fed columns of a
    model attached with ``scale`` takes ``scale * (fixed + per_column * w + per_token * B * w) *
    load(k)`` seconds, k counting the forwards of all models. The profiler may read the clock as
    often as it likes; only the forwards inside a reading pair count. Nothing here reads the real
    time."""

    def __init__(
        self, fixed: float = 0.002, per_column: float = 0.001, load=lambda k: 1.0, per_token: float = 0.0
    ) -> None:
        self.now, self.forwards = 0.0, 0
        self.fixed, self.per_column, self.per_token, self.load = fixed, per_column, per_token, load

    def __call__(self) -> float:
        return self.now

    def attach(self, model: torch.nn.Module, scale: float = 1.0) -> torch.nn.Module:
        model.register_forward_pre_hook(functools.partial(self._forward, scale), with_kwargs=True)
        return model

    def _forward(self, scale: float, module, args, kwargs) -> None:
        rows, width = (kwargs["input_ids"] if "input_ids" in kwargs else args[0]).shape
        seconds = self.fixed + self.per_column * width + self.per_token * rows * width
        self.now += scale * seconds * self.load(self.forwards)
        self.forwards += 1


SPANS, DRAFTS, WARMUP, REPEATS = (1, 2, 4, 8), (1, 2, 4), 3, 5


def _warm_up_forwards(spans=SPANS, drafts=DRAFTS, warmup=WARMUP) -> int:
    """Forwards before the first timed one: the cache's probe (HFRunner.prepare), the context's
    prefill, then ``warmup`` calls of each step (constant times settle at once); a draft step of k
    tokens makes k forwards."""
    return 2 + warmup * (len(spans) + sum(drafts))


def _profile(clock: FakeClock, spans=SPANS, drafts=DRAFTS):
    model = clock.attach(tiny_model("llama"))
    return forward_costs(
        model, spans=spans, drafts=drafts, context=16, repeats=REPEATS, warmup=WARMUP, clock=clock
    )


def test_forward_costs_arithmetic_with_a_fake_clock() -> None:
    """A forward over n tokens 'takes' 2 ms + 1 ms * n; the prefill and every warm-up call take 1000
    times that: a median holding one of them, or two forwards, would be far off. A draft step of k
    tokens makes k one-token forwards."""
    slow = _warm_up_forwards()
    clock = FakeClock(load=lambda k: 1000.0 if k < slow else 1.0)
    profile = _profile(clock)
    assert profile.seconds == pytest.approx([0.003, 0.004, 0.006, 0.010])
    assert profile.fit.fixed == pytest.approx(0.002) and profile.fit.per_token == pytest.approx(0.001)
    assert profile(16) == pytest.approx(0.018)
    assert profile.draft_seconds == pytest.approx([0.003, 0.006, 0.012])
    assert profile.draft(8) == pytest.approx(0.024) and profile.decode() == pytest.approx(0.003)
    assert profile.noise == 0.0  # every repeat took the same time
    assert clock.forwards == slow + REPEATS * (len(SPANS) + sum(DRAFTS))  # none extra


def test_forward_costs_times_every_row_of_a_batch() -> None:
    """Steps over a batch of 3 rows feed all 3: where each fed token costs 1 ms, a step over n
    columns takes 2 ms + 3 ms * n, and a draft of k tokens k forwards of one column each."""
    clock = FakeClock(per_column=0.0, per_token=0.001)
    model = clock.attach(tiny_model("llama"))
    profile = forward_costs(
        model, spans=SPANS, drafts=DRAFTS, context=16, repeats=3, warmup=1, clock=clock, batch=3
    )
    assert profile.fit.fixed == pytest.approx(0.002) and profile.fit.per_token == pytest.approx(0.003)
    assert profile.draft_seconds == pytest.approx([0.005 * k for k in DRAFTS])
    with pytest.raises(ValueError, match="batch"):
        forward_costs(model, context=16, batch=0)


def test_profile_cache_keeps_batches_apart(tmp_path) -> None:
    """Costs at batch 3 are measured and stored apart from batch 1's (whose key is unchanged)."""
    clock = FakeClock(per_column=0.0, per_token=0.001)
    model = clock.attach(tiny_model("llama"))
    cache = ProfileCache(tmp_path / "profiles.json")
    timing = {"spans": SPANS, "drafts": DRAFTS, "repeats": 3, "warmup": 1, "clock": clock}
    one, three = (cache.costs(model, 16, batch=batch, **timing) for batch in (1, 3))
    assert one.fit.per_token == pytest.approx(0.001) and three.fit.per_token == pytest.approx(0.003)
    cache.save()
    keys = list(json.loads((tmp_path / "profiles.json").read_text())["entries"])
    assert len(keys) == 2 and sum(" batch 3 " in k for k in keys) == 1 and "batch" not in min(keys, key=len)


def test_select_hierarchy_for_a_batch_drops_drafts_when_tokens_cost_per_row() -> None:
    """Fake time where a forward costs 4 ms plus 3 ms per token fed (every row's), a draft a tenth
    of that, accepted 89 % of the time: at batch 1 a draft pays; at batch 16 a verification of
    T + 1 tokens costs about T + 1 decoding steps, more than it gains, and plain decoding is
    picked. The batch's pick is measured with 16 rows."""
    target = tiny_model("llama")
    prompts = torch.randint(3, 96, (2, 16), generator=torch.Generator().manual_seed(1))
    picks = {}
    for batch in (1, 16):
        clock = FakeClock(fixed=0.004, per_column=0.0, per_token=0.003)
        draft = clock.attach(noisy_copy(target, 0.1, seed=1), scale=0.1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ProfileNoiseWarning)
            picks[batch] = hsd_fast.select_hierarchy(
                clock.attach(copy.deepcopy(target)), [draft], prompts, clock=clock, progress=False,
                batch=batch, measure=batch > 1, max_new_tokens=8,
            )  # fmt: skip
    assert len(picks[1].chain) == 2 and picks[1].speedup_over_ar > 1.0
    assert picks[16].chain == (1,) and picks[16].batch == 16
    assert picks[16].predicted_tokens_per_second == pytest.approx(16 / picks[16].predicted_latency)
    assert picks[16].measured_latency == pytest.approx(0.004 + 16 * 0.003, rel=0.05)  # a forward per token


def test_acceptance_is_one_against_itself_and_symmetric() -> None:
    target = tiny_model("llama", lm_head_scale=2.0)
    models = [noisy_copy(target, 0.3, seed=1), target, target]
    ids = torch.randint(3, 96, (4, 24), generator=torch.Generator().manual_seed(0))
    for greedy in (False, True):
        alpha = acceptance(models, ids, greedy=greedy, progress=False)
        assert alpha[1][2] == pytest.approx(1.0) and alpha[0][0] == 1.0
        assert alpha[0][1] == alpha[1][0] and 0.0 < alpha[0][1] < 1.0
        assert alpha[0][1] == pytest.approx(alpha[0][2])


def _select_on_fake_time(clock: FakeClock, measure: bool = False) -> tuple:
    """select_hierarchy over a target and two noisy copies of it that agree with it often, on fake
    time where the copies cost a sixth and a third of the target."""
    target = tiny_model("llama")
    candidates = [clock.attach(noisy_copy(target, 0.1 / k, seed=k), scale=2 * k) for k in (1, 2)]
    clock.attach(target, scale=6)  # after copying it: a copy would inherit the hook
    prompts = torch.randint(3, 96, (2, 16), generator=torch.Generator().manual_seed(1))
    pick = hsd_fast.select_hierarchy(
        target, candidates, prompts, measure=measure, max_new_tokens=16, clock=clock, progress=False
    )
    return pick, target, prompts


def test_select_hierarchy_end_to_end() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", ProfileNoiseWarning)  # quiet fake time: no doubt about the pick
        pick, target, prompts = _select_on_fake_time(FakeClock(), measure=True)
    assert pick.chain[-1] == 2 and len(pick.T) == len(pick.drafts) == len(pick.chain) - 1
    assert pick.speedup_over_ar > 1.0 and pick.measured_latency > 0
    assert pick.cost_noise == 0.0 and not pick.within_noise
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
    real_costs, real_alpha = profile.forward_costs, profile.acceptance_and_spread

    def counting_costs(*args, **kwargs):
        calls["costs"] += 1
        return real_costs(*args, repeats=1, warmup=0, **kwargs)

    def counting_alpha(*args, **kwargs):
        calls["alpha"] += 1
        return real_alpha(*args, **kwargs)

    monkeypatch.setattr(profile, "forward_costs", counting_costs)
    monkeypatch.setattr(profile, "acceptance_and_spread", counting_alpha)
    # the machine's speed held still: a fallback's costs come scaled by the anchor's ratio (here 1)
    monkeypatch.setattr(profile, "anchor_seconds", lambda device, clock=None: 1e-4)
    path = tmp_path / "profiles.json"
    cache = ProfileCache(path)
    first = [cache.costs(m, 12) for m in (draft, target)]
    identity = LogitsTransform()
    greedy = cache.acceptance([draft, target], ids, identity, greedy=True, progress=False)
    cache.save()
    assert calls == {"costs": 2, "alpha": 1}

    reread = ProfileCache(tmp_path / "other.json", fallbacks=[path])  # a committed profile as fallback
    assert [reread.costs(m, 12).seconds for m in (draft, target)] == [p.seconds for p in first]
    assert reread.acceptance([draft, target], ids, identity, greedy=True, progress=False) == greedy
    assert calls == {"costs": 2, "alpha": 1}  # nothing re-measured
    reread.costs(target, 24)  # another context length: a new measurement
    transform, is_greedy = generation_sampling(target, do_sample=True, temperature=0.5)
    assert not is_greedy
    reread.acceptance([draft, target], ids, transform, is_greedy, progress=False)  # other sampling too
    assert calls == {"costs": 3, "alpha": 2}
    reread.save()
    entries = [json.loads(p.read_text())["entries"] for p in (path, tmp_path / "other.json")]
    assert len(entries[1]) == len(entries[0]) + 2  # only the two new measurements were added


def test_acceptance_is_measured_on_the_targets_own_continuation() -> None:
    """The cached rates average over the contexts a run meets: the last prompt token's and each
    one the target generated (greedy: the text's next token is the target's argmax there), and the
    draft's argmax agrees with the target's at that share of them; the held-out half is not
    scored. Sampled settings give another text and other rates."""
    target = tiny_model("llama")
    draft = layer_dropped_copy(target, 1)
    ids = torch.randint(3, 96, (3, 16), generator=torch.Generator().manual_seed(5))
    cache = ProfileCache()
    greedy = cache.acceptance([draft, target], ids, LogitsTransform(), True, False, {"do_sample": False})
    text = continued(target, ids, do_sample=False)
    with torch.inference_mode():
        draft_argmax, target_argmax = (m(text).logits.argmax(-1) for m in (draft, target))  # [3, 16]
    assert torch.equal(target_argmax[:, 7:15], text[:, 8:])  # the continuation is the target's greedy text
    agree = (draft_argmax == target_argmax)[:, 7:].float().mean()
    assert greedy[0][1] == greedy[1][0] == pytest.approx(float(agree), abs=1e-6)

    settings = {"do_sample": True, "temperature": 0.5}
    transform, is_greedy = generation_sampling(target, **settings)
    sampled = cache.acceptance([draft, target], ids, transform, is_greedy, False, settings)
    text = continued(target, ids, **settings)
    expected = acceptance([draft, target], text, transform, progress=False, contexts=slice(7, None))
    assert sampled[0][1] == pytest.approx(expected[0][1], abs=1e-6) and sampled[0][1] != greedy[0][1]


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


_measured = functools.partial(measured_latency, generate=hsd_fast.generate)  # timed through the engine


def test_measured_latency_excludes_the_prefill_with_a_fake_clock() -> None:
    target = tiny_model("llama")
    prompts = torch.randint(3, 96, (2, 8), generator=torch.Generator().manual_seed(0))
    # readings: warm-up (0, 5) per row, then per row: long run 10 s, one-token run 2 s
    ticks = iter([0.0, 5.0, 0.0, 5.0, 0.0, 10.0, 0.0, 2.0, 0.0, 10.0, 0.0, 2.0])
    seconds = _measured(target, None, prompts, max_new_tokens=5, clock=lambda: next(ticks), repeats=1)
    assert seconds == pytest.approx((8.0 + 8.0) / (2 * 4))


def _ticks(durations: list[float]):
    """A clock that returns 0, d0, 0, d1, ...: each reading pair measures the next duration."""
    readings = iter([x for d in durations for x in (0.0, d)])
    return lambda: next(readings)


def test_measured_latency_keeps_the_median_pair() -> None:
    """Three (long, short) pairs per row: one spoiled by load (the short run took 30 s) is outvoted."""
    target = tiny_model("llama")
    prompts = torch.randint(3, 96, (1, 8), generator=torch.Generator().manual_seed(0))
    clock = _ticks([5.0, 10.0, 2.0, 10.0, 30.0, 11.0, 2.0])  # warm-up, then (long, short) x 3
    assert _measured(target, None, prompts, max_new_tokens=5, clock=clock) == pytest.approx(8.0 / 4)


def test_measured_latency_is_nan_with_a_warning_when_noise_swamps_it() -> None:
    target = tiny_model("llama")
    prompts = torch.randint(3, 96, (1, 8), generator=torch.Generator().manual_seed(0))
    clock = _ticks([5.0, 2.0, 3.0, 2.0, 3.0, 9.0, 3.0])  # the long runs mostly took less
    with pytest.warns(ProfileNoiseWarning, match="too busy"):
        assert math.isnan(_measured(target, None, prompts, max_new_tokens=5, clock=clock))
    with pytest.raises(ValueError, match="max_new_tokens >= 2"):
        _measured(target, None, prompts, max_new_tokens=1)


# ----------------------------------------------------------------------------- a busy machine
def test_cost_fit_is_robust_monotone_and_non_negative() -> None:
    sizes = [1, 2, 4, 8, 16]
    exact = [0.002 + 0.001 * n for n in sizes]
    assert AffineCost.fit(sizes, exact) == pytest.approx(AffineCost(0.002, 0.001))
    spoiled = [*exact[:3], 10 * exact[3], exact[4]]  # one timing taken under load
    fit = AffineCost.fit(sizes, spoiled)
    assert fit.fixed == pytest.approx(0.002, rel=0.2) and fit.per_token == pytest.approx(0.001, rel=0.2)
    # least squares gave these a negative slope (decreasing) or a negative intercept (steep)
    assert AffineCost.fit(sizes, [0.010, 0.009, 0.008, 0.007, 0.006]).per_token == 0.0
    steep = AffineCost.fit(sizes, [0.001, 0.001, 0.001, 0.030, 0.070])
    assert steep.fixed >= 0.0 and steep.per_token >= 0.0 and steep(1) > 0.0
    assert AffineCost.fit([4], [0.01]) == AffineCost(0.01)
    for bad in ((-0.001, 0.0), (0.001, -1e-6), (math.nan, 0.0)):
        with pytest.raises(ValueError, match="cost must be"):
            AffineCost(*bad)
    for bad in ([math.nan, 0.1], [0.1, -0.2], [math.inf, 0.1]):  # not fitted into a zero cost
        with pytest.raises(ValueError, match="timings must be finite and >= 0"):
            AffineCost.fit([1, 2], bad)


def test_load_that_comes_and_goes_spoils_no_median() -> None:
    """Six timed forwards in a row run 20 times slower (a burst of load). Timed step after step, one
    step got five of them and its median was 20 times too large; rounds over all steps give every
    step at most two of them, which its median of five ignores."""
    spans, drafts = (1, 2, 4, 8), (1,)
    start = _warm_up_forwards(spans, drafts)
    clock = FakeClock(load=lambda k: 20.0 if start + 5 <= k < start + 11 else 1.0)
    profile = _profile(clock, spans, drafts)
    assert profile.seconds == pytest.approx([0.003, 0.004, 0.006, 0.010])
    assert profile.draft_seconds == pytest.approx([0.003])


def _wandering_load(seed: int):
    """A machine whose speed wanders between 0.25 and 1.75 times its own, changing every 10 forwards
    (steady enough for warm-ups to settle, different from one round of timings to the next, and too
    noisy for the extra rounds the profiler times to bring its noise down to ``NOISE_GOAL``)."""
    rng = random.Random(seed)
    factors = [rng.uniform(0.25, 1.75) for _ in range(100_000)]
    return lambda k: factors[k // 10]


def test_noisy_costs_are_reported() -> None:
    """The profile says how uncertain its medians are, and the selector warns that its pick cannot
    be told from noise."""
    profile = _profile(FakeClock(load=_wandering_load(0)))
    assert 0.05 < profile.noise < 0.5
    with pytest.warns(ProfileNoiseWarning, match="within the noise"):
        pick, _, _ = _select_on_fake_time(FakeClock(load=_wandering_load(1)))
    assert pick.within_noise and pick.cost_noise > 0.05
    assert pick.predicted_latency > 0 and all(h.predicted_latency > 0 for h in pick.runner_ups)


def _rounds_timed(spread: float, seconds: float = 1e-3, seed: int = 0) -> tuple[int, float]:
    """Rounds ``interleaved_medians`` times one step (5 at least) whose calls take ``seconds``
    times a normal factor of sd ``spread`` kept within 0.5-1.5 (after three steady calls that end
    the warm-up), and the noise it reports."""
    rng, clock, calls = random.Random(seed), FakeClock(), [0]

    def step() -> None:
        calls[0] += 1
        clock.now += seconds * (1.0 if calls[0] <= 3 else min(1.5, max(0.5, rng.gauss(1.0, spread))))

    _, noise = interleaved_medians([step], clock, torch.device("cpu"), warmup=0, repeats=5)
    return calls[0] - 3, noise


def test_timing_goes_on_while_the_noise_is_above_its_goal() -> None:
    """Past ``repeats`` rounds the profiler times more while the noise is above ``NOISE_GOAL``:
    steady steps take ``repeats`` rounds, a 10 % spread settles below the goal in a few dozen, a
    wide one stops at ``MAX_REPEATS`` still noisy (and says so), slow ones after ``EXTRA_SECONDS``."""
    assert _rounds_timed(spread=0.0) == (5, 0.0)
    rounds, noise = _rounds_timed(spread=0.1)
    assert 5 < rounds < MAX_REPEATS and noise <= NOISE_GOAL
    rounds, noise = _rounds_timed(spread=0.5)
    assert rounds == MAX_REPEATS and noise > NOISE_GOAL
    rounds, noise = _rounds_timed(spread=0.5, seconds=EXTRA_SECONDS / 4)
    assert 5 < rounds <= 5 + 4 / 0.5 and noise > NOISE_GOAL  # 4 calls' time, each at least half


def test_profile_cache_keeps_the_noise(tmp_path) -> None:
    clock = FakeClock(load=_wandering_load(2))
    model = clock.attach(tiny_model("llama"))
    cache = ProfileCache(tmp_path / "profiles.json")
    measured = cache.costs(model, 12, clock=clock, repeats=3, warmup=0)
    cache.save()
    again = ProfileCache(tmp_path / "profiles.json").costs(model, 12, clock=clock)  # anchor timed alike
    assert again == measured and again.noise > 0


def test_select_hierarchy_chooses_among_token_trees() -> None:
    """Tree candidates of 4 and 6 nodes: where a wide verify costs little and the draft's second
    guesses are often right, a tree is picked; it runs through ``generate(hierarchy=)`` (greedy = the
    target's), and no chain configuration the selector also scored is predicted faster."""
    clock = FakeClock(per_column=0.0001)  # a wide verify costs little: trees should pay
    target = tiny_model("llama")
    draft = clock.attach(noisy_copy(target, 0.3, seed=1), scale=1)  # its second guesses are often right
    clock.attach(target, scale=10)
    prompts = torch.randint(3, 96, (2, 16), generator=torch.Generator().manual_seed(1))
    pick = hsd_fast.select_hierarchy(target, [draft], prompts, clock=clock, progress=False, tree_sizes=[4, 6])
    assert pick.tree is not None, "a nearly free wide verify and useful second guesses: a tree should win"
    assert pick.T[0] == pick.tree.depth and pick.drafts == (draft,)
    chains = [h for h in pick.runner_ups if h.tree is None]
    assert chains and all(pick.predicted_latency <= h.predicted_latency for h in chains)
    expected = target.generate(prompts[:1], do_sample=False, max_new_tokens=12)
    out = target.generate(prompts[:1], custom_generate=hsd_fast.generate, hierarchy=pick, max_new_tokens=12)
    assert out.tolist() == expected.tolist()


def test_the_rows_spread_is_measured_on_the_run_text_and_cached(tmp_path) -> None:
    """Each pair's spread (``row_spread``) comes from the same teacher-forced scores as its rate,
    per row of the run text; cached beside the rate and read back without a forward."""
    target = tiny_model("llama")
    draft = layer_dropped_copy(target, 1)
    ids = torch.randint(3, 96, (6, 16), generator=torch.Generator().manual_seed(5))
    cache = ProfileCache(tmp_path / "profiles.json")
    alpha, spread = cache.acceptance_and_spread([draft, target], ids, LogitsTransform(), True, False)
    text = continued(target, ids, do_sample=False)
    with torch.inference_mode():
        draft_argmax, target_argmax = (m(text).logits.argmax(-1)[:, 7:] for m in (draft, target))  # [6, L']
    agree = (draft_argmax == target_argmax).double().numpy()
    assert alpha[0][1] == pytest.approx(agree.mean(), abs=1e-6)
    assert spread[0][1] == spread[1][0] == pytest.approx(row_spread.spread(agree)) and spread[0][0] == 0.0
    assert cache.acceptance([draft, target], ids, LogitsTransform(), True, False) == alpha
    cache.save()
    entries = json.loads((tmp_path / "profiles.json").read_text())["entries"]
    assert sum(k.startswith("spread ") for k in entries) == 1
    again = ProfileCache(tmp_path / "profiles.json")
    for m in (draft, target):  # read back, not measured: no forward may run
        m.forward = None
    assert again.acceptance_and_spread([draft, target], ids, LogitsTransform(), True, False) == (
        alpha,
        spread,
    )


def test_a_batch_is_selected_with_its_rows_spread(tmp_path, monkeypatch) -> None:
    """``select_hierarchy(batch=B > 1)`` hands the batch replay the spread over its candidates (for
    the lookup level, its calibration rows under each model); at batch 1 there is none to measure."""
    import hsd_fast.hierarchy as hierarchy

    target = tiny_model("llama")
    draft = noisy_copy(target, 0.1, seed=1)
    clock = FakeClock()
    clock.attach(draft, scale=1)
    clock.attach(target, scale=6)
    prompts = torch.randint(3, 96, (4, 16), generator=torch.Generator().manual_seed(2))
    seen = []

    def recording(costs, alpha, rows, *args):
        seen.append(args[2])  # the spread (max_T, max_new_tokens, spread, through)
        return select_for_batch(costs, alpha, rows, *args)

    monkeypatch.setattr(hierarchy, "select_for_batch", recording)
    cache = ProfileCache(tmp_path / "profiles.json")
    kwargs = {"cache": cache, "clock": clock, "progress": False, "max_T": 3, "min_gain": 0}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hsd_fast.select_hierarchy(target, [draft, "lookup"], prompts, batch=2, **kwargs)
        hsd_fast.select_hierarchy(target, [draft, "lookup"], prompts, **kwargs)
    (measured,) = [v for k, v in cache.entries.items() if k.startswith("spread ")]  # draft, target
    (draft_rows, target_rows), lookup = seen[0][1][::2], seen[0][1][1]  # everything: draft, lookup, target
    assert seen[0][0] == [0.0, draft_rows, measured] and seen[0][2] == [measured, target_rows, 0.0]
    assert lookup == 0.0 and isinstance(draft_rows, ProposalRows) and isinstance(target_rows, ProposalRows)
    assert len(draft_rows.lengths) == len(target_rows.rates) == len(prompts)  # one per calibration row
    assert draft_rows.rates != target_rows.rates  # each model's own
    assert seen[1] is None
