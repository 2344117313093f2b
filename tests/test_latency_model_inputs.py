"""Where the latency model went wrong on text it was not built on, each pinned (docs/design.md,
"Where the latency model errs"):

- acceptance was profiled on continuations half a calibration row long while runs are longer, and a
  greedy model's text repeats only after a while: a lookup level that proposes whole in a long run
  looked useless on a short continuation. Now the continuation is as long as the run;
- step costs timed on another machine (or the same one at another time) were reused as they were:
  now every cost entry carries the time of a fixed anchor workload and is timed again where the
  anchor moved;
- a pick predicted to gain less over no-draft decoding than the model's own error was taken: now no
  draft is chosen, and the selector says why;
- steps were timed one model at a time, with its weights in the cache; in a chain of several models
  the others' steps run in between: now each step is also timed after that much memory went
  through the cache, and a chain of models pays those costs;
- a verification over n fed tokens was priced by the affine fit at n, while the step runs the
  bucket holding n (9 tokens: 12 columns): the selector gave the lookup level T = 8, slower than
  T = 7. Now a verification costs its bucket.

Models here are built so that their text is known: ``counting_llama`` emits token t + 1 after t,
so its text repeats only after a full cycle of the vocabulary.
"""

from __future__ import annotations

import gzip
import warnings
from dataclasses import replace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import hsd_fast
import hsd_fast.profile.cache as cache_module
from hsd_fast.bench import text_sets
from hsd_fast.hierarchy_types import NoDraftWarning, Selection
from hsd_fast.latency import LookupCost, TreeCost, expected_latency, sharing_the_cache
from hsd_fast.lookup import LookupDraft
from hsd_fast.processors import LogitsTransform
from hsd_fast.profile import ProfileCache, ProfileNoiseWarning
from hsd_fast.profile.cache import ProfileCacheWarning
from hsd_fast.profile.costs import CostProfile, interleaved_medians
from hsd_fast.profile.run_text import continued
from hsd_fast.selector import prefer_fewer_drafts, prefer_no_draft, select

VOCAB, FIRST = 96, 3  # tokens FIRST..VOCAB-1 form one cycle of 93


def counting_llama() -> LlamaForCausalLM:
    """A one-layer Llama whose next token after t is t + 1 (cycling over FIRST..VOCAB-1), with near
    certainty: one-hot embeddings pass through a zeroed layer, and the head maps t to t + 1."""
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=128, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=512, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    tokens = torch.arange(VOCAB)
    following = FIRST + (torch.clamp(tokens, min=FIRST - 1) - FIRST + 1) % (VOCAB - FIRST)
    with torch.no_grad():
        for p in model.model.layers.parameters():
            p.zero_()
        model.model.embed_tokens.weight.zero_()
        model.model.embed_tokens.weight[tokens, tokens] = 1.0
        model.lm_head.weight.zero_()
        model.lm_head.weight[following, tokens] = 1.0
    return model


def _prompts() -> torch.Tensor:
    return torch.randint(FIRST, VOCAB, (2, 32), generator=torch.Generator().manual_seed(0))


def test_counting_llama_counts() -> None:
    text = continued(counting_llama(), _prompts(), new_tokens=100, do_sample=False)
    assert text.shape == (2, 116)
    steps = (text[:, 17:] - text[:, 16:-1]) % (VOCAB - FIRST)
    assert bool((steps == 1).all())


def test_the_lookup_level_is_profiled_on_text_as_long_as_the_run() -> None:
    """On a 16-token continuation the cycle never closes: the lookup only offers what followed a token
    in the random prompt, which the target rejects. On a 200-token one (the run asked for) it offers
    a full block at most calls and the target accepts it, as it does in the run."""
    target, prompts = counting_llama(), _prompts()
    cache = ProfileCache()
    lengths, first_rate = {}, {}
    for new_tokens in (16, 200):
        cost, rates = cache.proposal_level(
            LookupDraft(), [target], prompts, LogitsTransform(), True, 6, False, {"do_sample": False},
            new_tokens=new_tokens,
        )  # fmt: skip
        lengths[new_tokens], first_rate[new_tokens] = cost.lengths, rates[0][0]
    assert first_rate[16] < 0.2  # the old profile: a lookup whose proposals are rejected
    assert lengths[200][-1] > 0.2 and first_rate[200] > 0.4  # once the cycle closes: whole blocks, taken
    keys = [k for k in cache.entries if k.startswith("lookup lengths") and " T6 " in k]
    assert len(keys) == 2 and sum(k.endswith(" +200") for k in keys) == 1

    out = target.generate(
        prompts[:1, :16], custom_generate=hsd_fast.generate, drafts=["lookup"], T=[6], max_new_tokens=200,
        do_sample=False, eos_token_id=None, return_dict_in_generate=True, output_hsd_stats=True,
    )  # fmt: skip
    assert 200 / out.hsd_stats.forwards[-1] > 1.5  # the run itself: one token a pass, then whole blocks


def test_select_hierarchy_profiles_for_its_max_new_tokens(monkeypatch) -> None:
    """select_hierarchy passes the run's length to every rate it profiles (the default half row
    keeps the keys an older cache wrote)."""
    lengths = []

    def recorded(target, ids, new_tokens=None, **kwargs):
        lengths.append(new_tokens)
        return continued(target, ids, new_tokens, **kwargs)

    monkeypatch.setattr(cache_module.run_text, "continued", recorded)
    target = counting_llama()
    cache = ProfileCache()
    monkeypatch.setattr(cache, "costs", lambda *a, **k: CostProfile((1, 2), (0.01, 0.011), (1,), (0.001,)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hsd_fast.select_hierarchy(
            target, ["lookup"], _prompts(), cache=cache, max_new_tokens=48, progress=False
        )
    assert lengths == [48]  # one text, shared by every rate
    assert all(
        " +48" in k for k in cache.entries if k.startswith(("alpha", "lookup lengths", "lookup rates"))
    )


def test_costs_timed_where_the_anchor_ran_at_another_speed_are_timed_again(monkeypatch) -> None:
    calls = []
    monkeypatch.setattr(cache_module, "forward_costs", lambda *a, **k: calls.append(1) or COST)
    speed = {"anchor": 1e-4}
    monkeypatch.setattr(cache_module, "anchor_seconds", lambda device, clock=None: speed["anchor"])
    model = torch.nn.Linear(2, 2)
    first = ProfileCache()
    first.costs(model, 8)
    entries = dict(first.entries)
    assert len(calls) == 1 and next(iter(entries.values()))["anchor"] == 1e-4

    speed["anchor"] = 1.2e-4  # within ANCHOR_TOLERANCE: the same machine, a little noise
    again = ProfileCache()
    again.entries.update(entries)
    again.costs(model, 8)
    assert len(calls) == 1

    speed["anchor"] = 0.6e-4  # a machine (or a process) running it 1.7x faster
    elsewhere = ProfileCache()
    elsewhere.entries.update(entries)
    with pytest.warns(ProfileCacheWarning, match="anchor workload took 100 us; here and now it takes 60 us"):
        elsewhere.costs(model, 8)
    assert len(calls) == 2 and next(iter(elsewhere.entries.values()))["anchor"] == 0.6e-4


def test_a_shipped_profile_timed_at_another_speed_is_scaled_not_timed_again(monkeypatch, tmp_path) -> None:
    """A fallback (the zoo's committed profile) read on a machine running the anchor 1.7x faster: its
    costs come scaled by the anchor's ratio, without timing a step (the demo used to time every
    model's compiled steps again, for minutes, on each run); a cost the user's own cache holds under
    the same key is still timed again."""
    calls = []
    monkeypatch.setattr(cache_module, "forward_costs", lambda *a, **k: calls.append(1) or COST)
    speed = {"anchor": 1e-4}
    monkeypatch.setattr(cache_module, "anchor_seconds", lambda device, clock=None: speed["anchor"])
    model = torch.nn.Linear(2, 2)
    shipped = tmp_path / "shipped.json"
    timed = ProfileCache(shipped)
    timed.costs(model, 8)
    timed.save()
    assert len(calls) == 1

    speed["anchor"] = 0.6e-4
    here = ProfileCache(tmp_path / "mine.json", fallbacks=[shipped])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to say: no timing, no warning
        costs = here.costs(model, 8)
    assert len(calls) == 1 and not here.changed
    assert costs.seconds == pytest.approx([0.6 * t for t in COST.seconds])
    assert costs.draft_seconds == pytest.approx([0.6 * t for t in COST.draft_seconds])
    assert costs.spans == COST.spans

    (tmp_path / "mine.json").write_text(shipped.read_text())  # the same entry, in the user's own cache
    own = ProfileCache(tmp_path / "mine.json", fallbacks=[shipped])
    with pytest.warns(ProfileCacheWarning, match="timing the steps again"):
        own.costs(model, 8)
    assert len(calls) == 2


COST = CostProfile((1, 2), (0.01, 0.02), (1,), (0.005,))


def _selection(speedup: float) -> Selection:
    ar = Selection((2,), (), 1.0)
    single = Selection((1, 2), (3,), 1 / speedup, speedup)
    return Selection((0, 1, 2), (4, 2), 1 / speedup, speedup, runner_ups=(single, ar))


def test_no_draft_is_chosen_when_the_gain_is_within_the_model_error() -> None:
    kept, reason = prefer_no_draft(_selection(1.20), min_gain=0.15)
    assert kept == _selection(1.20) and reason is None

    chosen, reason = prefer_no_draft(_selection(1.10), min_gain=0.15)
    assert chosen.chain == (2,) and "1.10x no-draft decoding" in reason and "15%" in reason
    assert [s.chain for s in chosen.runner_ups] == [(0, 1, 2), (1, 2)]  # nothing lost from the list

    assert prefer_no_draft(_selection(1.10), min_gain=0.0)[1] is None  # 0 turns the guard off


def test_select_hierarchy_says_when_it_chose_no_draft(monkeypatch) -> None:
    """The selection (replaced here by one whose pick gains 1.10x) goes through the guard: no draft,
    a NoDraftWarning, the reason on the result, the draft kept among the runner-ups; min_gain=0
    keeps the draft."""
    import hsd_fast.hierarchy as hierarchy_module

    target, draft = counting_llama(), counting_llama()
    with torch.no_grad():
        draft.lm_head.weight[0, 0] += 1e-3  # another model (another cache key), the same argmax
    ar = Selection((1,), (), 1.0)
    with_draft = Selection((0, 1), (3,), 1 / 1.1, 1.1, runner_ups=(ar,))
    monkeypatch.setattr(hierarchy_module, "select_for_batch", lambda *a, **k: with_draft)
    cache = ProfileCache()
    monkeypatch.setattr(cache, "costs", lambda *a, **k: CostProfile((1, 2), (0.01, 0.011), (1,), (0.01,)))
    with pytest.warns(NoDraftWarning, match="1.10x no-draft decoding, within the latency model's error"):
        pick = hsd_fast.select_hierarchy(target, [draft], _prompts(), cache=cache, progress=False)
    assert pick.drafts == () and "no draft chosen" in pick.no_draft_reason
    assert [h.drafts for h in pick.runner_ups] == [(draft,)]
    kept = hsd_fast.select_hierarchy(target, [draft], _prompts(), cache=cache, progress=False, min_gain=0.0)
    assert kept.drafts == (draft,) and kept.no_draft_reason is None


def _deep_selection(over_single: float) -> Selection:
    """A pick with two drafts predicted ``over_single`` times the best single draft, over no draft 2x."""
    ar = Selection((2,), (), 2.0)
    single = Selection((1, 2), (3,), 1.0, 2.0)
    deeper = Selection((0, 1, 2), (4, 2), 1 / over_single, 2 * over_single, over_single)
    return replace(deeper, runner_ups=(single, ar))


def test_fewer_drafts_are_chosen_when_the_gain_is_within_the_costs_noise() -> None:
    kept, reason = prefer_fewer_drafts(_deep_selection(1.10), margin=0.09)
    assert kept == _deep_selection(1.10) and reason is None

    chosen, reason = prefer_fewer_drafts(_deep_selection(1.02), margin=0.09)
    assert chosen.chain == (1, 2) and "one with 1 draft (1.020x)" in reason and "+-9.0%" in reason
    assert [s.chain for s in chosen.runner_ups] == [(0, 1, 2), (2,)]  # nothing lost from the list
    assert not chosen.runner_ups[0].runner_ups

    assert prefer_fewer_drafts(_deep_selection(1.02), margin=0.0)[1] is None  # quiet costs: kept
    assert prefer_fewer_drafts(_deep_selection(1.02), margin=2.0)[0].chain == (1, 2)  # never no draft
    single = replace(_deep_selection(1.0), chain=(1, 2), T=(3,))
    assert prefer_fewer_drafts(single, margin=0.5) == (single, None)  # one draft is the fewest


def test_select_hierarchy_says_when_it_chose_fewer_drafts(monkeypatch) -> None:
    """The selection (replaced here by one whose two-draft pick is predicted 1.02x its best single
    draft) on costs 5 % noisy (a 15 % margin at three standard errors): the single draft, a
    ProfileNoiseWarning, the reason on the result, the deeper chain first among the runner-ups;
    on quiet costs the deeper chain is kept."""
    import hsd_fast.hierarchy as hierarchy_module

    target, small, large = counting_llama(), counting_llama(), counting_llama()
    with torch.no_grad():  # other models (other cache keys), the same argmax
        small.lm_head.weight[0, 0] += 1e-3
        large.lm_head.weight[0, 1] += 1e-3
    monkeypatch.setattr(hierarchy_module, "select_for_batch", lambda *a, **k: _deep_selection(1.02))
    cache = ProfileCache()
    for noise, expected in ((0.05, (large,)), (0.0, (small, large))):
        cost = CostProfile((1, 2), (0.01, 0.011), (1,), (0.01,), noise=noise)
        monkeypatch.setattr(cache, "costs", lambda *a, cost=cost, **k: cost)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            pick = hsd_fast.select_hierarchy(target, [small, large], _prompts(), cache=cache, progress=False)
        assert pick.drafts == expected
        said = [str(w.message) for w in caught if issubclass(w.category, ProfileNoiseWarning)]
        if noise:
            assert "the one with fewer drafts chosen" in pick.fewer_drafts_reason
            assert any("+-15.0%" in m and "fewer drafts chosen" in m for m in said)
            assert [h.drafts for h in pick.runner_ups] == [(small, large), ()]
        else:
            assert pick.fewer_drafts_reason is None and not said


def test_text_sets_cut_disjoint_windows_from_the_files_found(tmp_path, monkeypatch) -> None:
    (tmp_path / "a.txt").write_text(" ".join(f"a{i}" for i in range(300)))  # no window repeats
    (tmp_path / "b.1.gz").write_bytes(gzip.compress(" ".join(f"b{i}" for i in range(300)).encode()))
    found = text_sets.TextSet("mixed", "test text", ((str(tmp_path / "missing*"),), (str(tmp_path / "*"),)))
    monkeypatch.setitem(text_sets.TEXT_SETS, "mixed", found)
    assert [p.name for p in found.files()] == ["a.txt", "b.1.gz"]  # the first group found nothing
    assert "a299\n\nb0 b1" in found.text()
    encode = lambda text: [ord(c) for c in text]  # noqa: E731
    prompts = text_sets.prompt_set(
        "mixed", encode, calibration=3, prompts=2, calibration_len=40, prompt_len=20
    )
    assert prompts.calibration.shape == (3, 40) and prompts.prompts.shape == (2, 20)
    stream = torch.tensor(encode(found.text()))
    spans = []
    for rows in (prompts.calibration, prompts.prompts):
        for row in rows:
            start = next(i for i in range(len(stream)) if torch.equal(stream[i : i + len(row)], row))
            spans.append(range(start, start + len(row)))
    assert all(set(a).isdisjoint(b) for i, a in enumerate(spans) for b in spans[i + 1 :])
    with pytest.raises(ValueError, match="fewer than the 5 windows of 4000"):
        text_sets.prompt_set("mixed", encode, calibration=3, prompts=2, calibration_len=4000)
    monkeypatch.setitem(
        text_sets.TEXT_SETS, "gone", text_sets.TextSet("gone", "x", ((str(tmp_path / "no*"),),))
    )
    with pytest.raises(ValueError, match=r"'gone': none of .*no\* exists on this machine"):
        text_sets.prompt_set("gone", encode)
    with pytest.raises(ValueError, match="unknown text set 'poetry'"):
        text_sets.prompt_set("poetry", encode)


def test_a_chain_of_models_pays_their_crowded_costs() -> None:
    """Timed alone, a model's step finds its weights in the cache; in a chain the other models'
    steps run in between: expected_latency takes each model's crowded cost where two or more models
    take turns (a lookup level has no weights), and the plain one for a model alone."""
    warm = CostProfile((1, 9), (0.001, 0.002), (1, 8), (0.001, 0.008))
    crowded_draft = CostProfile((1, 9), (0.002, 0.003), (1, 8), (0.002, 0.016))
    draft = replace(warm, crowded=crowded_draft)
    crowded_target = CostProfile((1, 9), (0.011, 0.013), (1, 8), (0.011, 0.088))
    target = replace(CostProfile((1, 9), (0.010, 0.012), (1, 8), (0.010, 0.080)), crowded=crowded_target)
    lookup = LookupCost(1e-5, (0.5, 0.5))
    assert sharing_the_cache([lookup, target]) == [lookup, target]
    assert sharing_the_cache([draft, target]) == [crowded_draft, crowded_target]
    assert sharing_the_cache([lookup, draft, target])[1:] == [crowded_draft, crowded_target]
    tree = TreeCost(draft, (2, 2))
    assert sharing_the_cache([tree, target])[0] == TreeCost(crowded_draft, (2, 2))
    assert (
        expected_latency([draft, target], [0.8], [4])
        == expected_latency([crowded_draft, crowded_target], [0.8], [4])
        > expected_latency([warm, replace(target, crowded=None)], [0.8], [4])
    )


def test_crowded_costs_are_timed_after_the_crowd_and_cached(monkeypatch) -> None:
    """``before`` runs ahead of every timed call and is not timed; the cache keeps the crowded
    profile under a key naming the crowd, and times again an entry that lacks it."""
    clock = FakeClock()
    calls = []

    def before() -> None:
        calls.append(1)
        clock.now += 5.0  # a crowd that takes long: none of it may be counted

    medians, _ = interleaved_medians([lambda: clock.tick(0.25)], clock, torch.device("cpu"), 0, 4, before)
    assert medians == [0.25] and len(calls) >= 4

    timed = []

    def fake_costs(model, crowd_bytes=0, **kwargs):
        timed.append(crowd_bytes)
        crowded = CostProfile((1,), (0.002,), (1,), (0.002,)) if crowd_bytes else None
        return replace(COST, crowded=crowded)

    monkeypatch.setattr(cache_module, "forward_costs", fake_costs)
    monkeypatch.setattr(cache_module, "anchor_seconds", lambda device, clock=None: 1e-4)
    model = torch.nn.Linear(2, 2)
    cache = ProfileCache()
    assert cache.costs(model, 8).crowded is None
    profile = cache.costs(model, 8, crowd_bytes=1 << 20)
    assert timed == [0, 1 << 20] and profile.crowded.seconds == (0.002,)
    assert sum(" crowd 1048576 " in key for key in cache.entries) == 1
    assert cache.costs(model, 8, crowd_bytes=1 << 20) == profile and len(timed) == 2  # cached


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def tick(self, seconds: float) -> None:
        self.now += seconds


def test_a_verification_is_priced_at_the_bucket_it_runs() -> None:
    """A step over n fed tokens runs at the bucket holding n, so it costs the bucket's width: 9 fed
    tokens cost 12's. A lookup level that offers long blocks then gets T = 7 (8 columns) where the fit
    at the fed width alone gave it T = 8 (9 fed, 12 run: measured slower on the zoo, compiled)."""
    target = CostProfile((1, 2, 4, 8, 16), (0.0011, 0.0012, 0.0014, 0.0018, 0.0026), (1, 8), (0.0011, 0.0088))
    assert target(9) == target(12) == target.fit(12) > target(8) == target.fit(8)
    assert target(5) == target(6) and target(3) == target.fit(3)  # 3 is a bucket
    assert target(100) == target.fit(100)  # past the widest bucket a span is fed in chunks
    lookup = LookupCost(1e-5, (0.2,) + (0.0,) * 15 + (0.8,))  # a match offers 16 tokens or more
    alpha = [[1.0, 0.95], [0.0, 1.0]]
    assert select([lookup, target], alpha, max_T=8).T == (7,)
    assert select([lookup, target.fit], alpha, max_T=8).T == (8,)  # what the unbucketed price chose
    assert expected_latency([lookup, target], [0.95], [7]) < expected_latency([lookup, target], [0.95], [8])
