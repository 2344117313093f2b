"""`hsd_fast.wrap` / `HSDModel` (hsd_fast/wrapper.py): the target's attributes through the wrapper,
its drafts and block sizes reaching the engine, streaming, and what it refuses."""

import dataclasses
import warnings

import pytest
import torch
from hf_models import left_padded
from transformers.generation.streamers import BaseStreamer

import hsd_fast
from hsd_fast.hf_generate import HSDGenerateOutput
from hsd_fast.hierarchy_types import HierarchyBatchWarning, Selection
from hsd_fast.request import DEFAULT_T
from hsd_fast.wrapper import HSDModel

pytestmark = pytest.mark.hf

PROMPT = [5, 9, 11, 40, 3, 7, 12, 60, 33]


def _counters(stats: hsd_fast.HSDStats) -> dict:
    """Everything the run counted, without the host clock."""
    return {k: v for k, v in dataclasses.asdict(stats).items() if k not in ("wall_time", "step_time")}


# ----------------------------------------------------------------------------- construction
def test_attributes_are_the_targets(target, drafts) -> None:
    model = hsd_fast.wrap(target, drafts)
    assert isinstance(model, HSDModel)
    assert model.config is target.config and model.generation_config is target.generation_config
    assert model.device == target.device and model.dtype == target.dtype
    assert model.get_output_embeddings() is target.get_output_embeddings()  # methods too
    with pytest.raises(AttributeError, match="no_such_attribute"):
        _ = model.no_such_attribute
    # the wrapper's own attributes are not the target's
    assert model.target is target and model.drafts == drafts and model.drafts is not drafts


def test_block_sizes_default_per_draft(target, drafts) -> None:
    assert hsd_fast.wrap(target, drafts).T == [DEFAULT_T, DEFAULT_T]
    assert hsd_fast.wrap(target, drafts, T=(3, 2)).T == [3, 2]
    assert hsd_fast.wrap(target).drafts == [] and hsd_fast.wrap(target).T == []


def _hierarchy(target, drafts, batch: int = 1) -> hsd_fast.Hierarchy:
    """What select_hierarchy(..., batch=batch) would return had it picked both drafts with T = [3, 2]."""
    return hsd_fast.Hierarchy.bind(
        Selection(chain=(0, 1, 2), T=(3, 2), predicted_latency=1.0), [*drafts, target], batch
    )


def test_hierarchy_sets_drafts_and_block_sizes(target, drafts) -> None:
    pick = _hierarchy(target, drafts)
    model = hsd_fast.wrap(target, hierarchy=pick)
    assert model.drafts == drafts and model.T == [3, 2]


@pytest.mark.parametrize("extra", [{"drafts": "drafts"}, {"T": [3, 2]}], ids=["drafts", "T"])
def test_hierarchy_excludes_drafts_and_T(target, drafts, extra) -> None:
    pick = _hierarchy(target, drafts)
    extra = {k: drafts if v == "drafts" else v for k, v in extra.items()}
    with pytest.raises(ValueError, match="either hierarchy= or drafts=/T=/tree=, not both"):
        hsd_fast.wrap(target, hierarchy=pick, **extra)


@pytest.mark.parametrize("through", ["wrap", "generate"])
def test_a_hierarchy_run_at_another_batch_warns(target, drafts, through) -> None:
    """Selected for 2 rows: running 2 is quiet, running 1 or 3 warns (and still runs)."""
    pick = _hierarchy(target, drafts, batch=2)
    kwargs = {"do_sample": False, "max_new_tokens": 2, "eos_token_id": None, "compile": False}

    def run(rows: int) -> torch.Tensor:
        ids = torch.tensor([PROMPT] * rows)
        if through == "wrap":
            return hsd_fast.wrap(target, hierarchy=pick).generate(ids, **kwargs)
        return target.generate(ids, custom_generate=hsd_fast.generate, hierarchy=pick, **kwargs)

    with warnings.catch_warnings():
        warnings.simplefilter("error", HierarchyBatchWarning)
        assert run(2).shape == (2, len(PROMPT) + 2)
    for rows in (1, 3):
        with pytest.warns(HierarchyBatchWarning, match=f"selected for batch 2 and runs a batch of {rows}"):
            assert run(rows).shape == (rows, len(PROMPT) + 2)


# ----------------------------------------------------------------------------- generate
@pytest.mark.parametrize("name", ["custom_generate", "assistant_model", "drafts", "T", "hierarchy"])
def test_per_call_hierarchy_changes_are_refused(target, drafts, name) -> None:
    value = {"custom_generate": hsd_fast.generate, "assistant_model": target, "drafts": drafts[:1]}
    value |= {"T": [1, 1], "hierarchy": _hierarchy(target, drafts)}
    with pytest.raises(ValueError, match=f"HSDModel.generate: {name}= is set by the wrapper, not per call"):
        hsd_fast.wrap(target, drafts).generate(torch.tensor([[5, 6]]), **{name: value[name]})


def test_greedy_batch_equals_the_targets_generate(target, drafts) -> None:
    ids, mask = left_padded([PROMPT, [8, 9, 10, 11], [70, 71, 3, 4, 5, 6]])
    kwargs = {"attention_mask": mask, "do_sample": False, "max_new_tokens": 16, "eos_token_id": None}
    out = hsd_fast.wrap(target, drafts, T=[2, 2]).generate(ids, **kwargs)
    assert out.tolist() == target.generate(ids, **kwargs).tolist()
    out = hsd_fast.wrap(target, drafts, T=[2, 2]).generate(input_ids=ids, **kwargs)  # by keyword
    assert out.tolist() == target.generate(ids, **kwargs).tolist()


@pytest.mark.parametrize("do_sample", [False, True], ids=["greedy", "sampled"])
def test_the_wrappers_drafts_and_block_sizes_reach_the_engine(target, drafts, do_sample) -> None:
    """Greedy output is the target's whatever the drafts: the run's counters show which ran."""
    ids = torch.tensor([PROMPT])
    kwargs = {"do_sample": do_sample, "max_new_tokens": 24, "eos_token_id": None, "seed": 7}
    kwargs |= {"output_hsd_stats": True}
    wrapped = hsd_fast.wrap(target, drafts, T=[2, 3]).generate(ids, **kwargs)
    direct = target.generate(ids, custom_generate=hsd_fast.generate, drafts=drafts, T=[2, 3], **kwargs)
    assert isinstance(wrapped, HSDGenerateOutput) and wrapped.hsd_stats.num_levels == 3
    assert wrapped.sequences.tolist() == direct.sequences.tolist()
    assert _counters(wrapped.hsd_stats) == _counters(direct.hsd_stats)
    other = target.generate(ids, custom_generate=hsd_fast.generate, drafts=drafts, T=[3, 2], **kwargs)
    assert _counters(wrapped.hsd_stats) != _counters(other.hsd_stats)  # the counters tell T apart


# ----------------------------------------------------------------------------- streaming
class _Recorder(BaseStreamer):
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def put(self, value: torch.Tensor) -> None:
        self.calls.append(("put", value.tolist()))

    def end(self) -> None:
        self.calls.append(("end",))


def test_wrap_streams_prompt_then_committed_tokens_then_end(target, drafts) -> None:
    model = hsd_fast.wrap(target, drafts, T=[2, 2])
    assert model.config is target.config and model.device == target.device
    ids = torch.tensor([PROMPT])
    streamer = _Recorder()
    out = model.generate(ids, streamer=streamer, do_sample=False, max_new_tokens=20)
    assert out.tolist() == target.generate(ids, do_sample=False, max_new_tokens=20).tolist()
    assert streamer.calls[0] == ("put", [PROMPT])  # HF's shape: [1, prompt]
    assert streamer.calls[-1] == ("end",)
    streamed = [tok for call in streamer.calls[1:-1] for tok in call[1]]
    assert streamed == out[0, ids.shape[1] :].tolist()
    assert len(streamer.calls) > 3  # committed in several pieces, as the target verified them


@pytest.mark.parametrize("by_keyword", [False, True], ids=["positional", "input_ids="])
def test_wrap_refuses_a_streamer_with_batch_above_one(target, by_keyword) -> None:
    ids, mask = left_padded([PROMPT, [8, 9, 10, 11]])
    streamer = _Recorder()
    inputs = {"input_ids": ids} if by_keyword else {"inputs": ids}
    with pytest.raises(ValueError, match="batch size 1"):
        hsd_fast.wrap(target, []).generate(attention_mask=mask, streamer=streamer, **inputs)
    assert streamer.calls == [("end",)]  # refused before anything was streamed, and ended all the same
