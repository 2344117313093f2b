"""HF's ``min_new_tokens`` and ``min_length``, served exactly at every level (docs/design.md,
"Sampling transforms"): EOS is banned wherever the token a column predicts would come too early.

The reference is HF's own unassisted ``generate``: greedy output token for token with two drafts, a
lookup level and a token tree, in a left-padded batch whose rows would otherwise stop early; sampled
output against the exact distribution with the ban, enumerated, with a planted bug (the ban held one
token too long) that the same test catches.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from hf_models import level_configs, padded_batch, peaked_family
from planted_bugs import lengths_one_token_late

import hsd_fast
from hsd_fast.testing.exactness import pooled_chi_square

pytestmark = pytest.mark.hf

NEW = 24


@pytest.mark.parametrize("option", ["min_new_tokens", "min_length"])
def test_greedy_left_padded_batch_equals_hf(target, drafts, option) -> None:
    """Rows that would stop at their 4th and 6th new tokens: the ban holds EOS off until 12 new
    tokens (min_length counts the padded prompt's 9 columns too)."""
    ids, mask = padded_batch()
    kwargs = {"attention_mask": mask, "do_sample": False, "max_new_tokens": NEW}
    free = target.generate(ids, eos_token_id=None, **kwargs)
    eos = int(free[1, 9 + 3])  # row 1 stops at its 4th new token without the ban
    floor = {"min_new_tokens": 12, "min_length": 9 + 12}[option]
    without = target.generate(ids, eos_token_id=eos, **kwargs)
    expected = target.generate(ids, eos_token_id=eos, **{option: floor}, **kwargs)
    assert expected.tolist() != without.tolist(), (
        "the ban changes nothing: the test cannot tell it is applied"
    )
    for levels, config in level_configs(drafts).items():
        out = target.generate(
            ids, custom_generate=hsd_fast.generate, eos_token_id=eos, compile=False, **{option: floor},
            **kwargs, **config,
        )  # fmt: skip
        assert out.tolist() == expected.tolist(), levels


def test_with_a_history_processor_beside_it(target, drafts) -> None:
    """The ban and the repetition penalty in one request: each applied in its place."""
    ids, mask = padded_batch()
    kwargs = {"attention_mask": mask, "do_sample": False, "max_new_tokens": NEW, "repetition_penalty": 1.3}
    free = target.generate(ids, eos_token_id=None, **kwargs)
    eos = int(free[1, 9 + 3])
    expected = target.generate(ids, eos_token_id=eos, min_new_tokens=12, **kwargs)
    assert expected.tolist() != target.generate(ids, eos_token_id=eos, **kwargs).tolist()
    out = target.generate(
        ids, custom_generate=hsd_fast.generate, eos_token_id=eos, min_new_tokens=12, compile=False,
        drafts=drafts, T=[2, 2], **kwargs,
    )  # fmt: skip
    assert out.tolist() == expected.tolist()


def test_a_checkpoint_whose_generation_config_carries_min_new_tokens(target, drafts) -> None:
    ids, mask = padded_batch()
    free = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=NEW, eos_token_id=None)
    eos = int(free[0, 9 + 2])
    model = type(target)(target.config)
    model.load_state_dict(target.state_dict())
    model.generation_config.min_new_tokens = 10
    model.generation_config.eos_token_id = eos
    expected = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=NEW)
    out = model.generate(
        ids, attention_mask=mask, custom_generate=hsd_fast.generate, drafts=drafts, T=[2, 2], do_sample=False,
        max_new_tokens=NEW, compile=False,
    )  # fmt: skip
    assert out.tolist() == expected.tolist()


# ----------------------------------------------------------------------------- sampled
V, STEPS, SAMPLES, MIN_NEW = 6, 3, 5000, 1
PROMPT = torch.tensor([3, 4, 5, 1])


@pytest.fixture(scope="module")
def small() -> list[torch.nn.Module]:
    """Two drafts and a peaked target over a vocabulary of 6 (tests/test_hf_sampling.py's)."""
    return peaked_family(V)


def _eos(target) -> int:
    """The token the target most likely emits second: banning it there matters."""
    with torch.no_grad():
        first = int(target(PROMPT[None]).logits[0, -1].argmax())
        return int(target(torch.cat([PROMPT, torch.tensor([first])])[None]).logits[0, -1].argmax())


def exact_with_ban(target, eos: int, min_new: int) -> dict[tuple[int, ...], float]:
    """P(continuation) of every continuation of STEPS tokens, EOS banned at new tokens < min_new; a
    continuation that emits EOS ends there (the rest of the row is padding, id 0 here)."""
    probs: dict[tuple[int, ...], float] = {}
    for cont in itertools.product(range(V), repeat=STEPS):
        if eos in cont[:-1] and any(cont[cont.index(eos) + 1 :]):  # after an EOS, only padding
            continue
        end = cont.index(eos) + 1 if eos in cont else STEPS
        seq = torch.cat([PROMPT, torch.tensor(cont[: end - 1], dtype=torch.int64)])
        with torch.no_grad():
            logits = target(seq[None]).logits[0, len(PROMPT) - 1 :].double()
        total = 0.0
        for k in range(end):
            scores = logits[k].clone()
            if k < min_new:
                scores[eos] = float("-inf")
            total += float(torch.log_softmax(scores, -1)[cont[k]])
        probs[cont] = probs.get(cont, 0.0) + float(torch.tensor(total).exp())
    return probs


def _samples(target, eos: int, **levels) -> list[tuple[int, ...]]:
    out = target.generate(
        PROMPT.expand(SAMPLES, -1), custom_generate=hsd_fast.generate, do_sample=True, top_k=None,
        max_new_tokens=STEPS, eos_token_id=eos, pad_token_id=0, seed=0, compile=False,
        min_new_tokens=MIN_NEW, **levels,
    )  # fmt: skip
    return [tuple(row) for row in out[:, len(PROMPT) :].tolist()]


@pytest.mark.slow
def test_sampled_chain_is_exact_and_the_planted_bug_is_caught(small) -> None:
    *drafts, target = small
    eos = _eos(target)
    exact = exact_with_ban(target, eos, MIN_NEW)
    assert 0.1 < sum(p for c, p in exact.items() if c[1] == eos) < 0.9  # EOS second: the bug's token
    result = pooled_chi_square(_samples(target, eos, drafts=drafts, T=[2, 2]), exact)
    assert result.p_value > 1e-3, result
    with lengths_one_token_late():
        buggy = _samples(target, eos, drafts=drafts, T=[2, 2])
    assert pooled_chi_square(buggy, exact).p_value < 1e-6
