"""HF's assisted-generation options map onto the hierarchy (docs/design.md, "HF's assisted generation
options"): ``num_assistant_tokens`` is the block size of the level under the target,
``prompt_lookup_num_tokens`` adds the lookup level (``max_matching_ngram_size`` its longest n-gram),
``assistant_model`` is the one draft (``target.generate`` and ``hsd_fast.wrap``), and
``assistant_early_exit`` adds an exit level (``tests/test_early_exit.py``). Each from the call and from
the checkpoint's ``generation_config``; greedy output stays the target's; conflicting settings are
refused naming both.
"""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import GenerationConfig

import hsd_fast
from hsd_fast.lookup import LookupDraft
from hsd_fast.request import DEFAULT_T, resolve_levels, with_assisted_generation

pytestmark = pytest.mark.hf

IDS = torch.tensor([[5, 6, 7, 8, 5, 6, 7, 9, 10]])
NEW = 12


def _levels(target, config: GenerationConfig, **given):
    return with_assisted_generation(resolve_levels(**given), target, config)


def test_num_assistant_tokens_is_the_block_size_under_the_target(target, drafts) -> None:
    config = GenerationConfig(num_assistant_tokens=3)
    assert _levels(target, config, drafts=drafts).T == (DEFAULT_T, 3)
    assert _levels(target, config, drafts=drafts, T=[2, 3]).T == (2, 3)  # agreeing with T= is fine
    with pytest.raises(ValueError, match=r"num_assistant_tokens=3 and T=\[2, 5\]"):
        _levels(target, config, drafts=drafts, T=[2, 5])
    assert _levels(target, GenerationConfig(num_assistant_tokens=20), drafts=drafts, T=[2, 5]).T == (2, 5)
    assert _levels(target, config).T == ()  # no draft: no effect, as in HF
    with pytest.raises(ValueError, match="num_assistant_tokens with adapt="):
        _levels(target, config, drafts=drafts, adapt=True)


def test_prompt_lookup_num_tokens_adds_the_lookup_level(target, drafts) -> None:
    alone = _levels(target, GenerationConfig(prompt_lookup_num_tokens=5))
    assert (alone.proposal, alone.T) == (LookupDraft(max_ngram=2), (5,))  # HF's default n-gram: 2
    config = GenerationConfig(prompt_lookup_num_tokens=5, max_matching_ngram_size=1, num_assistant_tokens=3)
    under = _levels(target, config, drafts=drafts[1:])
    assert (under.proposal, under.models, under.T) == (LookupDraft(max_ngram=1), tuple(drafts[1:]), (5, 3))
    with pytest.raises(ValueError, match="drafts= has one"):
        _levels(target, config, drafts=["lookup", drafts[1]])
    with pytest.raises(ValueError, match="prompt_lookup_num_tokens with tree="):
        _levels(target, config, drafts=drafts, tree=hsd_fast.Tree.spine(2, 2))
    with pytest.raises(ValueError, match="prompt_lookup_num_tokens"):
        _levels(target, GenerationConfig(prompt_lookup_num_tokens=0))
    with pytest.raises(ValueError, match="max_matching_ngram_size=99: LookupDraft: need"):
        _levels(target, GenerationConfig(prompt_lookup_num_tokens=2, max_matching_ngram_size=99))


def _hsd(model, **kwargs):
    return model.generate(
        IDS, custom_generate=hsd_fast.generate, compile=False, do_sample=False, max_new_tokens=NEW,
        output_hsd_stats=True, return_dict_in_generate=True, **kwargs,
    )  # fmt: skip


def test_each_spelling_decodes_the_targets_greedy_tokens(target, drafts) -> None:
    expected = target.generate(IDS, do_sample=False, max_new_tokens=NEW).tolist()
    assert target.generate(IDS, do_sample=False, max_new_tokens=NEW, prompt_lookup_num_tokens=3).tolist() == (
        expected
    )  # HF's own prompt lookup
    cases = {
        "num_assistant_tokens": ({"drafts": drafts[1:], "num_assistant_tokens": 3}, [0, 3]),
        "prompt_lookup_num_tokens": ({"prompt_lookup_num_tokens": 5}, [0, 5]),
        "assistant_model": ({"assistant_model": drafts[1]}, [0, DEFAULT_T]),
    }
    for name, (kwargs, widths) in cases.items():
        out = _hsd(target, **kwargs)
        assert out.sequences.tolist() == expected, name
        stats = out.hsd_stats
        assert stats.num_levels == 2 and sum(stats.verified) > 0, name  # a draft level ran
        assert [len(v) for v in stats.verified_at] == widths, name  # ...with that block size


def test_from_the_checkpoints_generation_config(target, drafts) -> None:
    configured = copy.deepcopy(target)
    configured.generation_config.prompt_lookup_num_tokens = 4
    configured.generation_config.num_assistant_tokens = 2
    expected = target.generate(IDS, do_sample=False, max_new_tokens=NEW).tolist()
    out = _hsd(configured, drafts=drafts[1:])
    assert out.sequences.tolist() == expected
    # the lookup level under the draft, proposing blocks of 4 (its proposals continue the prompt's loop)
    assert out.hsd_stats.num_levels == 3 and len(out.hsd_stats.verified_at[1]) == 4
    # the draft's block size is 2 (the target's verifications are wider when a lookup block verified
    # by the draft hands it more: what it verifies does not show T)
    levels = with_assisted_generation(resolve_levels(drafts[1:]), configured, configured.generation_config)
    assert levels.T == (4, 2) and isinstance(levels.proposal, LookupDraft)


def test_assistant_model_is_the_one_draft(target, drafts) -> None:
    assert hsd_fast.wrap(target, assistant_model=drafts[0]).drafts == [drafts[0]]
    with pytest.raises(ValueError, match="assistant_model= is the one draft"):
        hsd_fast.wrap(target, drafts[1:], assistant_model=drafts[0])
    with pytest.raises(ValueError, match="assistant_model= is the one draft"):
        _hsd(target, drafts=drafts[1:], assistant_model=drafts[0])
