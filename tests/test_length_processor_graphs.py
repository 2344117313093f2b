"""Length processors in compiled steps (docs/design.md, "Sampling transforms"): their thresholds,
which HF sets from each request's prompt width and length (``begin_index``, ``max_length``,
``regulation_start``), are inputs of the steps (``processors.LengthTable``), so requests of other
prompt widths and lengths run in the graph the first request compiled and decode HF's greedy tokens.
The planted bug (the thresholds baked into the graph as ints) is caught: later requests decode with
the first one's thresholds. Slow (two compiles)."""

from __future__ import annotations

import pytest
import torch
from hf_models import tiny_model
from planted_bugs import length_thresholds_baked_in

import hsd_fast

pytestmark = [pytest.mark.hf, pytest.mark.slow]

FIRST = ([5, 9, 11, 40, 3], 20)  # (prompt, max_new_tokens): compiles the step
LATER = [([8, 9, 10, 11, 12, 13, 14, 15, 16], 24), ([70, 71], 20), ([5, 9, 11], 28)]


def _graphs() -> int:
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def _processors(target: torch.nn.Module) -> dict:
    """Every length processor whose threshold follows the request, set so that each changes HF's
    greedy tokens: the first new token of every request suppressed, EOS decayed in after 12 new tokens
    and forced at the last one, and banned before the 4th."""
    firsts = []
    for prompt, _ in [FIRST, *LATER]:
        firsts.append(int(target.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=1)[0, -1]))
    eos = 7
    return {
        "begin_suppress_tokens": firsts, "exponential_decay_length_penalty": (12, 1.6),
        "forced_eos_token_id": eos, "eos_token_id": eos, "min_new_tokens": 4,
    }  # fmt: skip


def _decode_all(target: torch.nn.Module) -> list[tuple[list, list, list, int]]:
    """Per request (the first twice, then the later ones): HSD's tokens, HF's, HF's without the
    processors, and the graphs compiled during the request."""
    processors = _processors(target)
    out = []
    for prompt, new in [FIRST, FIRST, *LATER]:  # the first request twice: its step's third use compiles it
        ids = torch.tensor([prompt])
        kwargs = {"do_sample": False, "max_new_tokens": new}
        expected = target.generate(ids, **kwargs, **processors).tolist()
        plain = target.generate(ids, **kwargs, eos_token_id=None).tolist()
        before = _graphs()
        ours = target.generate(ids, custom_generate=hsd_fast.generate, compile=True, **kwargs, **processors)
        out.append((ours.tolist(), expected, plain, _graphs() - before))
    return out


def test_later_prompt_widths_and_lengths_reuse_the_graph_and_equal_hf() -> None:
    first, again, *later = _decode_all(tiny_model("llama", layers=2))
    assert first[3] + again[3] > 0, "nothing was compiled"
    for ours, expected, plain, _ in [first, again, *later]:
        assert expected != plain, "the processors change nothing: the test cannot tell they are applied"
        assert ours == expected
    assert [compiled for *_, compiled in later] == [0] * len(LATER), "a later request compiled a graph"


def test_thresholds_baked_into_the_graph_are_caught() -> None:
    with length_thresholds_baked_in():
        first, again, *later = _decode_all(tiny_model("llama", layers=2, seed=1))
    assert first[0] == first[1] and again[0] == again[1]  # the request the graph was traced for
    assert any(ours != expected for ours, expected, *_ in later), "baked thresholds went unnoticed"
