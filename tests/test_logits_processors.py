"""HF's logits processors beyond the batched warpers (docs/design.md, "Sampling transforms"): the
n-gram ban, bad words and sequence bias (tensor ops over each position's history), the begin-suppress,
forced-EOS and length-decay processors (tensor ops over each position's ``input_ids`` width), and,
called per position with the ``input_ids`` HF's unassisted ``generate`` would hand them there,
``prefix_allowed_tokens_fn`` and a user's own ``LogitsProcessor``.

The reference is HF's own unassisted ``generate``: greedy output token for token in a left-padded
batch (the processors see the pads, as HF's do) with two drafts, a lookup level and a token tree;
sampled output against the exact distribution, enumerated, for a history op (the n-gram ban, a
sequence bias), a length op (begin-suppress) and a user's processor, each with a planted bug that
the same test catches; the compiled ops decode what the eager ones do; a compiled request with a
processor called per position runs eagerly, with a warning, and decodes the same tokens. Each op
against HF's processor, bit for bit: ``tests/test_processor_ops.py``.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from enumerated import processed_distribution
from hf_models import level_configs, padded_batch, peaked_family
from planted_bugs import (
    lengths_one_token_late,
    penalty_history_without_the_blocks_drafts,
    prefixes_of_the_steps_first_column,
)
from transformers.generation.logits_process import (
    LogitsProcessor,
    LogitsProcessorList,
    NoRepeatNGramLogitsProcessor,
    SequenceBiasLogitsProcessor,
    SuppressTokensAtBeginLogitsProcessor,
)

import hsd_fast
from hsd_fast.testing.exactness import pooled_chi_square

pytestmark = pytest.mark.hf

NEW = 20
IDS, MASK = padded_batch()


class BanTheLastToken(LogitsProcessor):
    """A user's processor that reads the history: the token just before may not come again."""

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        return scores.scatter(1, input_ids[:, -1:], float("-inf"))


def _options(plain: list[list[int]]) -> dict[str, dict]:
    """Each processor at a setting that changes HF's greedy output (``plain``: its new tokens)."""
    first, later = plain[0], plain[1]
    return {
        "no_repeat_ngram_size": {"no_repeat_ngram_size": 2},
        "bad_words_ids": {"bad_words_ids": [[first[2]], [later[3], later[4]]]},
        "sequence_bias": {"sequence_bias": {(first[1],): -20.0, (later[2], later[3]): -20.0}},
        "begin_suppress_tokens": {"begin_suppress_tokens": [first[0], later[0]]},
        "forced_eos_token_id": {"forced_eos_token_id": 2, "eos_token_id": 2},
        "exponential_decay_length_penalty": {"exponential_decay_length_penalty": (2, 3.0), "eos_token_id": 2},
        "prefix_allowed_tokens_fn": {
            "prefix_allowed_tokens_fn": lambda row, ids: (
                list(range(3, 48)) if row == 0 else list(range(48, 96))
            )
        },
        "a user's processor": {"logits_processor": LogitsProcessorList([BanTheLastToken()])},
    }


def _plain(target) -> list[list[int]]:
    out = target.generate(IDS, attention_mask=MASK, do_sample=False, max_new_tokens=NEW)
    return out[:, IDS.shape[1] :].tolist()


@pytest.mark.parametrize("name", sorted(_options([[0] * NEW] * 2)))
def test_greedy_left_padded_batch_equals_hf(target, drafts, name) -> None:
    plain = _plain(target)
    option = _options(plain)[name]
    kwargs = {"attention_mask": MASK, "do_sample": False, "max_new_tokens": NEW, **option}
    expected = target.generate(IDS, **kwargs)
    assert expected[:, IDS.shape[1] :].tolist() != plain, (
        "the processor changes nothing: the test cannot tell"
    )
    for levels, config in level_configs(drafts).items():
        out = target.generate(IDS, custom_generate=hsd_fast.generate, compile=False, **kwargs, **config)
        assert out.tolist() == expected.tolist(), levels


class Recorder(LogitsProcessor):
    """A user's processor that changes nothing and records every ``input_ids`` row it is handed."""

    def __init__(self) -> None:
        self.seen: set[tuple[int, ...]] = set()

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        self.seen.update(tuple(row) for row in input_ids.tolist())
        return scores


def test_a_users_processor_sees_hfs_prefixes_and_the_drafted_ones(target, drafts) -> None:
    """Every prefix HF's unassisted generate hands the processor, padding included, hsd_fast hands it
    too; the others end in a draft that was verified (accepted or not) or drafted."""
    kwargs = {"attention_mask": MASK, "do_sample": False, "max_new_tokens": 12}
    hf, ours = Recorder(), Recorder()
    expected = target.generate(IDS, logits_processor=LogitsProcessorList([hf]), **kwargs)
    out = target.generate(
        IDS, custom_generate=hsd_fast.generate, compile=False, drafts=drafts, T=[2, 2],
        logits_processor=LogitsProcessorList([ours]), **kwargs,
    )  # fmt: skip
    assert out.tolist() == expected.tolist()
    assert hf.seen <= ours.seen
    padded = [tuple(row) for row in IDS.tolist()]
    assert all(any(p[: len(row)] == row for row in padded) for p in ours.seen)  # HF's padded prompt first
    assert ours.seen - hf.seen, "no drafted prefix: the drafts never ran ahead of the target"


def test_a_compiled_request_runs_eagerly_and_says_so(target, drafts) -> None:
    kwargs = {
        "attention_mask": MASK, "do_sample": False, "max_new_tokens": 8,
        "logits_processor": LogitsProcessorList([BanTheLastToken()]),
    }  # fmt: skip
    expected = target.generate(IDS, **kwargs)
    with pytest.warns(UserWarning, match="BanTheLastToken.*not compiled"):
        out = target.generate(
            IDS, custom_generate=hsd_fast.generate, compile=True, drafts=drafts, T=[2, 2], **kwargs
        )
    assert out.tolist() == expected.tolist()


def test_profiling_under_such_a_processor_times_eager_steps(target, monkeypatch) -> None:
    """The selector's step costs under a per-position processor are the eager steps' (what decoding
    will run), never a compile that would fail on the host-side prefixes."""
    from hsd_fast.processors import LogitsTransform
    from hsd_fast.profile import costs

    built = []

    def recording(*args, compile: bool, **kwargs):
        built.append(compile)
        return real(*args, compile=compile, **kwargs)

    real = costs.LevelStep
    monkeypatch.setattr(costs, "LevelStep", recording)
    transform = LogitsTransform([BanTheLastToken()])
    profile = costs.forward_costs(
        target, spans=(1, 2), drafts=(1,), context=8, repeats=1, warmup=0, compile=True, greedy=False,
        transform=transform,
    )  # fmt: skip
    assert profile.decode() > 0
    assert built == [False, False]  # the verify and the draft step, both eager


def test_processors_with_state_of_their_own_are_refused(target, drafts) -> None:
    with pytest.raises(ValueError, match=r"EncoderRepetitionPenaltyLogitsProcessor.*use repetition_penalty"):
        target.generate(
            IDS[1:], custom_generate=hsd_fast.generate, drafts=drafts, T=[2, 2], do_sample=False,
            max_new_tokens=4, encoder_repetition_penalty=1.3,
        )  # fmt: skip


# ----------------------------------------------------------------------------- sampled
V, STEPS, SAMPLES, NGRAM = 6, 3, 5000, 2
PROMPT = torch.tensor([3, 4, 5, 1, 3])  # "3 4" already seen: after a 3, a 4 is banned


@pytest.fixture(scope="module")
def small() -> list[torch.nn.Module]:
    return peaked_family(V)


def exact_with(target, processor: LogitsProcessor) -> dict[tuple[int, ...], float]:
    """P(continuation) of every continuation of STEPS tokens, ``processor`` applied at each position."""
    return processed_distribution(target, PROMPT, processor, V, STEPS)


# the n-gram ban and the bias: tensor ops over each column's history; begin-suppress: over its width;
# a user's processor: per position
BIAS = {(3, 4): -2.0, (4, 1): 2.5, (1,): -1.0, (5, 3, 4): -30.0}  # "3 4" and "5 3" are in the prompt
SAMPLED = {
    "no_repeat_ngram_size": (
        {"no_repeat_ngram_size": NGRAM}, NoRepeatNGramLogitsProcessor(NGRAM),
        penalty_history_without_the_blocks_drafts,
    ),
    "sequence_bias": (
        {"sequence_bias": BIAS}, SequenceBiasLogitsProcessor(BIAS), penalty_history_without_the_blocks_drafts,
    ),
    "begin_suppress_tokens": (
        {"begin_suppress_tokens": [3, 4]}, SuppressTokensAtBeginLogitsProcessor([3, 4], len(PROMPT)),
        lengths_one_token_late,
    ),
    "a user's processor": (
        {"logits_processor": LogitsProcessorList([BanTheLastToken()])}, BanTheLastToken(),
        prefixes_of_the_steps_first_column,
    ),
}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SAMPLED))
def test_sampled_chain_is_exact_and_the_planted_bug_is_caught(small, name) -> None:
    *drafts, target = small
    option, processor, planted = SAMPLED[name]
    exact = exact_with(target, processor)
    plain = exact_with(target, lambda ids, scores: scores)
    assert sum(abs(plain[c] - exact[c]) for c in exact) > 0.2, "the processor hardly bites: the test is blind"

    def samples() -> list[tuple[int, ...]]:
        out = target.generate(
            PROMPT.expand(SAMPLES, -1), custom_generate=hsd_fast.generate, do_sample=True, top_k=None,
            max_new_tokens=STEPS, eos_token_id=None, seed=0, compile=False, drafts=drafts, T=[2, 2], **option,
        )  # fmt: skip
        return [tuple(row) for row in out[:, len(PROMPT) :].tolist()]

    result = pooled_chi_square(samples(), exact)
    assert result.p_value > 1e-3, result
    with planted():
        buggy = samples()
    assert pooled_chi_square(buggy, exact).p_value < 1e-6


@pytest.mark.slow
def test_the_compiled_ops_equal_eager(target, drafts) -> None:
    """Every history and length op in one compiled request, sampled (each mode compiles its own
    graphs: minutes on a CPU), decodes what the eager ops decode, and nothing runs per position."""
    torch._dynamo.reset()
    plain = _plain(target)
    ops = {
        "no_repeat_ngram_size": 2, "bad_words_ids": [[plain[0][2]], [plain[1][3], plain[1][4]]],
        "sequence_bias": {(plain[0][1],): -2.0, (plain[1][2], plain[1][3]): -4.0},
        "begin_suppress_tokens": [plain[0][0]], "exponential_decay_length_penalty": (4, 1.3),
        "eos_token_id": 2,
    }  # fmt: skip
    kwargs = {
        "attention_mask": MASK, "do_sample": True, "max_new_tokens": 24, "seed": 3, "drafts": drafts,
        "T": [2, 2], "custom_generate": hsd_fast.generate,
    }  # fmt: skip
    eager = target.generate(IDS, compile=False, **kwargs, **ops)
    assert eager.tolist() != target.generate(IDS, compile=False, **kwargs).tolist(), "the ops change nothing"
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # "... runs uncompiled" would fail here
        compiled = target.generate(IDS, compile=True, **kwargs, **ops)
    assert eager.tolist() == compiled.tolist()
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > 0, "nothing was compiled"
