"""Padded vocabularies keep the target's output exactly.

Drafts may have fewer (or more) logits than the target when one tokenizer's embedding is padded to
different sizes. The old rule cut every level to the smallest size, the target included: where the
target gives its extra ids mass, its output was silently not its own. Now the hierarchy samples
over the target's vocabulary: a draft's missing logits are -inf (q = 0 there), its extra ones cut,
and an id it cannot embed is fed to it as a fixed stand-in (docs/design.md, "Vocabularies").
"""

from __future__ import annotations

import pytest
import torch
from enumerated import exact_distribution, hsd_samples
from hf_models import noisy_copy, tiny_model
from planted_bugs import vocabulary_cut_to_the_smallest

import hsd_fast
from hsd_fast.testing.exactness import pooled_chi_square

pytestmark = pytest.mark.hf

V, EXTRA = 100, 1  # the drafts' vocabulary; the target has EXTRA more ids (1 % padding)
FAVOURITES = (3, 4, 5, V)  # ids the target gives most of its mass, its extra id among them
STEPS, SAMPLES = 2, 2000
PROMPT = torch.tensor([3, 4, 5, 1])


def _target() -> torch.nn.Module:
    """A target of V + EXTRA ids that gives FAVOURITES about half its mass, the extra id the most:
    their head rows lean towards the mean direction of its last hidden states."""
    target = tiny_model("llama", vocab_size=V + EXTRA, lm_head_scale=0.3)
    with torch.no_grad():
        ids = torch.randint(0, V, (8, 12), generator=torch.Generator().manual_seed(0))
        hidden = target.model(ids).last_hidden_state.flatten(0, 1)  # [96, H]
        direction = hidden.mean(0) / hidden.mean(0).norm()  # [H]
        for i, favourite in enumerate(FAVOURITES):
            target.lm_head.weight[favourite] += (1 + 0.3 * i) * direction
    return target


def _cut(model: torch.nn.Module, size: int) -> torch.nn.Module:
    """``model`` with its embedding and head cut to ``size`` ids (as a smaller padding would)."""
    model.resize_token_embeddings(size)
    return model


@pytest.fixture(scope="module")
def models() -> list[torch.nn.Module]:
    target = _target()
    return [_cut(noisy_copy(target, 0.4, seed=1), V), _cut(noisy_copy(target, 0.2, seed=2), V), target]


@pytest.fixture(scope="module")
def exact(models) -> dict[tuple[int, ...], float]:
    """The target's distribution over all continuations, enumerated."""
    vocab = models[-1].get_output_embeddings().weight.shape[0]
    return exact_distribution(models[-1], PROMPT, vocab, STEPS)


def test_the_target_gives_its_extra_id_mass(models, exact) -> None:
    """What makes the tests below bite: the extra id is likely, and the drafts cannot emit it."""
    mass = sum(p for cont, p in exact.items() if V in cont)
    assert 0.2 < mass < 0.8
    assert all(m.get_output_embeddings().weight.shape[0] == V for m in models[:-1])


@pytest.mark.parametrize("levels", [1, 2])
def test_greedy_equals_the_target_where_it_prefers_an_extra_id(models, levels) -> None:
    *drafts, target = models
    ids = torch.tensor([[3, 4, 5, 1], [7, 8, 9, 10]])
    kwargs = {"do_sample": False, "max_new_tokens": 24, "eos_token_id": None}
    expected = target.generate(ids, **kwargs)
    assert (expected[:, ids.shape[1] :] == V).any()  # the target's greedy output uses its extra id
    out = target.generate(
        ids, custom_generate=hsd_fast.generate, drafts=drafts[-levels:], T=[2] * levels, compile=False,
        **kwargs,
    )  # fmt: skip
    assert out.tolist() == expected.tolist()


def test_sampling_is_exact_over_the_targets_vocabulary(models, exact) -> None:
    *drafts, target = models
    samples, stats = hsd_samples(target, drafts, PROMPT, SAMPLES, STEPS)
    assert pooled_chi_square(samples, exact).p_value > 1e-3
    assert all(0 < stats.acceptance_rate(level) < 1 for level in (1, 2))


def test_the_old_rule_fails_the_same_test(models, exact) -> None:
    """Cutting the target to the drafts' vocabulary never draws its extra id: caught at p < 1e-6."""
    *drafts, target = models
    with vocabulary_cut_to_the_smallest():
        samples, _ = hsd_samples(target, drafts, PROMPT, SAMPLES, STEPS)
    assert pooled_chi_square(samples, exact).p_value < 1e-6


def test_a_draft_with_more_ids_is_cut_to_the_target(models) -> None:
    """The other way round: a draft whose padding ids are its favourites never proposes them."""
    target = tiny_model("llama", vocab_size=1000)
    padded = tiny_model("llama", vocab_size=1008, seed=1)
    with torch.no_grad():
        padded.lm_head.weight[1000:] = 10 * padded.lm_head.weight[:8].abs()
    ids = torch.tensor([[5, 6, 7, 8]])
    kwargs = {"do_sample": False, "max_new_tokens": 8, "eos_token_id": None}
    out = target.generate(
        ids, custom_generate=hsd_fast.generate, drafts=[padded], T=[2], compile=False, **kwargs
    )
    assert out.tolist() == target.generate(ids, **kwargs).tolist()
