"""One compiled graph per step shape whatever the capacity (docs/design.md, "Few graphs per run"). On
a CPU the token buffer, the KV cache (the slot ids, an exit's hidden states) and the tables as long
as they trace the capacity as a symbol, so a request that crosses a ``layout.capacity_bucket`` size
compiles none of the step shapes an earlier request compiled, and still decodes the target's own
greedy tokens: nothing in a graph kept the first run's size. So do a draft with another tokenizer's
own steps. A planted bug that bakes the token buffer's trash column into the graph as a Python int
(what the steps did before) is caught. Slow (compiles graphs)."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from hf_models import derived_drafts, left_padded, tiny_model
from planted_bugs import trash_column_baked_in
from test_other_tokenizer import byte_level_tokenizer, printable

import hsd_fast
from hsd_fast import compile_policy
from hsd_fast.layout import capacity_bucket

pytestmark = [pytest.mark.hf, pytest.mark.slow]

NEW = {128: 24, 192: 140}
"""New tokens per row for a run of each capacity: the same prompts, so every step's key is the same
(a length processor's settings follow the prompt's width), and the longer run decodes past the
positions the shorter one held."""


@pytest.fixture(scope="module")
def target() -> torch.nn.Module:
    return tiny_model("llama", layers=2, max_positions=512)


PROMPTS = left_padded([[5, 9, 11, 40, 3, 7, 12, 60], [70, 71, 3, 4]])  # (input_ids, attention_mask)


def _hierarchy(name: str, target: torch.nn.Module) -> dict:
    """The run's capacity-sized buffers: a chain's token buffer and KV caches, and the decay
    penalty's table; a token tree's moves in the cache; an early exit's hidden states."""
    draft = derived_drafts(target, 1)
    return {
        "chain, processors": {
            "drafts": draft,
            "T": [3],
            "repetition_penalty": 1.3,
            "exponential_decay_length_penalty": (4, 1.05),
            "eos_token_id": 2,
        },
        "token tree": {"drafts": draft, "T": [1], "tree": hsd_fast.Tree.spine(3, 2)},
        "early exit": {"drafts": [hsd_fast.EarlyExit(target, 1)], "T": [3]},
    }[name]


def _compiled_shapes(monkeypatch) -> list[str]:
    """The names of the step shapes compiled from now on, in order ("level 1 verify 4x4")."""
    names: list[str] = []
    real = compile_policy.Compiling.__call__

    def watched(self, *args):
        first = not self.compiled
        out = real(self, *args)
        if first:
            names.append(self.name)
        return out

    monkeypatch.setattr(compile_policy.Compiling, "__call__", watched)
    return names


def _greedy(target: torch.nn.Module, capacity: int, **kwargs) -> list[list[int]]:
    ids, mask = PROMPTS
    assert capacity_bucket(ids.shape[1] + NEW[capacity] + 1) == capacity
    options = {"attention_mask": mask, "do_sample": False, "eos_token_id": None}
    options["max_new_tokens"] = NEW[capacity]
    return target.generate(ids, **(options | kwargs)).tolist()


@pytest.mark.parametrize("name", ["chain, processors", "token tree", "early exit"])
def test_a_larger_capacity_compiles_no_shape_again(target, name, monkeypatch) -> None:
    hierarchy = _hierarchy(name, target)
    hsd = {"custom_generate": hsd_fast.generate, "compile": True, **hierarchy}
    hf = {k: v for k, v in hierarchy.items() if k not in ("drafts", "T", "tree")}  # HF's own options
    compiled = _compiled_shapes(monkeypatch)
    shapes = []
    for capacity in NEW:
        before = len(compiled)
        assert _greedy(target, capacity, **hsd) == _greedy(target, capacity, **hf), capacity
        shapes.append(compiled[before:])
    assert shapes[0], "the first request compiled nothing"
    again = sorted(set(shapes[0]) & set(shapes[1]))
    assert not again, f"step shapes compiled again at a larger capacity: {again}"


def test_a_draft_with_another_tokenizer_compiles_no_shape_again(monkeypatch) -> None:
    """A draft with another tokenizer keeps a slot cache and a token buffer of its own, sized in its
    own tokens (docs/design.md, "Drafts with another tokenizer"): its compiled steps, too, serve a
    larger capacity."""
    chars = printable()  # the target's tokenizer: one id per character, as the prompts' ids are
    target_tok = byte_level_tokenizer(chars)
    pairs = [("Ġ", "t"), ("h", "e"), ("e", "r"), ("i", "n"), ("a", "t"), ("o", "n")]
    draft_tok = byte_level_tokenizer(chars + [a + b for a, b in pairs], pairs)
    target = tiny_model("llama", vocab_size=len(target_tok), layers=2, max_positions=512, lm_head_scale=2.0)
    draft = tiny_model("llama", vocab_size=len(draft_tok), layers=1, max_positions=512, seed=3)
    hsd = {"custom_generate": hsd_fast.generate, "compile": True, "drafts": [draft], "T": [3]}
    hsd |= {"target_tokenizer": target_tok, "draft_tokenizers": [draft_tok], "output_hsd_stats": True}
    compiled = _compiled_shapes(monkeypatch)
    shapes = []
    for capacity in NEW:
        before = len(compiled)
        ids, mask = PROMPTS
        options = {"attention_mask": mask, "do_sample": False, "eos_token_id": None}
        out = target.generate(ids, max_new_tokens=NEW[capacity], **options, **hsd)
        assert out.sequences.tolist() == _greedy(target, capacity), capacity
        assert out.hsd_stats.accepted[1] > 0, out.hsd_stats.summary()  # the draft's tokens were taken
        shapes.append(compiled[before:])
    assert any(name.startswith("other-tokenizer draft") for name in shapes[0]), shapes[0]  # its own steps
    again = sorted(set(shapes[0]) & set(shapes[1]))
    assert not again, f"step shapes compiled again at a larger capacity: {again}"


def test_a_trash_column_baked_into_the_graph_is_caught(monkeypatch) -> None:
    """The steps once read the trash column from an int the run set: at a larger capacity a graph
    compiled at the first one writes its sitting-out rows' tokens into a real position."""
    target = tiny_model("llama", layers=2, max_positions=512, seed=1)
    hsd = {"custom_generate": hsd_fast.generate, "compile": True, "drafts": derived_drafts(target, 1)}
    hsd["T"] = [3]
    with trash_column_baked_in():
        outputs = [_greedy(target, capacity, **hsd) for capacity in NEW]
    assert outputs[0] == _greedy(target, 128), "the bug changed a run at its own capacity"
    assert outputs[1] != _greedy(target, 192), "the planted bug went unnoticed"
