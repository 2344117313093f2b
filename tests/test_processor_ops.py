"""The history and length processors as tensor ops (``hsd_fast/processor_ops.py``) equal HF's own
processors bit for bit: each op against HF's processor called on the same ``input_ids``, over random
fp32 scores, rows of different lengths and histories with holes (a tree's chain and its ancestors).
The engine-level tests (greedy against HF's ``generate``, sampled against the exact distribution)
are in ``tests/test_logits_processors.py``.
"""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import (
    ExponentialDecayLengthPenalty,
    ForcedBOSTokenLogitsProcessor,
    ForcedEOSTokenLogitsProcessor,
    MinLengthLogitsProcessor,
    MinNewTokensLengthLogitsProcessor,
    NoBadWordsLogitsProcessor,
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SequenceBiasLogitsProcessor,
    SuppressTokensAtBeginLogitsProcessor,
)

from hsd_fast.processors import GENERAL, HISTORY, LENGTH, Lengths, LogitsTransform, ProcessorInputs, kind_of

V = 13


def _rows(width: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Six rows of ``width`` ids over a small alphabet (so sequences repeat) and their scores [6, V]:
    some scores negative, one -inf (a token a processor before removed)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 4, (6, width), generator=gen)
    scores = torch.randn(6, V, generator=gen) * 3
    scores[0, 2] = float("-inf")
    return ids, scores


def _with_holes(ids: torch.Tensor) -> torch.Tensor:
    """The same histories as ``DecodeState.history_ids`` may hand them: holes (V) before, between and
    after the row's ids, split at a different place in every row."""
    rows = []
    for r, row in enumerate(ids):
        cut = r % (len(row) + 1)
        hole = torch.full((1 + r % 2,), V)
        rows.append(torch.cat([hole, row[:cut], torch.full((2,), V), row[cut:], torch.full((3 - r % 2,), V)]))
    return torch.stack(rows)


def _ours(processor, scores: torch.Tensor, history=None, width=None, new=None) -> torch.Tensor:
    transform = LogitsTransform([processor])
    lengths = (
        None if width is None else Lengths(torch.full((len(scores),), width), torch.full((len(scores),), new))
    )
    inputs = ProcessorInputs(
        None if history is None else [history], lengths, None, transform.tables(V, 64, "cpu")
    )
    return transform(scores, inputs)


HISTORY_PROCESSORS = {
    "repetition penalty": RepetitionPenaltyLogitsProcessor(1.7),
    "n-gram ban": NoRepeatNGramLogitsProcessor(2),
    "3-gram ban": NoRepeatNGramLogitsProcessor(3),
    "bad words": NoBadWordsLogitsProcessor([[1], [2, 3], [0, 1, 2], [5, 1]], eos_token_id=[1]),
    "sequence bias": SequenceBiasLogitsProcessor(
        {(3,): 1.5, (1, 2): -2.25, (2, 3): 0.75, (0, 1, 3): 4.0, (2, 1, 3): -1.0, (0, 0, 0, 0, 0, 0, 0): 9.0}
    ),
}


@pytest.mark.parametrize("name", sorted(HISTORY_PROCESSORS))
@pytest.mark.parametrize("width", [1, 2, 5])
def test_a_history_op_equals_hfs_processor(name, width) -> None:
    processor = HISTORY_PROCESSORS[name]
    assert kind_of(processor) == HISTORY
    for seed in range(4):
        ids, scores = _rows(width, seed)
        expected = processor(ids, scores.clone())
        assert torch.equal(_ours(processor, scores.clone(), _with_holes(ids)), expected), seed


def test_a_sequence_bias_past_the_vocabulary_is_refused_as_hf_refuses_it() -> None:
    processor = SequenceBiasLogitsProcessor({(1, V): -1.0})
    with pytest.raises(ValueError, match=f"vocabulary size is {V}.*{V}"):
        LogitsTransform([processor]).tables(V, 64, "cpu")


LENGTH_PROCESSORS = {  # (processor, the prompt width HF prepared it for)
    "min length": (MinLengthLogitsProcessor(7, eos_token_id=[1, 4]), 4),
    "min new tokens": (MinNewTokensLengthLogitsProcessor(4, 2, eos_token_id=1), 4),
    "begin suppress": (SuppressTokensAtBeginLogitsProcessor([3, 5, 40], begin_index=4), 4),
    "forced eos": (ForcedEOSTokenLogitsProcessor(8, eos_token_id=[1, 2]), 4),
    "forced bos": (ForcedBOSTokenLogitsProcessor(3), 1),
    "length decay": (
        ExponentialDecayLengthPenalty((2, 1.07), eos_token_id=[1, 2], input_ids_seq_length=4),
        4,
    ),
    "length decay, shrinking": (
        ExponentialDecayLengthPenalty((0, 0.8), eos_token_id=1, input_ids_seq_length=4),
        4,
    ),
}


@pytest.mark.parametrize("name", sorted(LENGTH_PROCESSORS))
def test_a_length_op_equals_hfs_processor_at_every_width(name) -> None:
    processor, prompt = LENGTH_PROCESSORS[name]
    assert kind_of(processor) == LENGTH
    for width in range(prompt, prompt + 12):
        ids, scores = _rows(width, seed=width)
        scores[1, 1] = float("-inf")  # a removed EOS: the decay leaves it as it is
        expected = processor(ids, scores.clone())
        # transformers 5.17's decay turns a removed EOS (-inf) into NaN (fixed by 5.24): it stays removed
        expected = torch.where(expected.isnan() & scores.isneginf(), float("-inf"), expected)
        assert torch.equal(_ours(processor, scores.clone(), width=width, new=width - prompt), expected), width


def test_a_subclass_of_an_hf_processor_is_called_per_position() -> None:
    """A user's processor built on HF's may read ``input_ids`` its own way: it is never taken for HF's."""

    class Mine(RepetitionPenaltyLogitsProcessor):
        pass

    assert kind_of(Mine(1.2)) == GENERAL
    assert LogitsTransform([Mine(1.2)]).needs_prefixes


def test_the_bias_tables_shapes_are_in_the_transform_key() -> None:
    """A compiled step is built for the table's shapes: another shape, another key."""
    one = LogitsTransform([NoBadWordsLogitsProcessor([[1], [2, 3]], eos_token_id=0)])
    same_shapes = LogitsTransform([NoBadWordsLogitsProcessor([[4], [5, 6]], eos_token_id=0)])
    other = LogitsTransform([NoBadWordsLogitsProcessor([[1], [2, 3], [4, 5]], eos_token_id=0)])
    assert one.key == same_shapes.key != other.key
