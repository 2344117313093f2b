"""``output_scores`` and ``output_logits`` (docs/design.md, "Scores and logits"): the target's
processed scores and raw logits at every new token, taken from the pass that emitted it.

The reference is HF's own unassisted ``generate``: greedy, in a left-padded batch whose rows stop at
different points, with a repetition penalty (scores differ from logits), the scores and logits of
every token a row generated equal HF's within fp32 rounding, for no draft, two drafts, a lookup
level and a token tree; past a row's end, a point mass on the pad id. Sampled, with a temperature
and a top-k: each scores entry is the target's processed distribution at that position, computed
teacher-forced over the returned sequence.
"""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
)

import hsd_fast

pytestmark = pytest.mark.hf

IDS = torch.tensor([[0, 0, 0, 5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16, 17, 18, 19]])
MASK = (torch.arange(9)[None] >= torch.tensor([[3], [0]])).long()
NEW = 16
LEVELS = {
    "no draft": lambda d: {"drafts": []},
    "two drafts": lambda d: {"drafts": d, "T": [2, 2]},
    "lookup": lambda d: {"drafts": ["lookup", d[1]], "T": [3, 2]},
    "tree": lambda d: {"drafts": d, "T": [3, 2], "tree": hsd_fast.Tree.spine(3, 2)},
}
OUTPUTS = {"return_dict_in_generate": True, "output_scores": True, "output_logits": True}


def _new_lengths(sequences: torch.Tensor, eos: int) -> list[int]:
    rows = sequences[:, IDS.shape[1] :].tolist()
    return [row.index(eos) + 1 if eos in row else len(row) for row in rows]


@pytest.mark.parametrize("levels", sorted(LEVELS))
def test_greedy_scores_and_logits_equal_hfs(target, drafts, levels) -> None:
    kwargs = {"attention_mask": MASK, "do_sample": False, "max_new_tokens": NEW, "repetition_penalty": 1.3}
    free = target.generate(IDS, eos_token_id=None, **kwargs)
    eos = int(free[0, IDS.shape[1] + 4])  # row 0 stops at its 5th new token, row 1 later or never
    kwargs |= {"eos_token_id": eos, "pad_token_id": 0, **OUTPUTS}
    hf = target.generate(IDS, **kwargs)
    out = target.generate(
        IDS, custom_generate=hsd_fast.generate, compile=False, **kwargs, **LEVELS[levels](drafts)
    )
    assert out.sequences.tolist() == hf.sequences.tolist()
    assert len(out.scores) == len(hf.scores) and len(out.logits) == len(hf.logits)
    lengths = _new_lengths(hf.sequences, eos)
    assert min(lengths) < len(hf.scores), "no row stops early: the test cannot check what follows its end"
    ours = {"scores": torch.stack(out.scores, 1), "logits": torch.stack(out.logits, 1)}  # [B, steps, V]
    theirs = {"scores": torch.stack(hf.scores, 1), "logits": torch.stack(hf.logits, 1)}
    assert not torch.equal(theirs["scores"], theirs["logits"])  # the penalty applies: two different things
    for what in ours:
        for r, n in enumerate(lengths):
            torch.testing.assert_close(ours[what][r, :n], theirs[what][r, :n], atol=1e-4, rtol=1e-4)
            past = ours[what][r, n:]  # a point mass on the pad id
            assert (past[:, 0] == 0).all() and past[:, 1:].isneginf().all()


@pytest.mark.parametrize("warpers", ["temperature", "temperature and top-k"])
def test_sampled_scores_are_the_targets_processed_distribution(target, drafts, warpers) -> None:
    processors = LogitsProcessorList([TemperatureLogitsWarper(0.7)])
    sampling = {"do_sample": True, "temperature": 0.7, "top_k": None}
    if warpers == "temperature and top-k":
        processors.append(TopKLogitsWarper(5))
        sampling["top_k"] = 5
    out = target.generate(
        IDS, attention_mask=MASK, custom_generate=hsd_fast.generate, drafts=drafts, T=[2, 2], compile=False,
        max_new_tokens=NEW, eos_token_id=None, seed=4, **sampling, **OUTPUTS,
    )  # fmt: skip
    scores, logits = torch.stack(out.scores, 1), torch.stack(out.logits, 1)  # [B, NEW, V]
    with torch.no_grad():
        forced = target(
            out.sequences, attention_mask=torch.cat([MASK, torch.ones(2, NEW, dtype=MASK.dtype)], 1)
        )
    raw = forced.logits[
        :, IDS.shape[1] - 1 : -1
    ].float()  # [B, NEW, V] at the positions before each new token
    torch.testing.assert_close(logits, raw, atol=1e-4, rtol=1e-4)
    for k in range(NEW):
        expected = processors(out.sequences[:, : IDS.shape[1] + k], raw[:, k].clone())
        torch.testing.assert_close(scores[:, k], expected, atol=1e-4, rtol=1e-4)


def test_without_a_dict_or_the_flags_nothing_is_kept(target, drafts) -> None:
    kwargs = {"do_sample": False, "max_new_tokens": 4, "drafts": drafts, "T": [2, 2], "compile": False}
    plain = target.generate(IDS[1:], custom_generate=hsd_fast.generate, output_scores=True, **kwargs)
    assert isinstance(plain, torch.Tensor)  # as HF: the flags need return_dict_in_generate
    out = target.generate(IDS[1:], custom_generate=hsd_fast.generate, return_dict_in_generate=True, **kwargs)
    assert out.scores is None and out.logits is None


@pytest.mark.slow
def test_compiled_equals_eager(target, drafts) -> None:
    torch._dynamo.reset()
    kwargs = {
        "attention_mask": MASK, "do_sample": False, "max_new_tokens": 24, "drafts": drafts, "T": [2, 2],
        "repetition_penalty": 1.3, **OUTPUTS,
    }  # fmt: skip
    eager = target.generate(IDS, custom_generate=hsd_fast.generate, compile=False, **kwargs)
    compiled = target.generate(IDS, custom_generate=hsd_fast.generate, compile=True, **kwargs)
    for a, b in zip((*eager.scores, *eager.logits), (*compiled.scores, *compiled.logits), strict=True):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > 0, "nothing was compiled"


def test_a_planted_off_by_one_is_caught(target, drafts, monkeypatch) -> None:
    """The comparison above can fail: scores kept one position late (each token's entry holding the
    distribution of the token after it) differ from HF's."""
    from hsd_fast.target_outputs import TargetOutputs

    keep = TargetOutputs.keep
    monkeypatch.setattr(
        TargetOutputs, "keep", lambda self, positions, *rest: keep(self, positions + 1, *rest)
    )
    with pytest.raises(AssertionError):
        test_greedy_scores_and_logits_equal_hfs(target, drafts, "two drafts")
