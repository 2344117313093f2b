"""Verifying from an early exit's hidden states (``hsd_fast/exit_reuse.py``): the level above an exit
of its own model runs only its layers >= k, from the hidden states the exit kept, and stays exact.

What is checked: which pairs can reuse (the probe: Llama-like families can, GPT-2, whose forward
adds learned positions to ``inputs_embeds``, cannot and recomputes); that a run with an exit under
its target really verifies from hidden states (the top view runs, the target's own first layers do
not after the prompt); greedy output equal to the target's and to the recomputing exit's; sampled
output of the target's distribution (tests/test_early_exit.py's chi-square, whose exits reuse); and a
planted bug, the exit not caught up before the level above reads its hidden states, caught by the
greedy check here and by that chi-square.
"""

from __future__ import annotations

import pytest
import torch
from arch_configs import tiny_model as family_model
from exit_levels import NEW, counted, deep_model, hsd, prompts
from planted_bugs import exit_not_caught_up

from hsd_fast import exit_reuse
from hsd_fast.doctor import early_exit_line
from hsd_fast.early_exit import EarlyExit

pytestmark = pytest.mark.hf


@pytest.fixture(scope="module")
def deep() -> torch.nn.Module:
    return deep_model()


def _prompts(model, count: int = 3) -> list[torch.Tensor]:
    return prompts(model, count, seed=5)


# ----------------------------------------------------------------------------- which pairs reuse
def test_the_probe_admits_llama_and_refuses_gpt2(deep) -> None:
    assert exit_reuse.refusal(EarlyExit(deep, 2), deep) is None
    assert exit_reuse.refusal(EarlyExit(deep, 1), EarlyExit(deep, 3)) is None  # a deeper exit above
    assert "not an early exit" in exit_reuse.refusal(EarlyExit(deep, 3), EarlyExit(deep, 1))
    assert "reuse=False" in exit_reuse.refusal(EarlyExit(deep, 2, reuse=False), deep)
    gpt2 = family_model("gpt2", num_hidden_layers=3)
    assert "transforms inputs_embeds" in exit_reuse.refusal(EarlyExit(gpt2, 1), gpt2)


def test_doctor_says_whether_the_target_recomputes(deep) -> None:
    assert "the target verifies from its hidden states" in early_exit_line(deep)
    said = early_exit_line(family_model("gpt2", num_hidden_layers=3))
    assert "the target recomputes layers < k" in said and "transforms inputs_embeds" in said


def test_the_top_view_from_the_exits_hidden_states_gives_the_models_logits(deep) -> None:
    ids = _prompts(deep, 1)[0]
    with torch.no_grad():
        hidden = deep(ids, output_hidden_states=True).hidden_states[2]  # layer 2's output
        top = exit_reuse.top_view(deep, 2)
        assert len(top.model.layers) == 4 and top.model.layers[0] is deep.model.layers[2]
        torch.testing.assert_close(top(inputs_embeds=hidden, use_cache=False).logits, deep(ids).logits)


# ----------------------------------------------------------------------------- it is used, and exact
def test_the_target_verifies_from_the_exits_hidden_states(deep) -> None:
    """With ``EarlyExit(deep, 2)`` under ``deep``, the target's first layers run only inside the
    exit's forwards (the tokens through layer 0 are those the exit's runner fed, none more); the
    recomputing exit (``reuse=False``) leaves the target running them again."""
    ids = _prompts(deep, 1)[0]
    expected = deep.generate(ids, do_sample=False, max_new_tokens=NEW).tolist()
    counts = {}
    for reuse in (True, False):
        exit_level = EarlyExit(deep, 2, reuse=reuse)
        hsd(deep, ids, drafts=[exit_level], T=[3])  # warm: prepared, probed
        with counted(deep.model.layers[0], exit_level) as counts[reuse]:
            assert hsd(deep, ids, drafts=[exit_level], T=[3]).tolist() == expected
    assert counts[True]["layer"] == counts[True]["exit"] > 0
    assert counts[False]["layer"] > counts[False]["exit"] > 0


HIERARCHIES = {
    "exit alone": lambda t: {"drafts": [EarlyExit(t, 4)], "T": [2]},
    "two exits, both reused": lambda t: {"drafts": [EarlyExit(t, 1), EarlyExit(t, 4)], "T": [2, 3]},
    "lookup under an exit": lambda t: {"drafts": ["lookup", EarlyExit(t, 3)], "T": [3, 2]},
}


@pytest.mark.parametrize("hierarchy", sorted(HIERARCHIES))
def test_greedy_equals_the_targets_own_and_the_planted_bug_is_caught(deep, hierarchy) -> None:
    differs = 0
    for ids in _prompts(deep):
        expected = deep.generate(ids, do_sample=False, max_new_tokens=NEW).tolist()
        assert hsd(deep, ids, **HIERARCHIES[hierarchy](deep)).tolist() == expected
        with exit_not_caught_up():
            differs += hsd(deep, ids, **HIERARCHIES[hierarchy](deep)).tolist() != expected
    assert differs > 0


def test_greedy_left_padded_batch_with_reuse(deep) -> None:
    ids = torch.tensor([[0, 0, 0, 5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16, 17, 18, 19]])
    mask = (torch.arange(9)[None] >= torch.tensor([[3], [0]])).long()
    kwargs = {"attention_mask": mask, "do_sample": False, "max_new_tokens": NEW}
    expected = deep.generate(ids, **kwargs).tolist()
    assert hsd(deep, ids, drafts=[EarlyExit(deep, 2)], T=[4], **kwargs).tolist() == expected


@pytest.mark.slow
def test_compiled_steps_with_reuse_equal_the_targets_greedy(deep) -> None:
    ids = _prompts(deep, 1)[0]
    expected = deep.generate(ids, do_sample=False, max_new_tokens=NEW).tolist()
    assert hsd(deep, ids, drafts=["lookup", EarlyExit(deep, 2)], T=[2, 3], compile=True).tolist() == expected
