"""Hierarchies that change between rounds (docs/design.md, "Switching hierarchies"): greedy output
equal to the target's under forced and random switches, sampled output exact under policies that
switch at random, on the rejections they saw, or on everything the run's past keys reveal (each
distribution test with a planted bug it catches), and the arguments, stats and built-in policy."""

from __future__ import annotations

import itertools
import random
from unittest import mock

import numpy as np
import pytest
import torch
from hf_models import derived_drafts, tiny_model
from planted_bugs import joining_levels_skip_catch_up, lower_keys_never_change, runs_share_seeds

import hsd_fast
from hsd_fast import sampling_metadata, zoo
from hsd_fast.engine import run_hsd
from hsd_fast.hierarchy_types import Selection
from hsd_fast.switching import ExploreThenCommit, take_run
from hsd_fast.switching_types import Adaptive, Choice, Observation
from hsd_fast.testing.exactness import pooled_chi_square
from hsd_fast.testing.tables import TableRunner, table_family
from hsd_fast.triton_kernels.keyed_random_torch import DRAFT, race_torch

ALPHA = 1e-3


def every_subchain(num_candidates: int) -> list[tuple[int, ...]]:
    """Every sub-chain of the candidates, no draft included."""
    indices = range(num_candidates)
    return [c for k in range(num_candidates + 1) for c in itertools.combinations(indices, k)]


class RandomSwitches:
    """A policy independent of the run: a random sub-chain with random block sizes every round
    (``trees``: level 0 drafts one of them when it is a model, half the time)."""

    def __init__(self, seed: int, max_T: int = 3, trees: tuple = (), lookup_first: bool = False) -> None:
        self.rng, self.max_T, self.trees, self.lookup_first = random.Random(seed), max_T, trees, lookup_first
        self.chosen: list[Choice] = []

    def __call__(self, seen: Observation) -> Choice:
        drafts = self.rng.choice(every_subchain(seen.num_candidates))
        T = tuple(self.rng.randint(1, self.max_T) for _ in drafts)
        tree = None
        if self.trees and drafts and not (self.lookup_first and drafts[0] == 0) and self.rng.random() < 0.5:
            tree = self.rng.choice(self.trees)
            T = (tree.depth, *T[1:])
        self.chosen.append(Choice(drafts, T, tree))
        return self.chosen[-1]


# ------------------------------------------------------------------ greedy: the target's own output


@pytest.fixture(scope="module")
def zoo_models() -> dict[str, torch.nn.Module]:
    return {name: zoo.load(name) for name in zoo.names()}


@pytest.mark.hf
@pytest.mark.parametrize("lookup", [False, True], ids=["models", "lookup+models"])
def test_greedy_equals_the_target_under_random_switches_on_the_zoo(zoo_models, lookup: bool) -> None:
    *names, target_name = zoo.names()
    target = zoo_models[target_name]
    candidates = [*(["lookup"] if lookup else []), *(zoo_models[n] for n in names[:2])]
    tokenizer = zoo.load_tokenizer()
    texts = ["The history of the city begins", "def fibonacci(n):\n    if n < 2:", "1, 2, 3, 4, 5, 6,"]
    seen_choices: set[tuple[int, ...]] = set()
    for i, text in enumerate(texts):
        ids = tokenizer(text, return_tensors="pt")["input_ids"]
        expected = target.generate(ids, do_sample=False, max_new_tokens=40)
        policy = RandomSwitches(seed=i, lookup_first=lookup)
        out = target.generate(
            ids, custom_generate=hsd_fast.generate, drafts=candidates, adapt=policy, do_sample=False,
            max_new_tokens=40, output_hsd_stats=True, compile=False,
        )  # fmt: skip
        assert out.sequences.tolist() == expected.tolist(), text
        assert len(out.hsd_stats.hierarchies) > 3  # it switched, round after round
        seen_choices |= {c.drafts for c in policy.chosen}
    assert seen_choices == set(every_subchain(len(candidates)))  # every sub-chain decoded


@pytest.mark.hf
def test_greedy_batch_with_left_padding_and_token_trees_switching_every_round() -> None:
    target = tiny_model("llama")
    drafts = derived_drafts(target, 2)
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(3, target.config.vocab_size, (3, 9), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, :3] = mask[2, :5] = 0  # left padding
    ids[mask == 0] = 0
    expected = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=30)
    trees = (hsd_fast.Tree.full([2, 2]), hsd_fast.Tree.spine(3, 2))
    for seed in range(3):
        policy = RandomSwitches(seed=seed, trees=trees, lookup_first=True)
        out = target.generate(
            ids, attention_mask=mask, custom_generate=hsd_fast.generate, drafts=["lookup", *drafts],
            adapt=Adaptive(policy, trees=trees), do_sample=False, max_new_tokens=30, output_hsd_stats=True,
            compile=False,
        )  # fmt: skip
        assert out.sequences.tolist() == expected.tolist()
    assert any(c.tree is not None for c in policy.chosen)


@pytest.mark.hf
def test_wrap_with_the_built_in_policy_and_a_hierarchy_to_start_from() -> None:
    target = tiny_model("qwen2")
    drafts = derived_drafts(target, 2)
    ids = torch.randint(3, target.config.vocab_size, (1, 7), generator=torch.Generator().manual_seed(1))
    expected = target.generate(ids, do_sample=False, max_new_tokens=60)
    model = hsd_fast.wrap(target, ["lookup", *drafts], adapt=True)
    out = model.generate(ids, do_sample=False, max_new_tokens=60, output_hsd_stats=True)
    assert out.sequences.tolist() == expected.tolist()
    used = out.hsd_stats.hierarchies
    assert (
        used[0].from_round == 0 and used[0].choice == Choice()
    )  # the built-in policy explores no draft first
    assert [u.from_round for u in used] == sorted(u.from_round for u in used)
    assert len({u.choice for u in used}) >= 3

    # a selected hierarchy is the first round's; the levels are the candidates, the target last
    start = hsd_fast.Hierarchy(drafts=(drafts[1],), T=(3,), selection=Selection((1, 2), (3,), 1.0))
    out = target.generate(
        ids, custom_generate=hsd_fast.generate, drafts=drafts, hierarchy=start, adapt=True,
        do_sample=False, max_new_tokens=20, output_hsd_stats=True,
    )  # fmt: skip
    assert out.sequences.tolist() == expected[:, : ids.shape[1] + 20].tolist()
    assert out.hsd_stats.hierarchies[0].choice == Choice((1,), (3,))
    assert out.hsd_stats.num_levels == 3


# ------------------------------------------------------------------ sampled: the target's distribution

VOCAB, ORDER = 3, 2
FAMILY = table_family(VOCAB, ORDER, 3, spread=3.0, seed=1)  # two candidates and the target
PROMPT = torch.arange(ORDER) % VOCAB


def exact(steps: int) -> dict:
    return FAMILY[-1].continuation_probs(PROMPT.tolist(), steps)


def test_a_batch_switching_every_round_samples_the_target() -> None:
    steps, rows = 6, 30_000
    rng, order = random.Random(0), [(0, 1), (1,), (0,), ()]  # no draft last: it takes 4 tokens a round
    chosen = []

    def cycle(seen: Observation) -> Choice:
        drafts = order[seen.round % len(order)]
        chosen.append(Choice(drafts, tuple(rng.randint(1, 3) for _ in drafts)))
        return chosen[-1]

    result = run_hsd(
        [TableRunner(m) for m in FAMILY], [PROMPT] * rows, max_new_tokens=steps, seeds=7,
        adapt=Adaptive(cycle, max_T=3),
    )  # fmt: skip
    samples = [tuple(s[ORDER:].tolist()) for s in result.sequences]
    assert pooled_chi_square(samples, exact(steps)).p_value > ALPHA
    assert len({c.drafts for c in chosen}) >= 3 and len(result.stats.hierarchies) >= 3


def test_a_joining_level_that_skips_its_catch_up_is_caught() -> None:
    """A level that rejoins must feed the committed tokens it missed: told otherwise, the table
    runner (a cache that remembers exactly what it was fed) refuses the gap."""
    with joining_levels_skip_catch_up(), pytest.raises(RuntimeError, match="gap"):
        run_hsd(
            [TableRunner(m) for m in FAMILY], [PROMPT] * 50, max_new_tokens=12, seeds=1,
            adapt=Adaptive(RandomSwitches(seed=1), max_T=3),
        )  # fmt: skip


def batch_one_samples(policy_of, steps: int, num_samples: int) -> list[tuple[int, ...]]:
    """``num_samples`` continuations, each a run of its own (a policy acts on one row's history)."""
    runners = [TableRunner(m) for m in FAMILY]
    out = []
    for seed in range(num_samples):
        result = run_hsd(
            runners, [PROMPT], max_new_tokens=steps, seeds=seed, adapt=Adaptive(policy_of(seed), max_T=2)
        )
        out.append(tuple(result.sequences[0][ORDER:].tolist()))
    return out


class KeyReader:
    """The strongest adversary: it knows the row's seed and how keys are made, so from the keys of
    the epoch that just ended it predicts what the smallest draft would draw next, and lets it draft
    (alone under the target) only when that is the token the draft and the target both like most.
    Were the next epoch keyed like the last, the draft's token would be chosen by the policy, not
    drawn from its distribution, and the target's verification biased."""

    def __init__(self, seed: int) -> None:
        self.row_seed = sampling_metadata.row_seeds(seed, 1)

    def __call__(self, seen: Observation) -> Choice:
        p = int(seen.committed[0])
        context = seen.tokens[0, p - ORDER : p][None]  # [1, ORDER]
        draft_logits = FAMILY[0].next_logits(context)  # [1, V]
        liked = torch.minimum(draft_logits.softmax(-1), FAMILY[-1].next_logits(context).softmax(-1))
        keys = sampling_metadata.epoch_seeds(self.row_seed, seen.epoch)
        drawn = int(race_torch(draft_logits, keys, 0, torch.tensor([p]), DRAFT)[0])
        return Choice((0,), (1,)) if drawn == int(liked.argmax()) else Choice()


class RejectionWatcher:
    """Switches on the last round's rejection pattern: the middle level out after a rejection
    anywhere, back in after a round without one."""

    def __call__(self, seen: Observation) -> Choice:
        rejected = any((a < v).any() for a, v in zip(seen.accepted, seen.verified, strict=True))
        return Choice((1,), (2,)) if rejected else Choice((0, 1), (2, 1))


@pytest.mark.slow
def test_a_policy_reading_every_past_key_cannot_bias_the_output() -> None:
    steps, n = 3, 5000
    honest = pooled_chi_square(batch_one_samples(KeyReader, steps, n), exact(steps))
    assert honest.p_value > ALPHA, honest
    with lower_keys_never_change():
        planted = pooled_chi_square(batch_one_samples(KeyReader, steps, n), exact(steps))
    assert planted.p_value < 1e-6, planted


@pytest.mark.slow
def test_a_policy_switching_on_rejections_samples_the_target() -> None:
    steps, n = 4, 5000
    check = pooled_chi_square(batch_one_samples(lambda _: RejectionWatcher(), steps, n), exact(steps))
    assert check.p_value > ALPHA, check
    with joining_levels_skip_catch_up(), pytest.raises(RuntimeError, match="gap"):
        batch_one_samples(lambda _: RejectionWatcher(), 16, 200)


class Remembers:
    """Serves two runs with one seed and remembers the first: the target alone drew ``token`` first
    there, so the second run decodes with the target alone again (keyed alike, it would draw
    ``token`` again), else under the smallest draft. Were the second run keyed like the first, its
    first token would be ``token`` more often than the target says."""

    def __init__(self, token: int) -> None:
        self.token, self.first = token, None

    def __call__(self, seen: Observation) -> Choice:
        return Choice() if self.first in (None, self.token) else Choice((0,), (2,))

    def finished(self, seen: Observation) -> None:
        if self.first is None:
            self.first = int(seen.tokens[0, ORDER])


def test_runs_are_counted_per_policy_object() -> None:
    class Unhashable:
        __hash__ = None

    keeps, unhashable = lambda seen: Choice(), Unhashable()
    assert [take_run(keeps) for _ in range(3)] == [0, 1, 2]
    assert [take_run(unhashable), take_run(unhashable)] == [0, 1]  # counted by id
    assert take_run(None) == 0 and take_run(None) == 0  # the built-in policy, fresh for every run
    remembers = Remembers(0)  # a bound method (made anew at each access): counted with its object
    assert [take_run(remembers.finished), take_run(remembers.finished), take_run(remembers)] == [0, 1, 2]


@pytest.mark.slow
def test_a_policy_that_served_a_run_with_the_same_seed_cannot_bias_the_next() -> None:
    steps, n = 2, 3000
    token = max(range(VOCAB), key=lambda t: exact(1).get((t,), 0.0))
    runners = [TableRunner(m) for m in FAMILY]

    def second_runs() -> list[tuple[int, ...]]:
        out = []
        for seed in range(n):
            policy = Remembers(token)
            for _ in range(2):
                result = run_hsd(
                    runners, [PROMPT], max_new_tokens=steps, seeds=seed, adapt=Adaptive(policy, max_T=2)
                )
            out.append(tuple(result.sequences[0][ORDER:].tolist()))
        return out

    honest = pooled_chi_square(second_runs(), exact(steps))
    assert honest.p_value > ALPHA, honest
    with runs_share_seeds():
        planted = pooled_chi_square(second_runs(), exact(steps))
    assert planted.p_value < 1e-6, planted


# ------------------------------------------------------------------ arguments, stats, the built-in policy


@pytest.mark.hf
def test_adaptive_arguments_are_checked() -> None:
    target = tiny_model("llama", layers=2)
    drafts = derived_drafts(target, 2)
    ids = torch.randint(3, 90, (1, 5), generator=torch.Generator().manual_seed(0))

    def run(**kwargs):
        return target.generate(ids, custom_generate=hsd_fast.generate, max_new_tokens=8, **kwargs)

    with pytest.raises(ValueError, match="T="):
        run(drafts=drafts, adapt=True, T=[2, 2])
    with pytest.raises(ValueError, match="trees="):
        run(drafts=drafts, adapt=True, tree=hsd_fast.Tree.chain(2))
    with pytest.raises(ValueError, match="adaptive"):
        run(drafts=drafts, trees=[hsd_fast.Tree.chain(2)])
    with pytest.raises(TypeError, match="adapt must be"):
        run(drafts=drafts, adapt="yes")
    with pytest.raises(ValueError, match="once"):
        run(drafts=[drafts[0], drafts[0]], adapt=True)
    with pytest.raises(ValueError, match="max_T"):
        run(drafts=drafts, adapt=lambda seen: Choice((0,), (9,)))
    with pytest.raises(ValueError, match="each once"):
        run(drafts=drafts, adapt=lambda seen: Choice((0, 0), (2, 2)))
    with pytest.raises(ValueError, match="only be the first"):
        run(drafts=["lookup", *drafts], adapt=lambda seen: Choice((1, 0), (2, 2)))
    with pytest.raises(ValueError, match="not given"):
        run(drafts=drafts, adapt=lambda seen: Choice((0,), (2,), hsd_fast.Tree.chain(2)))
    with pytest.raises(TypeError, match="Choice"):
        run(drafts=drafts, adapt=lambda seen: (0,))


def test_stats_count_each_candidate_at_its_own_index_and_list_the_hierarchies() -> None:
    choices = iter([Choice((0, 1), (2, 2)), Choice((1,), (2,)), Choice(), Choice((0,), (3,))] * 50)
    result = run_hsd(
        [TableRunner(m) for m in FAMILY], [PROMPT] * 4, max_new_tokens=30, seeds=3,
        adapt=Adaptive(lambda seen: next(choices), max_T=3),
    )  # fmt: skip
    stats, used = result.stats, result.stats.hierarchies
    assert stats.num_levels == 3
    assert [u.choice for u in used[:4]] == [
        Choice((0, 1), (2, 2)),
        Choice((1,), (2,)),
        Choice(),
        Choice((0,), (3,)),
    ]
    assert all(u.switch_seconds >= 0 and u.rounds >= 1 for u in used[:-1])
    assert sum(u.committed for u in used) == sum(result.num_new_tokens)  # the last stretch included
    assert used[3].catch_up_tokens > 0  # candidate 0 sat out two hierarchies: it catches up
    assert stats.verified[1] > 0 and stats.verified[2] > 0 and stats.drafted[0] > 0
    assert 0 < stats.look_seconds < sum(stats.wall_time) + stats.look_seconds  # the looks, timed apart


class Recorder:
    """Keeps one hierarchy, looks at every third round end, and records what it is shown, the run's
    end included (``finished``)."""

    look_every = 3

    def __init__(self, finished: bool = True) -> None:
        self.looks: list[Observation] = []
        self.ends: list[Observation] = []
        if finished:
            self.finished = self.ends.append

    def __call__(self, seen: Observation) -> Choice:
        self.looks.append(seen)
        return Choice((0, 1), (2, 2))


def test_a_policy_is_shown_every_round_the_last_ones_at_the_runs_end() -> None:
    """Each verification, committed token and round reaches the policy once: at the look after it, or,
    for the rounds after the last look, at the run's end; a policy without ``finished`` is not asked."""
    policy = Recorder()
    result = run_hsd(
        [TableRunner(m) for m in FAMILY], [PROMPT] * 4, max_new_tokens=30, seeds=3,
        adapt=Adaptive(policy, max_T=3),
    )  # fmt: skip
    (end,) = policy.ends
    assert end.finished.all() and end.round == len(policy.looks) and end.rounds >= 1
    shown = [*policy.looks[1:], end]  # looks[0]: the first choice, before any round
    assert sum(s.round_tokens for s in shown) == sum(result.num_new_tokens)
    assert sum(s.rounds for s in shown) == result.stats.hierarchies[0].rounds
    assert all(s.rounds == 3 for s in shown[:-1])  # the rounds each look reports
    for level in (1, 2):  # the draft model's verifications, the target's
        assert sum(int(s.verified[level - 1].sum()) for s in shown) == result.stats.verified[level]
        assert sum(int(s.accepted[level - 1].sum()) for s in shown) == result.stats.accepted[level]
    without = Recorder(finished=False)
    run_hsd([TableRunner(m) for m in FAMILY], [PROMPT], max_new_tokens=10, seeds=3, adapt=Adaptive(without))
    assert without.looks and not without.ends


def test_each_run_of_the_middle_level_is_opened_by_one_verification() -> None:
    """``Observation.opens``: a level's first verification of each of its runs (none of its own
    tokens waiting) is marked, once per verification of the level above, in every row; the
    target's all open. At one row, the marks fall where the middle level's gains since the last
    mark reached its block size."""
    for prompts in ([PROMPT] * 4, [PROMPT]):
        policy = Recorder()
        run_hsd([TableRunner(m) for m in FAMILY], prompts, max_new_tokens=30, seeds=3, adapt=Adaptive(policy))
        shown = [*policy.looks[1:], *policy.ends]
        for s in shown:
            assert [len(o) for o in s.opens] == [len(v) for v in s.verified]
            assert s.opens[1].all() and int(s.opens[0].sum()) == len(s.verified[1])
        if len(prompts) == 1:
            gains = np.concatenate([np.minimum(s.accepted[0], s.verified[0]) + 1 for s in shown])
            opens, run = [], 0
            for gain in gains.tolist():
                opens.append(run == 0)
                run = 0 if run + gain >= 2 else run + gain
            assert np.concatenate([s.opens[0] for s in shown]).tolist() == opens
            assert not all(opens)  # some runs took more than one verification


def test_the_built_in_policy_explores_then_keeps_the_fastest() -> None:
    policy = ExploreThenCommit(explore_rounds=2, period=20)

    def seen(round_: int, choice, seconds: float) -> Observation:
        return Observation(
            round=round_, epoch=round_, choice=choice, num_candidates=2, lookup_first=True, trees=(),
            committed=np.zeros(1, dtype=np.int64), finished=np.zeros(1, dtype=bool),
            tokens=torch.zeros(1, 1, dtype=torch.int64), round_tokens=4, round_seconds=seconds,
        )  # fmt: skip

    # no draft, the lookup level alone, the model alone, both: the model alone is fastest here
    speed = {Choice(): 1.0, Choice((0,), (4,)): 0.5, Choice((1,), (4,)): 0.1, Choice((0, 1), (4, 4)): 0.3}
    choice = policy(seen(0, None, 0.0))
    order = [choice]
    for r in range(1, 12):
        choice = policy(seen(r, choice, speed[choice]))
        order.append(choice)
    assert order[:8] == [c for c in speed for _ in range(2)]
    assert order[8:] == [Choice((1,), (4,))] * 4


@pytest.mark.slow
@pytest.mark.hf
def test_compiled_adaptive_runs_compile_only_between_requests() -> None:
    """No switch waits for a compiler: an adaptive run compiles the step shapes it used often only
    after its last token (every row sitting out), and the next request runs them."""
    from hsd_fast.compile_policy import Compiling
    from hsd_fast.level_step import LevelStep

    target = tiny_model("llama", layers=2)
    drafts = derived_drafts(target, 1)
    ids = torch.randint(3, 90, (1, 6), generator=torch.Generator().manual_seed(2))
    expected = target.generate(ids, do_sample=False, max_new_tokens=24)
    compiles, after_the_run = [], [False]
    first_call, deferred = Compiling.__call__, LevelStep.compile_deferred

    def spy_call(self, *args):
        if not self.compiled:
            compiles.append(after_the_run[0])
        return first_call(self, *args)

    def spy_deferred(state):
        after_the_run[0] = True
        try:
            return deferred(state)
        finally:
            after_the_run[0] = False

    warming: list[list[bool]] = []  # per request, per look: whether its rounds ran warm-up steps

    def alternate(seen):
        warming[-1].append(seen.warming)
        return [Choice((0,), (2,)), Choice()][seen.round % 2]

    with (
        mock.patch.object(Compiling, "__call__", spy_call),
        mock.patch.object(LevelStep, "compile_deferred", staticmethod(spy_deferred)),
    ):
        for _ in range(2):
            warming.append([])
            out = target.generate(
                ids, custom_generate=hsd_fast.generate, drafts=drafts, adapt=alternate, do_sample=False,
                max_new_tokens=24, compile=True,
            )  # fmt: skip
            assert out.tolist() == expected.tolist()
        count = len(compiles)
        warming.append([])
        target.generate(
            ids, custom_generate=hsd_fast.generate, drafts=drafts, adapt=alternate, do_sample=False,
            max_new_tokens=24, compile=True,
        )  # fmt: skip
    assert compiles and all(compiles)  # every graph compiled after a run, none during one
    assert len(compiles) == count  # the third request compiled nothing: the shapes were there
    # the policy is told which looks followed steps that ran eagerly, waiting to compile: the first
    # request's, none of the third's
    assert any(warming[0]) and not any(warming[2])
