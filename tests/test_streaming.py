"""A streamer always ends.

``target.generate(..., custom_generate=hsd_fast.generate, streamer=s)``: HF puts the prompt into
``s``, then drops it before calling the custom generate, and never calls ``s.end()``: a consumer
iterating a ``TextIteratorStreamer`` waited forever. Now ``hsd_fast.generate`` finds the streamer in
HF's call, puts the committed tokens, and ends it when it returns or raises; the wrapper ends its
streamer whatever fails. Every consumer here reads with a timeout (the streamer's own), so a
regression fails instead of hanging the test run.
"""

from __future__ import annotations

import queue
import threading

import pytest
import torch
from hf_models import tiny_model
from transformers import GenerationConfig, TextIteratorStreamer

import hsd_fast
from hsd_fast import zoo

pytestmark = pytest.mark.hf

PROMPT = [[5, 9, 11, 40, 3, 7, 12, 60, 33]]
TIMEOUT = 60.0  # seconds a consumer waits for the next piece before the test fails (a hang guard)


@pytest.fixture(scope="module")
def tokenizer():
    return zoo.load_tokenizer()  # any tokenizer covering the tiny models' 96 ids


def _streamed_in_thread(streamer: TextIteratorStreamer, generate) -> tuple[str, dict]:
    """Runs ``generate`` in a thread, as HF's streaming examples do, and consumes the streamer here.
    Returns the text and what the thread returned or raised."""
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["out"] = generate()
        except Exception as err:  # handed to the test
            outcome["error"] = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        text = "".join(streamer)  # raises queue.Empty after TIMEOUT s without a piece
    except queue.Empty:
        pytest.fail(f"the streamer got no end() ({TIMEOUT:.0f} s without a piece)")
    thread.join(TIMEOUT)
    assert not thread.is_alive()
    return text, outcome


def _drain(streamer: TextIteratorStreamer) -> list[str]:
    """Everything already in the streamer's queue up to its end (after a synchronous call)."""
    try:
        return list(streamer)
    except queue.Empty:
        pytest.fail("the streamer got no end()")


@pytest.mark.parametrize("levels", [0, 2], ids=["K=0", "K=2"])
def test_custom_generate_streams_the_committed_tokens_and_ends(target, drafts, tokenizer, levels) -> None:
    ids = torch.tensor(PROMPT)
    streamer = TextIteratorStreamer(tokenizer, skip_prompt=True, timeout=TIMEOUT)
    kwargs = {"do_sample": False, "max_new_tokens": 20, "eos_token_id": None, "compile": False}
    text, outcome = _streamed_in_thread(
        streamer,
        lambda: target.generate(
            ids, streamer=streamer, custom_generate=hsd_fast.generate, drafts=drafts[:levels], T=[2] * levels,
            **kwargs,
        ),
    )  # fmt: skip
    out = outcome["out"]
    assert (
        out.tolist() == target.generate(ids, do_sample=False, max_new_tokens=20, eos_token_id=None).tolist()
    )
    assert text == tokenizer.decode(out[0, ids.shape[1] :])


def test_wrapper_streams_in_a_thread(target, drafts, tokenizer) -> None:
    ids = torch.tensor(PROMPT)
    streamer = TextIteratorStreamer(tokenizer, timeout=TIMEOUT)  # prompt included
    model = hsd_fast.wrap(target, drafts, T=[2, 2], compile=False)
    text, outcome = _streamed_in_thread(
        streamer, lambda: model.generate(ids, streamer=streamer, do_sample=False, max_new_tokens=12)
    )
    assert text == tokenizer.decode(outcome["out"][0])


@pytest.mark.parametrize(
    "bad",
    [{"T": [0]}, {"seed": 2**64, "do_sample": True}, {"drafts": "not a model"}],
    ids=["T=[0]", "seed=2**64", "drafts=str"],
)
def test_custom_generate_ends_the_streamer_when_it_raises(target, drafts, tokenizer, bad) -> None:
    streamer = TextIteratorStreamer(tokenizer, timeout=5.0)  # its pieces are all queued by now
    kwargs = {"drafts": drafts[:1], "T": [2], "max_new_tokens": 8, **bad}
    with pytest.raises((ValueError, TypeError)):
        target.generate(torch.tensor(PROMPT), streamer=streamer, custom_generate=hsd_fast.generate, **kwargs)
    assert "".join(_drain(streamer)) == tokenizer.decode(PROMPT[0])  # HF's prompt, then the end


def test_custom_generate_ends_the_streamer_when_the_run_fails(target, drafts, tokenizer) -> None:
    """A failure in the middle of decoding (here: broken logits at the target): the tokens
    committed before it were streamed, then the end."""
    broken = tiny_model("llama")
    calls = {"n": 0}

    def poison(module, args, output):  # the 6th forward (the second step) returns NaN logits
        calls["n"] += 1
        if calls["n"] == 6:
            output.logits.fill_(float("nan"))

    handle = broken.register_forward_hook(poison)
    streamer = TextIteratorStreamer(tokenizer, skip_prompt=True, timeout=5.0)
    try:
        with pytest.raises(FloatingPointError, match="level 0"):
            broken.generate(
                torch.tensor(PROMPT), streamer=streamer, custom_generate=hsd_fast.generate,
                do_sample=True, max_new_tokens=12, compile=False,
            )  # fmt: skip
    finally:
        handle.remove()
    streamed = "".join(_drain(streamer))
    assert len(streamed) > 0  # K = 0 commits each step: what came before the failure was streamed


def test_wrapper_ends_the_streamer_when_hf_refuses_the_call(target, tokenizer) -> None:
    """HF's own checks run before hsd_fast.generate is called; the wrapper ends the streamer then."""
    streamer = TextIteratorStreamer(tokenizer, timeout=5.0)
    with pytest.raises(ValueError):  # HF's own refusal: its wording is not ours to test
        hsd_fast.wrap(target).generate(torch.tensor(PROMPT), streamer=streamer, max_new_tokens=-1)
    assert "".join(_drain(streamer)) == ""  # nothing was put; the end came


def test_only_the_streamer_of_hfs_generate_is_taken(target) -> None:
    """``hsd_fast.generate`` looks for the streamer HF dropped in its caller's frame only when the
    caller is HF's ``generate``: a function of another module that happens to be called ``generate``
    and to hold a ``streamer`` is left alone."""
    held = _Recorder()
    new_tokens = 3
    prepared = GenerationConfig(max_length=len(PROMPT[0]) + new_tokens, do_sample=False, num_beams=1)

    def generate() -> torch.Tensor:  # named as HF's is, in this module
        streamer = held  # noqa: F841 (a local of the name HF's generate uses)
        return hsd_fast.generate(target, torch.tensor(PROMPT), generation_config=prepared)

    assert generate().shape == (1, len(PROMPT[0]) + new_tokens)
    assert held.calls == []


class _Recorder:
    """A streamer that records what it was given."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def put(self, value) -> None:
        self.calls.append("put")

    def end(self) -> None:
        self.calls.append("end")
