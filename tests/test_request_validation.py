"""Requests, valid and invalid.

- Resources before validation: a request is checked before any buffer is sized from it
  (``max_new_tokens=10**8`` and ``T=[10**6]`` used to allocate hundreds of MB, then fail), and the
  buffers are sized by what the request can use.
- A request that exactly fills ``max_position_embeddings`` is served, as HF serves it; one more
  position is refused, naming the level.
- Clear errors: ``input_ids`` as a list, 1-D, float, out of the vocabulary; ``inputs_embeds``; seeds
  beyond 64 bits; ``T`` checked when wrapping; the wrapper survives deepcopy and pickle. (Each
  ``GenerationConfig`` field: tests/test_generation_options.py.)
- Random valid requests (architectures, batch, left padding, T, sampling) give the target's greedy
  output, or a sample without error; random invalid ones raise ValueError or TypeError naming the
  argument, never anything else. The invalid ones run in a subprocess: a crash fails the test instead
  of ending the run.
"""

from __future__ import annotations

import copy
import functools
import os
import pickle
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
from hf_models import ARCHS, derived_drafts, left_padded, tiny_model
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hsd_fast
from hsd_fast.engine import MAX_BLOCK_SIZE, speculative_window

pytestmark = pytest.mark.hf

VOCAB, MAX_POSITIONS = 96, 32  # the tiny models' (tests/hf_models.py); positions kept small
CHILD = "HSD_FAST_INVALID_REQUESTS_CHILD"


@functools.cache
def _models(arch: str) -> tuple[torch.nn.Module, list[torch.nn.Module]]:
    """A target of MAX_POSITIONS positions and two drafts derived from it (accepting often)."""
    target = tiny_model(arch, max_positions=MAX_POSITIONS)
    return target, derived_drafts(target, 2)


def _hsd(target, ids, **kwargs) -> torch.Tensor:
    return target.generate(ids, custom_generate=hsd_fast.generate, compile=False, **kwargs)


# ----------------------------------------------------------------------------- positions
@pytest.mark.parametrize("arch", ["llama", "gpt2"])  # RoPE and a learned position table
def test_a_request_that_exactly_fills_the_positions_is_served(arch) -> None:
    """Rows of different lengths, a multi-token draft step whose rows stop at different points: the
    longest row ends exactly at max_position_embeddings, as HF serves it."""
    target, drafts = _models(arch)
    ids, mask = left_padded([[5, 6, 7, 8, 9, 10, 11], [12, 13], [14, 15, 16, 17]])
    kwargs = {"attention_mask": mask, "do_sample": False, "eos_token_id": None, "pad_token_id": 0}
    kwargs["max_new_tokens"] = MAX_POSITIONS - ids.shape[1]
    expected = target.generate(ids, **kwargs)
    assert expected.shape[1] == MAX_POSITIONS
    for levels, T in ((0, []), (1, [6]), (2, [5, 2])):
        assert _hsd(target, ids, drafts=drafts[2 - levels :], T=T, **kwargs).tolist() == expected.tolist()


def test_a_row_that_stops_early_in_a_draft_step_stays_inside_the_position_table() -> None:
    """In one draft step the rows draw different numbers of tokens; a row at its last position kept
    counting past it while the others drew, and GPT-2's learned position table (32 entries) was
    indexed at 32 and beyond: IndexError. (Found by a random search; this request hits it.)"""
    target, drafts = _models("gpt2")
    ids, mask = left_padded(
        [[59, 69, 36, 10, 73, 4, 14], [95, 54, 93, 88, 83, 3, 81, 66, 45, 34, 44, 93, 11, 27, 75, 31, 33, 21],
         [72, 60, 14, 13, 43, 68, 65, 16, 41, 73, 40, 93, 18, 73, 45, 72]]
    )  # fmt: skip
    kwargs = {"attention_mask": mask, "do_sample": False, "eos_token_id": None, "pad_token_id": 0}
    kwargs["max_new_tokens"] = MAX_POSITIONS - ids.shape[1]
    out = _hsd(target, ids, drafts=drafts[1:], T=[5], **kwargs)
    assert out.tolist() == target.generate(ids, **kwargs).tolist()


def test_one_position_more_is_refused_naming_the_level() -> None:
    target, drafts = _models("llama")
    short = tiny_model("llama", max_positions=MAX_POSITIONS - 4)
    ids = torch.tensor([[5, 6, 7, 8]])
    with pytest.raises(
        ValueError, match=r"= 33 positions, beyond the max_position_embeddings = 32 of the target"
    ):
        _hsd(target, ids, max_new_tokens=MAX_POSITIONS - 3)
    with pytest.raises(ValueError, match=r"max_position_embeddings = 28 of the draft 1 \(LlamaForCausalLM\)"):
        _hsd(target, ids, drafts=[drafts[0], short], T=[2, 2], max_new_tokens=MAX_POSITIONS - 4)


MEMORY_SCRIPT = textwrap.dedent(
    """
    import resource, sys
    sys.path.insert(0, sys.argv[1])
    import torch
    from hf_models import tiny_model, derived_drafts
    import hsd_fast

    target = tiny_model("llama")
    draft = derived_drafts(target, 1)
    ids = torch.tensor([[5, 6, 7, 8]])
    hsd_fast.wrap(target, draft, T=[2]).generate(ids, max_new_tokens=4, do_sample=True, compile=False)
    def peak_mb():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    before = peak_mb()
    for kwargs in ({"max_new_tokens": 10**8}, {"T": [10**6], "max_new_tokens": 8},
                   {"T": [10**6], "max_new_tokens": 8, "do_sample": True}):
        try:
            target.generate(ids, custom_generate=hsd_fast.generate, drafts=draft, compile=False,
                            **{"T": [2], **kwargs})
        except ValueError as err:
            print("refused:", err)
        else:
            raise SystemExit(f"served {kwargs}")
    print("grew MB", peak_mb() - before)
    """
)


def test_oversized_requests_fail_fast_using_little_memory() -> None:
    """In a fresh process, so that its peak memory is this test's: before the fix the first request
    took 766 MB and the last ~1 GB, then failed."""
    done = subprocess.run(
        [sys.executable, "-c", MEMORY_SCRIPT, os.path.dirname(__file__)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert [line.startswith("refused:") for line in lines[:3]] == [True] * 3, done.stdout
    assert "max_new_tokens" in lines[0] and "T must be >= 1 and <= 64" in lines[1]
    assert float(lines[3].split()[-1]) < 50.0, done.stdout


def test_the_ring_is_sized_by_what_the_request_can_use() -> None:
    assert speculative_window([4, 2]) == 16  # 4 + 6 + 2 slots, rounded up to a power of two
    assert speculative_window([MAX_BLOCK_SIZE], max_new_tokens=8) == 16  # not 66: 9 live positions
    assert speculative_window([2], max_new_tokens=100) == 4


# ----------------------------------------------------------------------------- clear errors
@pytest.mark.parametrize(
    ("inputs", "error", "match"),
    [
        ([[5, 6, 7]], TypeError, "input_ids must be a torch.Tensor"),
        (torch.tensor([5, 6, 7]), ValueError, r"input_ids must be \[batch, length\].*input_ids\[None\]"),
        (torch.tensor([[[5, 6]]]), ValueError, r"input_ids must be \[batch, length\]"),
        (torch.tensor([[5.0, 6.0]]), TypeError, "input_ids must hold integer token ids"),
        (torch.tensor([[5, 96]]), ValueError, r"input_ids must lie in \[0, 96\)"),
        (torch.tensor([[-1, 5]]), ValueError, r"input_ids must lie in \[0, 96\)"),
        (torch.zeros(1, 0, dtype=torch.long), ValueError, "at least one token"),
    ],
    ids=["list", "1-D", "3-D", "float", "beyond the vocabulary", "negative", "empty"],
)
def test_bad_input_ids_are_named(inputs, error, match) -> None:
    target, drafts = _models("llama")
    with pytest.raises(error, match=match):
        hsd_fast.wrap(target, drafts, T=[2, 2], compile=False).generate(inputs, max_new_tokens=4)


def test_inputs_embeds_is_refused_clearly() -> None:
    target, _ = _models("llama")
    embeds = torch.randn(1, 3, target.config.hidden_size)
    with pytest.raises(ValueError, match="needs input_ids, not inputs_embeds"):
        target.generate(inputs_embeds=embeds, custom_generate=hsd_fast.generate, max_new_tokens=4)
    with pytest.raises(ValueError, match="needs input_ids, not inputs_embeds"):
        hsd_fast.wrap(target).generate(inputs_embeds=embeds, max_new_tokens=4)


def test_seeds_are_64_bits_never_reduced() -> None:
    target, drafts = _models("llama")
    ids = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
    kwargs = {"drafts": drafts, "T": [2, 2], "do_sample": True, "max_new_tokens": 6, "eos_token_id": None}
    for seed in (2**64, -(2**63) - 1, [1, 2**64]):
        with pytest.raises(ValueError, match=r"seed must lie in \[-2\*\*63, 2\*\*64\)"):
            _hsd(target, ids, seed=seed, **kwargs)
    for seed, error in ((1.5, TypeError), ("7", TypeError), ([1.0, 2.0], TypeError), ([1], ValueError)):
        with pytest.raises(error, match="seed"):
            _hsd(target, ids, seed=seed, **kwargs)
    # the largest seeds are served; one above 2**63 keys the same randomness as the int64 with its bits
    top = _hsd(target, ids, seed=[2**64 - 1, 2**63], **kwargs)
    assert top.tolist() == _hsd(target, ids, seed=torch.tensor([-1, -(2**63)]), **kwargs).tolist()
    assert _hsd(target, ids, seed=2**64 - 1, **kwargs).shape == top.shape


def test_wrap_checks_T_and_drafts_when_made() -> None:
    target, drafts = _models("llama")
    with pytest.raises(ValueError, match="T needs one block size per draft"):
        hsd_fast.wrap(target, drafts, T=[2])
    with pytest.raises(ValueError, match="every block size in T"):
        hsd_fast.wrap(target, drafts, T=[2, 0])
    with pytest.raises(TypeError, match="T must hold ints"):
        hsd_fast.wrap(target, drafts, T=[2, 2.5])
    with pytest.raises(TypeError, match="drafts must be a list of models"):
        hsd_fast.wrap(target, drafts[0])


def test_drafts_given_largest_first_are_served_with_a_warning() -> None:
    """Exact either way (any draft is), so not refused; but drafts[0] larger than the draft verifying
    it is almost surely a list in the wrong order, and the warning names both."""
    from hsd_fast.request import DraftOrderWarning

    target = _models("llama")[0]
    small, large = derived_drafts(target, 3)[:2]  # a copy with layers dropped, a full noisy copy
    ids = torch.tensor([[5, 6, 7]])
    with warnings.catch_warnings():
        warnings.simplefilter("error", DraftOrderWarning)  # smallest first: nothing to say
        expected = _hsd(target, ids, drafts=[small, large], max_new_tokens=6, do_sample=False)
        hsd_fast.wrap(target, ["lookup", small, large])
    with pytest.warns(DraftOrderWarning, match=r"drafts\[0\] \(.*M parameters\) is verified by drafts\[1\]"):
        out = _hsd(target, ids, drafts=[large, small], max_new_tokens=6, do_sample=False)
    assert torch.equal(out, expected)
    with pytest.warns(DraftOrderWarning, match=r"drafts\[1\] .* is verified by drafts\[2\]"):
        hsd_fast.wrap(target, ["lookup", large, small], adapt=True)


@pytest.mark.parametrize(
    "clone", [copy.deepcopy, lambda m: pickle.loads(pickle.dumps(m))], ids=["deepcopy", "pickle"]
)
def test_a_wrapped_model_survives_copy_and_pickle(clone) -> None:
    target, drafts = _models("llama")
    model = hsd_fast.wrap(target, drafts, T=[3, 2], compile=False)
    twin = clone(model)
    assert twin.target is not target and twin.T == [3, 2] and len(twin.drafts) == 2
    assert twin.config.to_dict() == target.config.to_dict()  # attributes still reach the target
    ids = torch.tensor([[5, 6, 7, 8]])
    kwargs = {"do_sample": False, "max_new_tokens": 8}
    assert twin.generate(ids, **kwargs).tolist() == model.generate(ids, **kwargs).tolist()


# ----------------------------------------------------------------------------- random valid requests
SAMPLING = [
    {"do_sample": False},
    {"do_sample": True, "temperature": 0.7},
    {"do_sample": True, "top_k": 5},
    {"do_sample": True, "top_p": 0.8, "temperature": 1.3},
]


@st.composite
def valid_requests(draw) -> dict:
    arch = draw(st.sampled_from(sorted(ARCHS)))
    lengths = draw(st.lists(st.integers(1, 10), min_size=1, max_size=3))
    prompts = [draw(st.lists(st.integers(3, VOCAB - 1), min_size=n, max_size=n)) for n in lengths]
    levels = draw(st.integers(0, 2))
    return {
        "arch": arch,
        "prompts": prompts,
        "levels": levels,
        "T": draw(st.lists(st.integers(1, 6), min_size=levels, max_size=levels)),
        "max_new_tokens": draw(st.integers(1, MAX_POSITIONS - max(lengths))),  # up to every position
        "sampling": draw(st.sampled_from(SAMPLING)),
        "eos_token_id": draw(st.sampled_from([None, 2, [2, 7]])),
        "seed": draw(st.integers(0, 2**64 - 1)),
    }


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_requests())
def test_random_valid_requests(request_: dict) -> None:
    target, drafts = _models(request_["arch"])
    ids, mask = left_padded(request_["prompts"])
    kwargs = {"attention_mask": mask, "max_new_tokens": request_["max_new_tokens"], "pad_token_id": 0}
    kwargs |= {"eos_token_id": request_["eos_token_id"], **request_["sampling"]}
    levels = request_["levels"]
    out = _hsd(target, ids, drafts=drafts[2 - levels :], T=request_["T"], seed=request_["seed"], **kwargs)
    if not kwargs["do_sample"]:
        assert out.tolist() == target.generate(ids, **kwargs).tolist()
    new = out[:, ids.shape[1] :]
    assert out.shape[0] == ids.shape[0] and new.shape[1] <= kwargs["max_new_tokens"]
    assert torch.equal(out[:, : ids.shape[1]], ids) and ((new >= 0) & (new < VOCAB)).all()


# ----------------------------------------------------------------------------- random invalid requests
class _NotAModel:
    pass


# (argument named in the error, what makes the request invalid); each fault alone
FAULTS = {
    "T": [{"T": [0, 2]}, {"T": [2, -1]}, {"T": [2, MAX_BLOCK_SIZE + 1]}, {"T": [2, 10**6]}, {"T": [2]},
          {"T": [2, 2, 2]}, {"T": [2, 2.5]}, {"T": ["2", 2]}, {"T": "22"}, {"T": 2}, {"T": [True, 2]}],
    "drafts": [{"drafts": "draft"}, {"drafts": [None, None]}, {"drafts": [_NotAModel(), _NotAModel()]},
               {"drafts": "model"}],
    "seed": [{"seed": 2**64}, {"seed": -(2**63) - 1}, {"seed": 0.5}, {"seed": "1"}, {"seed": [1]},
             {"seed": [[1, 2]]}, {"seed": [1, 2**70]}, {"seed": torch.tensor([1.0, 2.0])}],
    "max_new_tokens": [{"max_new_tokens": 10**8}, {"max_new_tokens": MAX_POSITIONS}, {"max_new_tokens": -1}],
    "input_ids": [{"input_ids": [[5, 6]]}, {"input_ids": torch.tensor([5, 6])},
                  {"input_ids": torch.tensor([[5.0, 6.0]])}, {"input_ids": torch.tensor([[5, VOCAB]])},
                  {"input_ids": torch.tensor([[-3, 5]])}, {"input_ids": torch.tensor([[[5, 6]]])}],
    "inputs_embeds": [{"inputs_embeds": torch.zeros(1, 2, 64)}],
    "attention_mask": [{"attention_mask": torch.tensor([[1, 1, 0], [1, 1, 1]])},
                       {"attention_mask": torch.tensor([[1, 0, 1], [1, 1, 1]])},
                       {"attention_mask": torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 1, 1]])}],
    "compile": [{"compile": "yes"}, {"compile": 1}],
    "num_beams": [{"num_beams": 2}],
    "num_assistant_tokens": [{"num_assistant_tokens": 5}],
    "prompt_lookup_num_tokens": [{"prompt_lookup_num_tokens": 0}, {"prompt_lookup_num_tokens": 65}],
    "penalty_alpha": [{"penalty_alpha": 0.6, "top_k": 4, "do_sample": False}],
    "dola_layers": [{"dola_layers": "high"}],
    "guidance_scale": [{"guidance_scale": 1.5}],
    "output_attentions": [{"output_attentions": True, "return_dict_in_generate": True}],
    "hierarchy": [{"hierarchy": "best"}],
}  # fmt: skip


@st.composite
def invalid_requests(draw) -> tuple[str, dict, bool]:
    name = draw(st.sampled_from(sorted(FAULTS)))
    fault = draw(st.sampled_from(FAULTS[name]))
    # HF itself chokes on a list or a 1-D tensor (AttributeError, IndexError) before it calls a custom
    # generate: the wrapper checks input_ids first
    wrapped = name == "input_ids" or (draw(st.booleans()) and not {"drafts", "T", "hierarchy"} & set(fault))
    return name, fault, wrapped


def _invalid_request_search() -> None:
    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(invalid_requests())
    def search(case: tuple[str, dict, bool]) -> None:
        name, fault, wrapped = case
        target, drafts = _models("llama")
        request = {"input_ids": torch.tensor([[5, 6, 7], [8, 9, 10]]), "attention_mask": None}
        request |= {"drafts": drafts, "T": [2, 2], "max_new_tokens": 4, "do_sample": True, "seed": 3}
        request |= fault
        if "inputs_embeds" in fault:
            request.pop("input_ids")
        if "hierarchy" in fault:
            request.pop("drafts"), request.pop("T")
        with pytest.raises((ValueError, TypeError)) as caught:
            if wrapped:
                model = hsd_fast.wrap(target, request.pop("drafts"), T=request.pop("T"), compile=False)
                model.generate(**request)
            else:
                target.generate(**request, custom_generate=hsd_fast.generate, compile=False)
        assert name in str(caught.value), f"{fault}: {caught.value!r}"

    search()


def test_random_invalid_requests_raise_errors_naming_the_argument() -> None:
    if os.environ.get(CHILD):
        _invalid_request_search()
        return
    this = f"{__file__}::{test_random_invalid_requests_raise_errors_naming_the_argument.__name__}"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", this],
        capture_output=True,
        text=True,
        env={**os.environ, CHILD: "1"},
        cwd=os.path.dirname(__file__),
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
