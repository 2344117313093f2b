"""Stopping criteria (``stop_strings``, a user's ``StoppingCriteria``, ``max_time``), served as HF's
unassisted ``generate`` serves them (docs/design.md, "EOS, the length budget and flushing").

The reference is ``model.generate`` without ``custom_generate``, greedy, fp32: the same tokens, and the
criteria called the same number of times with the same ``input_ids`` (left padding, pad-filled
finished rows and all) and ``scores=None``.

- A criterion firing inside a block the target accepted stops the row there, with one draft, two
  drafts, a lookup level, a token tree and an adaptive run; a planted checker that keeps the whole
  block gives other tokens, so the comparison catches it.
- A left-padded batch whose rows stop apart, with an EOS (stopped rows padded) and without one (HF
  then keeps every row's own tokens until the last row stops).
- Stop strings that span two tokens on every spelling: ``stop_tokenizer=`` through ``target.generate``,
  ``tokenizer=`` through ``hsd_fast.wrap`` (and a config's ``stop_strings``), a direct call; without a
  tokenizer, a refusal naming the remedy. Run on transformers 5.24 and 5.17.
- ``max_time``: zero gives HF's single token; a small budget a strict prefix of the greedy output.
- Without extra criteria no checker is built; a criterion that reads scores is refused.
"""

from __future__ import annotations

import pytest
import torch
from hf_models import left_padded
from transformers import GenerationConfig, StoppingCriteria, StoppingCriteriaList
from transformers.generation.stopping_criteria import ConfidenceCriteria

import hsd_fast
from hsd_fast import stopping
from hsd_fast.request import build_request, resolve_levels

pytestmark = pytest.mark.hf

NEW = 30
PROMPT = torch.tensor([[5, 6, 7, 8]])
PROMPTS = [
    [5, 9, 11, 40, 3, 7, 12, 60, 33],
    [8, 9, 10, 11],
    [70, 71, 3, 4, 5, 6],
    [20, 19, 18, 50, 51, 52, 53],
]


class StopAfter(StoppingCriteria):
    """Stops a row right after it generated ``ids[row]``; records every call as HF makes it."""

    def __init__(self, ids: list[int]) -> None:
        self.ids, self.calls = torch.tensor(ids), []

    def __call__(self, input_ids, scores, **kwargs):
        self.calls.append((input_ids.clone(), scores))
        return input_ids[:, -1] == self.ids


def _same_calls(hf: StopAfter, hsd: StopAfter) -> bool:
    return len(hf.calls) == len(hsd.calls) and all(
        torch.equal(a, b) and s is None and t is None
        for (a, s), (b, t) in zip(hf.calls, hsd.calls, strict=True)
    )


def _hsd(target, ids, **kwargs):
    kwargs = {"do_sample": False, "max_new_tokens": NEW, "compile": False, **kwargs}
    return target.generate(ids, custom_generate=hsd_fast.generate, **kwargs)


def _first_new_at(row: list[int], step: int) -> int:
    """A step at or after ``step`` (1-based) whose token appears there first in ``row``."""
    while row[step - 1] in row[: step - 1]:
        step += 1
    return step


@pytest.fixture(scope="module")
def greedy(target) -> list[int]:
    """The target's greedy continuation of PROMPT, with no stop."""
    return target.generate(PROMPT, do_sample=False, max_new_tokens=NEW, eos_token_id=None)[0, 4:].tolist()


HIERARCHIES = {
    "one draft": lambda d: {"drafts": d[1:], "T": [4]},
    "two drafts": lambda d: {"drafts": d, "T": [3, 3]},
    "lookup": lambda d: {"drafts": ["lookup", d[1]], "T": [4, 3]},
    "tree": lambda d: {"drafts": d[1:], "T": [3], "tree": hsd_fast.Tree.full([2, 2, 1])},
    "adaptive": lambda d: {"drafts": d, "adapt": True},
}


STEPS = (8, 10)  # the stop steps: each hierarchy accepts a block past one of them (checked below)


@pytest.fixture(scope="module")
def hf_stops(target, greedy) -> dict[int, tuple[torch.Tensor, StopAfter]]:
    """Per step of STEPS: HF's output with a criterion that stops after that step's token, and the
    criterion (with the calls HF made)."""
    stops = {}
    for step in STEPS:
        criterion = StopAfter([greedy[step - 1]])
        expected = target.generate(
            PROMPT, do_sample=False, max_new_tokens=NEW, stopping_criteria=StoppingCriteriaList([criterion])
        )
        assert expected.shape[1] == PROMPT.shape[1] + step
        stops[step] = expected, criterion
    return stops


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("hierarchy", list(HIERARCHIES))
def test_a_criterion_firing_inside_an_accepted_block_stops_there(
    target, drafts, greedy, hf_stops, hierarchy, step
) -> None:
    expected, hf_stop = hf_stops[step]
    hsd_stop = StopAfter([greedy[step - 1]])
    out = _hsd(
        target, PROMPT, stopping_criteria=StoppingCriteriaList([hsd_stop]), **HIERARCHIES[hierarchy](drafts)
    )
    assert out.tolist() == expected.tolist()
    assert _same_calls(hf_stop, hsd_stop)


@pytest.mark.parametrize("hierarchy", list(HIERARCHIES))
def test_a_checker_that_keeps_the_whole_block_is_caught(
    target, drafts, greedy, hf_stops, hierarchy, monkeypatch
) -> None:
    """Planted: a stopped row keeps everything the target committed (the block past the stop). The
    comparison of the test above fails on it at one of its steps at least: there the target accepted
    a block past the stop."""
    monkeypatch.setattr(
        stopping.StopChecker, "limits", property(lambda self: self.prompt_lens + stopping.np.int64(10**9))
    )
    caught = []
    for step in STEPS:
        expected = hf_stops[step][0]
        out = _hsd(
            target, PROMPT, stopping_criteria=StoppingCriteriaList([StopAfter([greedy[step - 1]])]),
            **HIERARCHIES[hierarchy](drafts),
        )  # fmt: skip
        assert out[:, : expected.shape[1]].tolist() == expected.tolist()  # the same up to the stop
        caught.append(out.shape[1] > expected.shape[1])
    assert any(caught), "no stop fell inside an accepted block"


@pytest.mark.parametrize("eos", ["none", "row 1's"])
@pytest.mark.parametrize("hierarchy", ["two drafts", "lookup", "adaptive"])
def test_left_padded_rows_stop_apart(target, drafts, eos, hierarchy) -> None:
    """Each row stops after its own token, at its own step; with an EOS the stopped rows are padded,
    without one HF keeps their tokens until the last row stops (and so does hsd_fast)."""
    ids, mask = left_padded(PROMPTS)
    free = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=NEW, eos_token_id=None)
    rows = free[:, ids.shape[1] :].tolist()
    steps = [_first_new_at(row, s) for row, s in zip(rows, (20, 9, 2, 3), strict=True)]
    stop_ids = [row[s - 1] for row, s in zip(rows, steps, strict=True)]
    eos_id = None if eos == "none" else rows[1][_first_new_at(rows[1], 6) - 1]
    kwargs = {"attention_mask": mask, "do_sample": False, "max_new_tokens": NEW, "eos_token_id": eos_id}
    hf_stop, hsd_stop = StopAfter(stop_ids), StopAfter(stop_ids)
    expected = target.generate(ids, stopping_criteria=StoppingCriteriaList([hf_stop]), **kwargs)
    levels = HIERARCHIES[hierarchy](drafts)
    out = _hsd(target, ids, stopping_criteria=StoppingCriteriaList([hsd_stop]), **levels, **kwargs)
    assert out.tolist() == expected.tolist()
    assert _same_calls(hf_stop, hsd_stop)
    assert expected.shape[1] < ids.shape[1] + NEW  # every row stopped before the budget
    if hierarchy == "two drafts" and eos_id is not None:  # a direct call merges the criteria into HF's
        # (None stands for unset there: the model's EOS would apply)
        direct_stop = StopAfter(stop_ids)
        direct = hsd_fast.generate(
            target,
            ids,
            stopping_criteria=StoppingCriteriaList([direct_stop]),
            compile=False,
            **levels,
            **kwargs,
        )
        assert direct.tolist() == expected.tolist() and _same_calls(hf_stop, direct_stop)
    if eos_id is not None:
        assert (expected[:, -1] == 0).sum() >= 2, "rows stopped apart are padded"


def test_the_streamer_gets_only_the_tokens_kept(target, drafts, greedy, hf_stops) -> None:
    """Tokens the target accepted past a stop are cut before the streamer sees them."""

    class Recorder:
        def __init__(self) -> None:
            self.puts, self.ended = [], 0

        def put(self, value) -> None:
            self.puts.append(value.reshape(-1).tolist())

        def end(self) -> None:
            self.ended += 1

    for step in STEPS:
        expected = hf_stops[step][0]
        streamer = Recorder()
        out = hsd_fast.wrap(target, drafts, T=[3, 3], compile=False).generate(
            PROMPT, do_sample=False, max_new_tokens=NEW, streamer=streamer,
            stopping_criteria=StoppingCriteriaList([StopAfter([greedy[step - 1]])]),
        )  # fmt: skip
        assert out.tolist() == expected.tolist() and streamer.ended == 1
        assert [t for put in streamer.puts for t in put] == expected[0].tolist()


def test_sampled_rows_stop_at_their_first_stop_token(target, drafts) -> None:
    ids, mask = left_padded(PROMPTS)
    stop_ids = [7, 38, 3, 86]
    out = _hsd(
        target, ids, attention_mask=mask, do_sample=True, seed=[1, 2, 3, 4], drafts=drafts, T=[3, 2],
        eos_token_id=2, pad_token_id=0, stopping_criteria=StoppingCriteriaList([StopAfter(stop_ids)]),
    )  # fmt: skip
    for row, stop_id in zip(out[:, ids.shape[1] :].tolist(), stop_ids, strict=True):
        ends = [i for i, t in enumerate(row) if t in (stop_id, 2)]
        if ends:
            assert all(t == 0 for t in row[ends[0] + 1 :]), row


# ----------------------------------------------------------------------------- stop strings
@pytest.fixture(scope="module")
def tokenizer():
    from hsd_fast import zoo

    return zoo.load_tokenizer()


def test_stop_strings_across_token_boundaries_on_every_spelling(target, drafts, tokenizer) -> None:
    ids, mask = left_padded(PROMPTS[:2])
    free = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=NEW, eos_token_id=None)
    stop = []  # per row, the text of two consecutive tokens, neither of which holds it alone
    for row, start in zip(free[:, ids.shape[1] :].tolist(), (20, 9), strict=True):
        step = _first_new_at(row, start)
        stop.append(tokenizer.decode(row[step - 1 : step + 1]))
        assert all(stop[-1] not in tokenizer.decode([t]) for t in row[step - 1 : step + 1])
    fields = {"do_sample": False, "max_new_tokens": NEW, "eos_token_id": 2}
    common = {"attention_mask": mask, **fields}
    expected = target.generate(ids, stop_strings=stop, tokenizer=tokenizer, **common)
    assert expected.shape[1] < ids.shape[1] + NEW
    levels = {"drafts": drafts, "T": [3, 2], "compile": False}
    spellings = {
        "target.generate, stop_tokenizer=": lambda: target.generate(
            ids, custom_generate=hsd_fast.generate, stop_strings=stop, stop_tokenizer=tokenizer, **levels,
            **common,
        ),
        "wrap, tokenizer=": lambda: hsd_fast.wrap(target, **levels).generate(
            ids, stop_strings=stop, tokenizer=tokenizer, **common
        ),
        "wrap, a config's stop_strings": lambda: hsd_fast.wrap(target, **levels).generate(
            ids, generation_config=GenerationConfig(stop_strings=stop, **fields), tokenizer=tokenizer,
            attention_mask=mask,
        ),
        "direct, tokenizer=": lambda: hsd_fast.generate(
            target, ids, stop_strings=stop, tokenizer=tokenizer, **levels, **common
        ),
    }  # fmt: skip
    for name, call in spellings.items():
        assert call().tolist() == expected.tolist(), name


def test_stop_strings_without_a_tokenizer_name_the_remedy(target, drafts, tokenizer) -> None:
    with pytest.raises(ValueError, match="stop_tokenizer="):
        _hsd(target, PROMPT, drafts=drafts, stop_strings=["ab"])
    with pytest.raises(ValueError, match="stop_tokenizer="):  # HF drops tokenizer= before hsd_fast
        _hsd(target, PROMPT, drafts=drafts, stop_strings=["ab"], tokenizer=tokenizer)
    with pytest.raises(ValueError, match="tokenizer"):
        hsd_fast.wrap(target, drafts, compile=False).generate(PROMPT, stop_strings=["ab"])


# ----------------------------------------------------------------------------- max_time
def test_max_time(target, drafts, greedy) -> None:
    """Checked when the target commits: zero stops after the first token, as in HF; a budget far
    below the run's time returns a strict prefix of the greedy output."""
    expected = target.generate(PROMPT, do_sample=False, max_new_tokens=NEW, max_time=0.0)
    assert expected.shape[1] == 5
    assert _hsd(target, PROMPT, drafts=drafts, max_time=0.0).tolist() == expected.tolist()
    new = 60
    full = target.generate(PROMPT, do_sample=False, max_new_tokens=new, eos_token_id=None)
    out = _hsd(target, PROMPT, drafts=drafts, T=[2, 2], max_new_tokens=new, eos_token_id=None, max_time=0.01)
    assert 4 < out.shape[1] < 4 + new and out.tolist()[0] == full[0, : out.shape[1]].tolist()


# ----------------------------------------------------------------------------- what is built
def test_no_checker_without_extra_criteria(target, drafts, monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("a StopChecker was built for max length and EOS alone")

    monkeypatch.setattr(stopping.StopChecker, "__init__", refuse)
    request = build_request(target, PROMPT, resolve_levels(drafts, [2, 2]), generation_config=None)
    assert request.stopping is None
    _hsd(target, PROMPT, drafts=drafts, eos_token_id=[2, 3], max_new_tokens=8)


def test_a_criterion_that_reads_scores_is_refused(target, drafts) -> None:
    with pytest.raises(ValueError, match="ConfidenceCriteria"):
        _hsd(target, PROMPT, drafts=drafts, stopping_criteria=StoppingCriteriaList([ConfidenceCriteria(0.5)]))
