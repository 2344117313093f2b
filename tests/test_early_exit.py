"""Early-exit levels (``hsd_fast.EarlyExit``): the target's own first layers as drafts, exact.

The view shares the target's modules (no copy, the target untouched), is cached per ``(target, k)``
and runs like any draft: greedy output equals the target's own, alone, stacked, under other drafts,
with the lookup level, a token tree and a left-padded batch, in several families; sampled output has
the target's distribution, and the planted bug that the general suite catches is caught with exit
levels in the chain too (docs/design.md, "Early-exit levels").
"""

from __future__ import annotations

import copy

import pytest
import torch
from arch_configs import tiny_model as family_model
from enumerated import exact_distribution, hsd_samples
from exit_levels import NEW, deep_model, hsd, prompts
from hf_models import layer_dropped_copy, noisy_copy, tiny_model
from planted_bugs import exit_not_caught_up, residual_stored_as_q

import hsd_fast
from hsd_fast.early_exit import EarlyExit, check_exit_order, decoder_layers_path, exit_of
from hsd_fast.testing.exactness import pooled_chi_square

pytestmark = pytest.mark.hf


@pytest.fixture(scope="module")
def deep() -> torch.nn.Module:
    return deep_model()


def _prompts(model, count: int = 3) -> list[torch.Tensor]:
    return prompts(model, count)


# ----------------------------------------------------------------------------- the view
def test_the_view_shares_the_targets_modules_and_leaves_it_alone(deep) -> None:
    layers = list(deep.model.layers)
    config = deep.config.to_dict()
    view = EarlyExit(deep, 2)
    assert EarlyExit(deep, 2) is view and exit_of(view) == (deep, 2) and exit_of(deep) is None
    assert type(view) is type(deep) and view.config.num_hidden_layers == 2
    assert list(view.model.layers) == layers[:2]  # the same module objects
    assert view.lm_head is deep.lm_head and view.model.norm is deep.model.norm
    recomputing = EarlyExit(deep, 2, reuse=False)
    assert recomputing is not view and exit_of(recomputing) == (deep, 2)
    assert view.model.embed_tokens is deep.model.embed_tokens
    assert list(deep.model.layers) == layers and deep.config.to_dict() == config
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        hidden = deep(ids, output_hidden_states=True).hidden_states[2]  # layer 2's output, before the norm
        expected = deep.lm_head(deep.model.norm(hidden))
        assert torch.allclose(view(ids).logits, expected, atol=1e-5)


def test_the_stats_name_each_level(deep) -> None:
    """``output_hsd_stats``'s summary says what each level is: the lookup level, an exit by its depth,
    a model by its checkpoint name (its class without one)."""
    draft = layer_dropped_copy(noisy_copy(deep, 0.05, seed=1), keep=2)  # smaller than exit 3
    draft.config._name_or_path = "checkpoints/my-draft/"
    out = hsd(deep, _prompts(deep)[0], drafts=["lookup", draft, EarlyExit(deep, 3)], output_hsd_stats=True)
    names = out.hsd_stats.level_names
    assert names == ["lookup", "my-draft", "exit3", "LlamaForCausalLM"]
    assert [line.split()[0] for line in out.hsd_stats.summary().splitlines()[1:5]] == names


def test_bad_exits_are_refused(deep) -> None:
    for k in (0, 6, 2.0, True):
        with pytest.raises(ValueError, match=r"k must be an int in 1\.\.5"):
            EarlyExit(deep, k)
    with pytest.raises(ValueError, match="smallest k first"):
        check_exit_order([EarlyExit(deep, 3), EarlyExit(deep, 1)])
    with pytest.raises(ValueError, match="smallest k first"):
        hsd(deep, _prompts(deep, 1)[0], drafts=[EarlyExit(deep, 3), EarlyExit(deep, 1)], T=[2, 2])


# ----------------------------------------------------------------------------- greedy
HIERARCHIES = {
    "exit alone": lambda t, d: {"drafts": [EarlyExit(t, 2)], "T": [3]},
    "two exits": lambda t, d: {"drafts": [EarlyExit(t, 1), EarlyExit(t, 3)], "T": [2, 3]},
    "draft under an exit": lambda t, d: {"drafts": [d, EarlyExit(t, 3)], "T": [2, 2]},
    "lookup under an exit": lambda t, d: {"drafts": ["lookup", EarlyExit(t, 2)], "T": [3, 2]},
    "tree at an exit": lambda t, d: {
        "drafts": [EarlyExit(t, 2)],
        "T": [3],
        "tree": hsd_fast.Tree.spine(3, 2),
    },
}


@pytest.mark.filterwarnings("ignore::hsd_fast.request.DraftOrderWarning")  # a full draft under an exit
@pytest.mark.parametrize("hierarchy", sorted(HIERARCHIES))
def test_greedy_equals_the_targets_own(deep, hierarchy) -> None:
    draft = noisy_copy(deep, 0.1, seed=1)
    runs = []
    for ids in _prompts(deep):
        expected = deep.generate(ids, do_sample=False, max_new_tokens=NEW)
        out = hsd(deep, ids, output_hsd_stats=True, **HIERARCHIES[hierarchy](deep, draft))
        assert out.sequences.tolist() == expected.tolist()
        runs.append(out.hsd_stats)
    stats = sum(runs[1:], runs[0])
    top = stats.num_levels - 1
    assert stats.corrections[top] > 0 and stats.accepted[top] > 0, stats.summary()  # it accepts and rejects


def test_greedy_left_padded_batch(deep) -> None:
    ids = torch.tensor([[0, 0, 0, 5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16, 17, 18, 19]])
    mask = (torch.arange(9)[None] >= torch.tensor([[3], [0]])).long()
    kwargs = {"attention_mask": mask, "do_sample": False, "max_new_tokens": NEW}
    expected = deep.generate(ids, **kwargs)
    out = hsd(deep, ids, drafts=["lookup", EarlyExit(deep, 1), EarlyExit(deep, 4)], T=[2, 2, 2], **kwargs)
    assert out.tolist() == expected.tolist()


@pytest.mark.parametrize("family", ["gpt2", "qwen2", "gemma2", "phi3"])
def test_families(family) -> None:
    """Families whose layer lists sit elsewhere (``transformer.h``) or whose layers have types
    (gemma2's sliding and full layers: the exit keeps the first ones' types)."""
    model = family_model(family, num_hidden_layers=3)
    assert decoder_layers_path(model) in ("model.layers", "transformer.h")
    ids = torch.randint(3, 64, (1, 8), generator=torch.Generator().manual_seed(0))
    expected = model.generate(ids, do_sample=False, max_new_tokens=16)
    out = hsd(model, ids, drafts=[EarlyExit(model, 1), EarlyExit(model, 2)], T=[2, 2], max_new_tokens=16)
    assert out.tolist() == expected.tolist()


# ----------------------------------------------------------------------------- sampled
V, STEPS, SAMPLES = 6, 3, 5000
PROMPT = torch.tensor([3, 4, 5, 1])


@pytest.fixture(scope="module")
def small() -> torch.nn.Module:
    """A peaked six-layer target over a vocabulary of 6 (its exits then disagree with it often)."""
    return tiny_model("llama", vocab_size=V, layers=6, lm_head_scale=4.0)


@pytest.mark.slow
def test_sampled_is_exact_and_the_planted_bug_is_caught(small) -> None:
    exact = exact_distribution(small, PROMPT, V, STEPS)
    drafts = [EarlyExit(small, 2), EarlyExit(small, 4)]
    samples, stats = hsd_samples(small, drafts, PROMPT, SAMPLES, STEPS)
    assert pooled_chi_square(samples, exact).p_value > 1e-3
    assert all(0 < stats.acceptance_rate(level) < 1 for level in (1, 2)), stats.summary()
    for planted in (residual_stored_as_q, exit_not_caught_up):  # the second: the upper level's reuse
        with planted():
            buggy, _ = hsd_samples(small, drafts, PROMPT, SAMPLES, STEPS)
        assert pooled_chi_square(buggy, exact).p_value < 1e-6, planted.__name__


# ----------------------------------------------------------------------------- HF's spelling
def test_hfs_assistant_early_exit_is_an_exit_level(deep) -> None:
    """``assistant_early_exit=k`` (HF's self-speculation): alone, the hierarchy ``[EarlyExit(t, k)]``;
    with ``drafts``, the exit just under the target; from the model's generation config too."""
    ids = _prompts(deep, 1)[0]
    expected = deep.generate(ids, do_sample=False, max_new_tokens=NEW).tolist()
    alone = hsd(deep, ids, assistant_early_exit=2, output_hsd_stats=True)
    assert alone.sequences.tolist() == expected and alone.hsd_stats.num_levels == 2
    assert alone.hsd_stats.verified[1] > 0
    draft = noisy_copy(deep, 0.1, seed=1)
    stacked = hsd(deep, ids, drafts=[draft], T=[2], assistant_early_exit=3, output_hsd_stats=True)
    assert stacked.sequences.tolist() == expected and stacked.hsd_stats.num_levels == 3
    configured = copy.deepcopy(deep)
    configured.generation_config.assistant_early_exit = 2
    out = hsd(configured, ids, output_hsd_stats=True)
    assert out.sequences.tolist() == expected and out.hsd_stats.num_levels == 2
    with pytest.raises(ValueError, match="k must be an int"):
        hsd(deep, ids, assistant_early_exit=6)
