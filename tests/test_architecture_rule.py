"""The architecture rule itself (hsd_fast/architectures.py), on configs and classes: each refusal
and its reason, and which layers slide. (tests/test_architectures.py checks the rule against every
family of the installed transformers.)"""

from __future__ import annotations

import pytest
import transformers
from arch_configs import tiny_config, tiny_model

from hsd_fast import architectures
from hsd_fast.architectures import FULL, SLIDING, layer_types, model_refusal, module_source, refusal

pytestmark = pytest.mark.hf

SLIDING_CODE = "mask = create_sliding_window_causal_mask(**mask_kwargs)"
DICT_CODE = "if not isinstance(causal_mask_mapping := attention_mask, dict):"


def test_a_layer_slides_only_where_the_modeling_module_builds_sliding_masks() -> None:
    config = tiny_config("mistral")  # no layer types, a window: every layer slides
    assert layer_types(config, SLIDING_CODE) == [SLIDING, SLIDING]
    assert layer_types(config, "mask = create_causal_mask(**mask_kwargs)") == [FULL, FULL]
    assert layer_types(config, "") == [SLIDING, SLIDING]  # no code to read: the config as it is
    # Moshi's config has a window its code never applies (only full causal masks are built)
    moshi = transformers.MoshiForCausalLM
    assert layer_types(tiny_config("moshi", sliding_window=4), module_source(moshi)) == [FULL, FULL]
    qwen3 = tiny_config("qwen3")
    assert layer_types(qwen3, module_source(transformers.Qwen3ForCausalLM)) == [FULL, SLIDING]


def test_hybrid_models_need_a_forward_that_takes_masks_per_layer_type(monkeypatch) -> None:
    cls, config = transformers.Qwen3ForCausalLM, tiny_config("qwen3")
    assert refusal(cls, config) is None  # Qwen3Model.forward takes a dict
    assert refusal(cls, config, decoder_code=DICT_CODE) is None
    assert refusal(cls, config, decoder_code=SLIDING_CODE).startswith("hybrid without masks per layer type:")
    monkeypatch.setattr(architectures, "module_source", lambda _cls: "")  # no source installed
    assert refusal(cls, config).startswith("unreadable code:")
    assert refusal(cls, tiny_config("qwen3", use_sliding_window=False)) is None  # nothing slides


def test_layers_with_state_are_refused_whether_or_not_the_class_says_so() -> None:
    """MiniMax is not marked stateful, but lists linear-attention layers; Mamba is marked stateful
    (transformers <= 5.24: `_is_stateful`) or lists linear-attention layers (5.25 dropped the flag)."""
    minimax = tiny_config("minimax", layer_types=["linear_attention", FULL])
    assert refusal(transformers.MiniMaxForCausalLM, minimax).startswith("layers with state:")
    mamba = transformers.MambaConfig(vocab_size=96, hidden_size=16, num_hidden_layers=1, state_size=4)
    assert refusal(transformers.MambaForCausalLM, mamba).startswith("layers with state:")


def test_other_refusals_name_their_category() -> None:
    llama = tiny_config("llama")
    remote = type(
        "LlamaForCausalLM", (transformers.LlamaForCausalLM,), {"__module__": "transformers_modules.x"}
    )
    assert refusal(remote, llama).startswith("not a transformers causal LM class:")
    bart = transformers.BartConfig(vocab_size=96, d_model=16, encoder_layers=1, decoder_layers=1)
    assert refusal(transformers.BartForCausalLM, bart).startswith("encoder-decoder:")
    gemma3 = transformers.Gemma3Config()
    assert refusal(transformers.Gemma3ForConditionalGeneration, gemma3).startswith(
        "a wrapper around other models:"
    )
    chunked = tiny_config("llama4_text")
    assert "chunked_attention" in layer_types(chunked, "")
    assert refusal(transformers.Llama4ForCausalLM, chunked).startswith("another attention pattern:")
    bloom = transformers.BloomConfig(vocab_size=96, hidden_size=16, n_layer=1, n_head=2)
    assert refusal(transformers.BloomForCausalLM, bloom).startswith("attention of its own:")
    shared = tiny_config(
        "gemma3n_text",
        num_hidden_layers=4,
        layer_types=[SLIDING, FULL, SLIDING, FULL],
        num_kv_shared_layers=2,
    )
    assert refusal(transformers.Gemma3nForCausalLM, shared).startswith("K/V shared across layers:")
    looped = tiny_config("llama")
    looped.n_recurrent_loops = 2  # as Dory's (transformers 5.24) config says its layers loop
    assert refusal(transformers.LlamaForCausalLM, looped) == (
        "looped layers: n_recurrent_loops=2; layers that run several times per forward write copies "
        "of their cache layers the runner's cache does not hold"
    )


def test_an_encoder_used_without_is_decoder_is_refused_when_loaded() -> None:
    """BERT's LM head with is_decoder=False attends both ways: refused once its modules show it."""
    assert model_refusal(tiny_model("bert")) is None  # the tiny configs set is_decoder=True
    encoder = tiny_model("bert", is_decoder=False)
    assert model_refusal(encoder).startswith("bidirectional self-attention:")
