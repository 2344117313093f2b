"""What hsd_fast keeps per model (hsd_fast/attached.py): a model's runner and steps live on the model,
so a model that ran is freed once the user drops it (with its exits and a draft with another
tokenizer), and a copy of a model that ran gets a runner of its own."""

from __future__ import annotations

import copy
import gc
import io
import pickle
import weakref

import pytest
import torch
from hf_models import derived_drafts, tiny_model
from test_other_tokenizer import byte_level_tokenizer, printable

import hsd_fast
from hsd_fast.attached import attached
from hsd_fast.bridge import TokenBytes
from hsd_fast.hf_runner import HFRunner

pytestmark = pytest.mark.hf

IDS = torch.tensor([[1, 5, 7, 9, 11]])


def _greedy(model: torch.nn.Module, **kwargs) -> torch.Tensor:
    return model.generate(IDS, do_sample=False, max_new_tokens=12, compile=False, **kwargs)


def _collect() -> None:
    for _ in range(3):  # a weak reference's callback may free more on the next pass
        gc.collect()


def _hierarchy(kind: str) -> tuple[torch.nn.Module, dict, list]:
    """A target and the ``generate`` arguments of a hierarchy of ``kind``; the last: every object
    that must be freed with them (models, exit views, tokenizers)."""
    if kind == "other tokenizer":
        chars = printable()  # 96 single characters
        target_tok = byte_level_tokenizer(chars)
        draft_tok = byte_level_tokenizer([*chars, "ab"], [("a", "b")])
        target = tiny_model("llama", vocab_size=len(target_tok))
        draft = tiny_model("llama", vocab_size=len(draft_tok), layers=2, seed=3)
        kwargs = {"drafts": [draft], "target_tokenizer": target_tok, "draft_tokenizers": [draft_tok]}
        return target, kwargs, [target, draft, target_tok, draft_tok]
    target = tiny_model("llama")
    draft = derived_drafts(target, 1)[0]
    if kind == "draft":
        return target, {"drafts": [draft]}, [target, draft]
    exit_view = hsd_fast.EarlyExit(target, 2)
    return target, {"drafts": ["lookup", draft, exit_view]}, [target, draft, exit_view]


@pytest.mark.filterwarnings("ignore::hsd_fast.request.DraftOrderWarning")  # a full draft under an exit
@pytest.mark.parametrize("kind", ["draft", "lookup, draft and exit", "other tokenizer"])
def test_models_that_ran_are_freed_once_dropped(kind: str) -> None:
    target, kwargs, objects = _hierarchy(kind)
    _greedy(target, custom_generate=hsd_fast.generate, **kwargs)
    if kind == "other tokenizer":
        TokenBytes.of(kwargs["target_tokenizer"])  # the bridge's tables were made
        assert attached(kwargs["draft_tokenizers"][0], "bytes")
    alive = [weakref.ref(o) for o in objects]
    del target, kwargs, objects
    _collect()
    assert [r() is not None for r in alive] == [False] * len(alive)


@pytest.mark.parametrize(
    "copier",
    [
        copy.deepcopy,
        copy.copy,
        lambda model: pickle.loads(pickle.dumps(model)),
        lambda model: torch.load(io.BytesIO(_saved(model)), weights_only=False),
    ],
    ids=["deepcopy", "copy", "pickle", "torch.save"],
)
def test_a_copy_of_a_model_that_ran_gets_a_runner_of_its_own(copier) -> None:
    target = tiny_model("llama")
    draft = derived_drafts(target, 1)[0]
    expected = _greedy(target, custom_generate=hsd_fast.generate, drafts=[draft])
    copied = copier(target)
    runner = HFRunner.of(copied, vocab_size=96)
    assert runner.model is copied and runner is not HFRunner.of(target, vocab_size=96)
    assert _greedy(copied, custom_generate=hsd_fast.generate, drafts=[draft]).tolist() == expected.tolist()


def _saved(model: torch.nn.Module) -> bytes:
    buffer = io.BytesIO()
    torch.save(model, buffer)
    return buffer.getvalue()


def test_a_cache_belongs_to_one_owner() -> None:
    class Plain:
        pass

    class Slotted:
        __slots__ = ("__weakref__",)

    first = Plain()
    attached(first, "steps")["key"] = "value"
    by_hand = object.__new__(Plain)
    by_hand.__dict__ = dict(first.__dict__)  # a shallow copy that shares the store object
    assert attached(by_hand, "steps") == {} and attached(first, "steps") == {"key": "value"}
    slotted = Slotted()  # no __dict__: kept in a weak table instead
    attached(slotted, "steps")["key"] = "value"
    assert attached(slotted, "steps") == {"key": "value"} and attached(Slotted(), "steps") == {}
