"""hsd_fast/compat.py called directly: which models, vocabularies and devices are accepted, and that
each refusal names the model and what to change. (tests/test_hf_errors.py checks that `generate`
raises these refusals; here the checks themselves, including the cases it does not reach.)"""

import pytest
import torch
from hf_models import ARCHS, tiny_model
from transformers import MambaConfig, MambaForCausalLM, T5Config, T5ForConditionalGeneration

from hsd_fast.compat import (
    VOCAB_PADDING_TOLERANCE,
    check_devices,
    check_model,
    embeddable_ids,
    fit_logits,
    hierarchy_vocab_size,
    stand_in_id,
)

pytestmark = pytest.mark.hf


def _small(arch: str = "llama", **kwargs) -> torch.nn.Module:
    return tiny_model(arch, layers=1, **kwargs)


# ----------------------------------------------------------------------------- check_model
@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_supported_models_pass(arch: str, attn: str) -> None:
    check_model(_small(arch, attn=attn), "target")  # no exception


def test_encoder_decoder_refused() -> None:
    config = T5Config(vocab_size=32, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_heads=2)
    with pytest.raises(ValueError, match=r"^draft 1 \(T5ForConditionalGeneration\): .*encoder-decoder"):
        check_model(T5ForConditionalGeneration(config), "draft 1")


def test_a_recurrent_model_is_refused_with_the_reason() -> None:
    config = MambaConfig(vocab_size=96, hidden_size=16, num_hidden_layers=1, state_size=4)
    with pytest.raises(
        ValueError, match=r"^draft 0 \(MambaForCausalLM\): architecture not supported: layers with state"
    ):
        check_model(MambaForCausalLM(config), "draft 0")


def test_architecture_is_checked_by_class_not_by_ancestry() -> None:
    """A subclass (or a class from remote code) may change the forward pass: it is not taken for the
    transformers class it derives from."""
    model = _small("llama")
    model.__class__ = type("PatchedLlama", (type(model),), {})
    with pytest.raises(
        ValueError, match=r"target \(PatchedLlama\): architecture not supported: not a transformers causal LM"
    ):
        check_model(model, "target")


@pytest.mark.parametrize("attn", ["flash_attention_2", "flex_attention", None])
def test_unsupported_attention_refused(attn) -> None:
    model = _small("gpt2")
    model.config._attn_implementation = attn
    with pytest.raises(ValueError, match=f"attention implementation {attn!r} not supported") as err:
        check_model(model, "target")
    assert "attn_implementation=" in str(err.value) and "'sdpa'" in str(err.value)


def test_sliding_window_and_hybrid_layers_pass() -> None:
    """A window on every layer, or full and sliding layers mixed: the runner's masks apply it."""
    check_model(_small("qwen2", use_sliding_window=True, sliding_window=16, max_window_layers=0), "target")
    hybrid = tiny_model(
        "qwen2", layers=2, layer_types=["full_attention", "sliding_attention"], sliding_window=8
    )
    check_model(hybrid, "draft 0")


def test_layers_that_keep_state_or_other_patterns_are_refused() -> None:
    model = tiny_model(
        "qwen2", layers=2, layer_types=["full_attention", "sliding_attention"], sliding_window=8
    )
    model.config.layer_types = ["full_attention", "linear_attention"]
    with pytest.raises(ValueError, match="state cannot be rolled back"):
        check_model(model, "draft 0")
    model.config.layer_types = ["full_attention", "chunked_attention"]
    with pytest.raises(ValueError, match=r"another attention pattern: layer types \['chunked_attention'\]"):
        check_model(model, "draft 0")


# ----------------------------------------------------------------------------- hierarchy_vocab_size
def _vocab(size: int, seed: int = 0, **special) -> torch.nn.Module:
    model = _small(vocab_size=size, seed=seed)
    for name, value in special.items():
        setattr(model.config, name, value)
    return model


def test_equal_vocabularies() -> None:
    assert hierarchy_vocab_size(_vocab(96), [_vocab(96, 1), _vocab(96, 2)]) == 96
    assert hierarchy_vocab_size(_vocab(96), []) == 96


def test_padded_vocabularies_keep_the_targets() -> None:
    target, drafts = _vocab(1008), [_vocab(1000, 1), _vocab(1004, 2)]
    assert hierarchy_vocab_size(target, drafts) == 1008
    assert hierarchy_vocab_size(_vocab(1000), [_vocab(1008, 1)]) == 1000  # the target may be the smaller


def test_fit_logits_pads_with_minus_inf_or_cuts() -> None:
    logits = torch.arange(6.0).reshape(2, 3)
    assert torch.equal(fit_logits(logits, 3), logits)
    assert fit_logits(logits, 2).tolist() == [[0.0, 1.0], [3.0, 4.0]]
    padded = fit_logits(logits, 5)
    assert padded[:, :3].tolist() == logits.tolist() and (padded[:, 3:] == float("-inf")).all()


def test_ids_a_draft_cannot_embed_are_fed_as_its_stand_in() -> None:
    draft = _vocab(1000, pad_token_id=7)
    ids = torch.tensor([[5, 999, 1000, 1007]])
    assert stand_in_id(draft) == 7
    assert embeddable_ids(draft, ids).tolist() == [[5, 999, 7, 7]]
    draft.config.pad_token_id, draft.config.eos_token_id = None, [2000, 4]  # neither usable: 0
    assert stand_in_id(draft) == 0


def test_padding_tolerance_is_inclusive() -> None:
    limit = int(VOCAB_PADDING_TOLERANCE * 1000)  # 10 extra rows on 1000
    assert hierarchy_vocab_size(_vocab(1000), [_vocab(1000 + limit, 1)]) == 1000
    with pytest.raises(ValueError, match=r"different vocabularies \(logit sizes \[1000, 1011\]"):
        hierarchy_vocab_size(_vocab(1000), [_vocab(1000 + limit + 1, 1)])


@pytest.mark.parametrize(
    "special",
    [
        {"eos_token_id": 3},  # another EOS
        {"eos_token_id": [2, 5]},  # one EOS more
        {"bos_token_id": None},  # no BOS
        {"pad_token_id": 9},
    ],
    ids=lambda s: next(iter(s)),
)
def test_padded_vocabularies_need_identical_special_tokens(special: dict) -> None:
    with pytest.raises(ValueError, match="identical special tokens"):
        hierarchy_vocab_size(_vocab(1000), [_vocab(1008, 1, **special)])


def test_special_tokens_compare_as_id_lists() -> None:
    eos = {"eos_token_id": [2, 5]}
    assert hierarchy_vocab_size(_vocab(1000, **eos), [_vocab(1008, 1, **eos)]) == 1000
    # one id, given as an int or as a one-element list, is the same special token
    assert hierarchy_vocab_size(_vocab(1000, eos_token_id=2), [_vocab(1008, 1, eos_token_id=[2])]) == 1000


def test_special_tokens_must_lie_inside_the_smaller_vocabulary() -> None:
    # identical on both sides, but id 1003 would be cut: not mere padding
    with pytest.raises(ValueError, match="different vocabularies"):
        hierarchy_vocab_size(_vocab(1000, eos_token_id=1003), [_vocab(1008, 1, eos_token_id=1003)])


# ----------------------------------------------------------------------------- check_devices
def test_one_device_passes() -> None:
    target = _small()
    check_devices(target, [_small(seed=1)], torch.tensor([[5, 6]]))


def test_input_ids_on_another_device_refused() -> None:
    target = _small()
    with pytest.raises(ValueError, match=r"got models on \['cpu', 'cpu'\] and input_ids on meta"):
        check_devices(target, [_small(seed=1)], torch.tensor([[5, 6]], device="meta"))


def test_a_draft_on_another_device_refused() -> None:
    target, draft = _small(), _small(seed=1).to("meta")
    with pytest.raises(ValueError, match=r"one device; got models on \['cpu', 'meta'\]"):
        check_devices(target, [draft], torch.tensor([[5, 6]]))
