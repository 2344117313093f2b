"""Every request hsd_fast cannot serve exactly is refused with a clear ValueError."""

import pytest
import torch
from hf_models import noisy_copy, tiny_model
from transformers import MambaConfig, MambaForCausalLM, T5Config, T5ForConditionalGeneration

import hsd_fast
from hsd_fast import zoo
from hsd_fast.hf_generate import generate

pytestmark = pytest.mark.hf


@pytest.fixture(scope="module")
def draft(target) -> torch.nn.Module:
    return noisy_copy(target, 0.05, seed=1)


IDS = torch.tensor([[5, 6, 7, 8]])


def _run(target, **kwargs):
    kwargs.setdefault("max_new_tokens", 4)
    return target.generate(IDS, custom_generate=hsd_fast.generate, **kwargs)


def test_different_vocabularies(target) -> None:
    other = tiny_model("llama", vocab_size=200)
    with pytest.raises(ValueError, match="different vocabularies"):
        _run(target, drafts=[other], T=[2])


def test_padded_vocabulary_is_accepted_and_cut() -> None:
    target = tiny_model("llama", vocab_size=1000)
    padded = tiny_model("llama", vocab_size=1008, seed=1)  # 8 rows of embedding padding (< 1%)
    with torch.no_grad():  # make the padding rows the draft's favourites: they must still be cut
        padded.lm_head.weight[1000:] = 10 * padded.lm_head.weight[:8].abs()
    out = _run(target, drafts=[padded], T=[2], do_sample=False)
    assert out.tolist() == target.generate(IDS, do_sample=False, max_new_tokens=4).tolist()


def test_models_on_different_devices(target) -> None:
    on_meta = tiny_model("llama").to("meta")
    with pytest.raises(ValueError, match="one device"):
        _run(target, drafts=[on_meta], T=[2])


@pytest.mark.parametrize(("T", "match"), [([2, 2], "one block size per draft"), ([0], ">= 1")])
def test_bad_T(target, draft, T, match) -> None:
    with pytest.raises(ValueError, match=match):
        _run(target, drafts=[draft], T=T)


def test_encoder_decoder() -> None:
    config = T5Config(vocab_size=32, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_heads=2)
    t5 = T5ForConditionalGeneration(config)
    with pytest.raises(ValueError, match="encoder-decoder"):
        generate(t5, IDS, generation_config=t5.generation_config)


def test_unsupported_architecture(target) -> None:
    config = MambaConfig(vocab_size=96, hidden_size=16, num_hidden_layers=1, state_size=4)
    mamba = MambaForCausalLM(config)
    with pytest.raises(ValueError, match="architecture not supported: layers with state"):
        _run(target, drafts=[mamba], T=[2])


def test_unsupported_attention(target) -> None:
    other = noisy_copy(target, 0.05, seed=3)
    other.config._attn_implementation = "flex_attention"
    with pytest.raises(ValueError, match="attention implementation"):
        generate(other, IDS, generation_config=target.generation_config)


def test_beam_search(target, draft) -> None:
    with pytest.raises(ValueError, match="beam"):
        _run(target, drafts=[draft], T=[2], num_beams=2)


def test_beyond_max_position_embeddings(target, draft) -> None:
    with pytest.raises(ValueError, match="max_position_embeddings"):
        _run(target, drafts=[draft], T=[2], max_new_tokens=300)


def test_unsupported_logits_processor(target, draft) -> None:
    """Every processor is served (tests/test_logits_processors.py) but those with a model, a
    batch layout or per-row state of their own."""
    from transformers import LogitsProcessorList
    from transformers.generation.logits_process import UnbatchedClassifierFreeGuidanceLogitsProcessor

    guidance = UnbatchedClassifierFreeGuidanceLogitsProcessor(1.5, target)
    with pytest.raises(ValueError, match=r"UnbatchedClassifierFreeGuidanceLogitsProcessor.*K/V cache"):
        _run(target, drafts=[draft], T=[2], logits_processor=LogitsProcessorList([guidance]))


def test_unsupported_stopping_criterion(target, draft) -> None:
    """Every stopping criterion is served (tests/test_stopping.py) but an assistant's confidence stop,
    which reads scores."""
    from transformers import StoppingCriteriaList
    from transformers.generation.stopping_criteria import ConfidenceCriteria

    with pytest.raises(ValueError, match="ConfidenceCriteria"):
        _run(target, drafts=[draft], T=[2], stopping_criteria=StoppingCriteriaList([ConfidenceCriteria(0.5)]))


@pytest.mark.parametrize("flag", ["output_attentions", "output_hidden_states"])
def test_unsupported_outputs(target, draft, flag) -> None:
    with pytest.raises(ValueError, match=flag):
        _run(target, drafts=[draft], T=[2], return_dict_in_generate=True, **{flag: True})


def test_right_padding_refused(target, draft) -> None:
    ids = torch.tensor([[5, 6, 7, 8], [5, 6, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    with pytest.raises(ValueError, match="left padding"):
        target.generate(ids, attention_mask=mask, custom_generate=hsd_fast.generate, drafts=[draft], T=[2])


def test_a_row_without_prompt_tokens_is_named(target, draft) -> None:
    """An all-zero attention_mask row is an empty prompt, not a padding mistake: the error says which."""
    ids = torch.tensor([[5, 6, 7, 8], [0, 0, 0, 0], [5, 6, 7, 8]])
    mask = torch.tensor([[1, 1, 1, 1], [0, 0, 0, 0], [1, 1, 1, 1]])
    with pytest.raises(ValueError, match="row 1 of attention_mask is all zeros"):
        target.generate(ids, attention_mask=mask, custom_generate=hsd_fast.generate, drafts=[draft], T=[2])


@pytest.mark.parametrize(
    ("option", "names"),
    [
        ({"min_new_tokens": 2}, "MinNewTokensLengthLogitsProcessor"),
        ({"min_length": 6}, "MinLengthLogitsProcessor"),
        ({"no_repeat_ngram_size": 2}, "NoRepeatNGramLogitsProcessor"),
        ({"bad_words_ids": [[5]]}, "NoBadWordsLogitsProcessor"),
        ({"prefix_allowed_tokens_fn": lambda batch, ids: [3, 4]}, "PrefixConstrainedLogitsProcessor"),
        ({"begin_suppress_tokens": [3]}, "SuppressTokensAtBeginLogitsProcessor"),
        ({"forced_eos_token_id": 2}, "ForcedEOSTokenLogitsProcessor"),
        ({"renormalize_logits": True}, "LogitNormalization"),
    ],
    ids=lambda v: next(iter(v)) if isinstance(v, dict) else "",
)
def test_history_or_length_dependent_options_are_served_sampled(target, draft, option, names) -> None:
    """Once refused, now served (exact: tests/test_logits_processors.py, test_min_length.py)."""
    out = _run(target, drafts=[draft], T=[2], do_sample=True, seed=1, **option)
    assert out.shape[0] == 1
    if "prefix_allowed_tokens_fn" in option:
        assert set(out[0, -3:].tolist()) <= {3, 4}


def test_stop_strings_need_a_tokenizer(target, draft) -> None:
    """HF drops ``tokenizer=`` before ``custom_generate``: ``stop_strings`` without hsd_fast's
    ``stop_tokenizer=`` is refused, naming it (served with it: tests/test_stopping.py)."""
    with pytest.raises(ValueError, match="stop_tokenizer="):
        _run(target, drafts=[draft], T=[2], stop_strings=["t5"])
    with pytest.raises(ValueError, match="stop_tokenizer="):
        _run(target, drafts=[draft], T=[2], stop_strings=["t5"], tokenizer=zoo.load_tokenizer())


@pytest.mark.parametrize("flag", ["output_attentions", "output_hidden_states"])
def test_model_internals_refused(target, draft, flag) -> None:
    with pytest.raises(ValueError, match=flag):
        _run(target, drafts=[draft], T=[2], return_dict_in_generate=True, **{flag: True})


def test_per_row_seeds_must_match_the_batch(target, draft) -> None:
    with pytest.raises(ValueError, match="one per row"):
        _run(target, drafts=[draft], T=[2], seed=[1, 2])
