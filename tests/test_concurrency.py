"""Models shared between calls and between levels (docs/design.md, "Caches and slots"): concurrent
``generate`` calls each return exactly what the same call returns alone, whether the threads share
one wrapped model, one draft under two targets, or the same two models at swapped levels (no
deadlock); a model named at two levels of one call runs as two copies would."""

import copy
import threading

import pytest
import torch
from hf_models import derived_drafts, tiny_model
from transformers.generation.streamers import BaseStreamer

import hsd_fast

pytestmark = pytest.mark.hf

THREADS = 4
CALLS_PER_THREAD = 3
PROMPTS = [[5, 9, 11, 40, 3], [7, 12, 60, 33, 8, 21, 14], [30, 31], [44, 3, 90, 17, 66, 5, 9, 11, 70]]


@pytest.fixture(scope="module")
def draft(target) -> torch.nn.Module:
    return derived_drafts(target, 1)[0]


def _call(model: hsd_fast.HSDModel, sampled: bool, prompt: list[int]) -> list[int]:
    options = {"do_sample": True, "seed": len(prompt)} if sampled else {"do_sample": False}
    return model.generate(torch.tensor([prompt]), max_new_tokens=12, **options)[0].tolist()


def _jobs(calls: list[tuple[hsd_fast.HSDModel, bool]]) -> list[tuple]:
    """THREADS * CALLS_PER_THREAD jobs ``(model, sampled, prompt)``, cycling over ``calls`` and the
    prompts."""
    count = THREADS * CALLS_PER_THREAD
    return [(*calls[i % len(calls)], PROMPTS[i % len(PROMPTS)]) for i in range(count)]


def _in_threads(jobs: list[tuple], timeout: float = 120.0) -> list:
    """Each job's output (or the exception it raised), the jobs dealt round-robin to THREADS threads
    that start together. Daemon threads joined with a timeout: a deadlock fails the test instead of
    hanging the suite."""
    results: list = [None] * len(jobs)
    start = threading.Barrier(THREADS)

    def work(first: int) -> None:
        start.wait()
        for i in range(first, len(jobs), THREADS):
            try:
                results[i] = _call(*jobs[i])
            except Exception as err:
                results[i] = err

    threads = [threading.Thread(target=work, args=(t,), daemon=True) for t in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    assert not any(thread.is_alive() for thread in threads), "concurrent generate calls deadlocked"
    return results


def _assert_as_alone(jobs: list[tuple]) -> None:
    alone = [_call(*job) for job in jobs]
    together = _in_threads(jobs)
    for job, expected, got in zip(jobs, alone, together, strict=True):
        assert got == expected, f"prompt {job[2]}: {got!r} concurrently, {expected} alone"


def test_threads_sharing_a_target_get_their_own_outputs(target, draft) -> None:
    """Calls on one target under every kind of level below it (no drafts, a draft, the lookup level,
    a token tree), greedy and seeded sampling, four at a time."""
    calls = [
        (hsd_fast.wrap(target, compile=False), False),
        (hsd_fast.wrap(target, [draft], T=[3], compile=False), True),
        (hsd_fast.wrap(target, ["lookup"], T=[4], compile=False), False),
        (hsd_fast.wrap(target, [draft], tree=hsd_fast.Tree.spine(3, 2), compile=False), False),
        (hsd_fast.wrap(target, [draft], T=[3], compile=False), False),
    ]
    _assert_as_alone(_jobs(calls))


def test_shared_models_at_any_level_and_order(target, draft) -> None:
    """One draft under two targets, the same two models at swapped levels (locks taken in other
    orders would deadlock), and a request naming its target twice (its lock is taken once)."""
    other = tiny_model("llama", seed=1)
    calls = [
        (hsd_fast.wrap(target, [draft], T=[3], compile=False), False),
        (hsd_fast.wrap(other, [draft], T=[2], compile=False), False),
        (hsd_fast.wrap(draft, [target], T=[2], compile=False), True),
        (hsd_fast.wrap(target, [target], T=[2], compile=False), False),
    ]
    _assert_as_alone(_jobs(calls))


def test_a_call_from_inside_a_call_on_its_model_is_refused(target) -> None:
    """A streamer that calls ``generate`` on the model it streams for would wait for its own call: it
    is refused, and the model is free again afterwards."""
    model = hsd_fast.wrap(target, compile=False)

    class Reentrant(BaseStreamer):
        def put(self, value) -> None:
            model.generate(torch.tensor([PROMPTS[0]]), max_new_tokens=2)

        def end(self) -> None:
            pass

    with pytest.raises(RuntimeError, match="same thread"):
        model.generate(torch.tensor([PROMPTS[0]]), streamer=Reentrant(), max_new_tokens=4)
    (after,) = _in_threads([(model, False, PROMPTS[0])])  # a lock left held would time out here
    assert after == _call(model, False, PROMPTS[0])


# ----------------------------------------------------------------------------- one model, two levels
@pytest.mark.parametrize("tree", [None, hsd_fast.Tree.spine(3, 2)], ids=["chain", "tree"])
@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
@pytest.mark.parametrize("aliased", ["target as draft", "draft twice"])
def test_a_model_at_two_levels_runs_as_two_copies_would(target, draft, tree, sampled, aliased) -> None:
    """The same object at two levels gets a cache per level: the output is the one a deep copy at
    the second level gives (greedy: the target's own)."""
    ids = torch.randint(3, target.config.vocab_size, (1, 9), generator=torch.Generator().manual_seed(5))
    options = {"do_sample": sampled, "seed": 3, "max_new_tokens": 24, "compile": False, "tree": tree}
    if aliased == "target as draft":
        same, copied = [target], [copy.deepcopy(target)]
    else:
        same, copied = [draft, draft], [draft, copy.deepcopy(draft)]
    T = None if tree is not None else [2] * len(same)
    out = target.generate(ids, custom_generate=hsd_fast.generate, drafts=same, T=T, **options)
    expected = target.generate(ids, custom_generate=hsd_fast.generate, drafts=copied, T=T, **options)
    assert out.tolist() == expected.tolist()
    if not sampled:
        assert out.tolist() == target.generate(ids, do_sample=False, max_new_tokens=24).tolist()
