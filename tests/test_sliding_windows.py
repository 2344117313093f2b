"""Sliding-window and hybrid layers applied by position in the runner's own masks, K/V buffers that
follow each layer's shapes, and the models the runner refuses at its first forward (docs/design.md,
"Sliding windows by position", "Masks per layer type", "Caches that follow the model")."""

from __future__ import annotations

import pytest
import torch
from arch_configs import VOCAB, WINDOW, tiny_model
from enumerated import exact_distribution
from hf_models import noisy_copy

import hsd_fast
from hsd_fast.hf_runner import HFRunner
from hsd_fast.layout import fed_block
from hsd_fast.testing.exactness import pooled_chi_square

pytestmark = pytest.mark.hf

# (start, end) per row and forward: a prompt in two chunks, then decoding; row 1 sits the third
# forward out (padding: the scratch slot) and catches up with two tokens in the fourth.
SPANS = [((0, 5), (0, 3)), ((5, 7), (3, 6)), ((7, 8), (6, 6)), ((8, 9), (6, 8)), ((9, 12), (8, 11))]


@pytest.mark.parametrize(
    ("model_type", "attn", "masks"),
    [
        ("llama", "sdpa", "one full"),
        ("mistral", "sdpa", "one sliding"),
        ("mistral", "eager", "one sliding"),
        ("qwen3", "sdpa", "full + sliding"),
        ("gemma3_text", "eager", "full + sliding"),
    ],
)
def test_runner_logits_equal_the_models_own_forward(model_type: str, attn: str, masks: str) -> None:
    """Fed in spans through the slot cache, every position's logits equal one full forward of the
    model with its own (sliding, per-layer) masks, far beyond the window."""
    model = tiny_model(model_type, attn=attn)
    tokens = torch.randint(3, VOCAB, (2, 12), generator=torch.Generator().manual_seed(0))  # [B, S]
    expected = model(tokens).logits  # [B, S, V]
    runner = HFRunner(model, VOCAB)
    runner.prepare(2, tokens.shape[1])
    given = []
    model.register_forward_pre_hook(lambda _m, _a, kw: given.append(kw["attention_mask"]), with_kwargs=True)
    for spans in SPANS:
        starts, ends = (torch.tensor(side) for side in zip(*spans, strict=True))  # [B] each
        width = int((ends - starts).max())
        logits = runner.forward(fed_block(tokens, starts, ends, ends > starts, width), width)  # [B, L, V]
        for row, (start, end) in enumerate(spans):
            got = logits[row, width - (end - start) :]
            torch.testing.assert_close(got, expected[row, start:end], atol=1e-5, rtol=1e-5)
    assert tokens.shape[1] > WINDOW
    if masks == "full + sliding":
        assert all(set(m) == {"full_attention", "sliding_attention"} for m in given)
    else:
        assert all(isinstance(m, torch.Tensor) and m.dim() == 4 for m in given)
    assert (
        runner.windows
        == {
            "one full": {"full_attention": None},
            "one sliding": {"sliding_attention": WINDOW},
            "full + sliding": {"full_attention": None, "sliding_attention": WINDOW},
        }[masks]
    )


@pytest.mark.slow
def test_sampling_with_a_window_shorter_than_the_sequence() -> None:
    """Sampled HSD on a hybrid model (one full, one sliding layer; window 4 over sequences of 7)
    against the target's exact distribution, from its own full forward."""
    vocab, steps, samples = 6, 3, 5000
    target = tiny_model("qwen3", vocab_size=vocab, lm_head_scale=4.0)
    drafts = [noisy_copy(target, 0.4, seed=1), noisy_copy(target, 0.2, seed=2)]
    prompt = torch.tensor([3, 4, 5, 1])
    assert len(prompt) + steps > WINDOW
    torch.manual_seed(0)
    out = target.generate(
        prompt.expand(samples, -1), custom_generate=hsd_fast.generate, drafts=drafts, T=[2, 2],
        do_sample=True, top_k=None, max_new_tokens=steps, eos_token_id=None, compile=False,
    )  # fmt: skip
    result = pooled_chi_square(
        [tuple(r) for r in out[:, len(prompt) :].tolist()], exact_distribution(target, prompt, vocab, steps)
    )
    assert result.p_value > 1e-3, result


def test_buffers_follow_each_layers_keys_and_values() -> None:
    """Multi-head latent attention (DeepSeek V3) caches its compressed latent in the key slot and the
    rotary part of its keys in the value slot, one head each of different widths: the buffers are
    allocated from what the model writes, not from the config's heads and head_dim."""
    model = tiny_model("deepseek_v3", num_key_value_heads=4, v_head_dim=8)
    runner = HFRunner(model, VOCAB)
    runner.prepare(3, 10)
    assert runner.cache is not None
    captured: dict[int, tuple] = {}
    original = runner.cache.update

    def spy(key_states, value_states, layer_idx, *args, **kwargs):
        captured[layer_idx] = (key_states.shape, value_states.shape, key_states.dtype)
        return original(key_states, value_states, layer_idx, *args, **kwargs)

    runner.cache.update = spy
    tokens = torch.randint(3, VOCAB, (3, 6))
    runner.forward(
        fed_block(
            tokens, torch.zeros(3, dtype=torch.long), torch.full((3,), 6), torch.ones(3, dtype=torch.bool), 6
        ),
        1,
    )
    for layer, (k_shape, v_shape, dtype) in captured.items():
        keys, values = runner.cache.keys[layer], runner.cache.values[layer]
        assert keys.shape == (3, k_shape[1], runner.scratch + 1, k_shape[3]) and keys.dtype == dtype
        assert values.shape == (3, v_shape[1], runner.scratch + 1, v_shape[3])
    assert any(k[3] != v[3] for k, v, _ in captured.values()), "K and V head dims should differ here"


def test_a_model_sharing_kv_across_layers_is_refused() -> None:
    """Layer 1 writes its K/V as layer 0 (as models sharing K/V across layers do): the first forward
    calls update twice for layer 0 and never for layer 1, and generate refuses the model."""
    model = tiny_model("llama")
    model.model.layers[1].self_attn.layer_idx = 0
    with pytest.raises(ValueError, match=r"called Cache.update \[2, 0\] times per layer index"):
        model.generate(torch.tensor([[5, 6, 7]]), custom_generate=hsd_fast.generate, max_new_tokens=3)


def test_a_model_whose_forward_breaks_on_the_cache_is_refused() -> None:
    """Layer 1 writes to a cache layer the model does not have (as looped models write to copies of
    their layers): the first forward fails inside the model, and generate refuses it with the reason
    instead of the model's shape error."""
    model = tiny_model("llama")
    model.model.layers[1].self_attn.layer_idx = 5
    with pytest.raises(ValueError, match=r"its forward fails on hsd_fast's slot cache \(RuntimeError"):
        model.generate(torch.tensor([[5, 6, 7]]), custom_generate=hsd_fast.generate, max_new_tokens=3)


@pytest.mark.slow
def test_compiled_steps_take_a_dict_of_masks() -> None:
    """The compiled level steps trace the runner's masks per layer type (fullgraph: a graph break
    would raise) and decode the hybrid model's own greedy tokens."""
    target = tiny_model("qwen3")
    drafts = [noisy_copy(target, 0.1, seed=2)]
    ids = torch.tensor([[5, 9, 11, 40, 3, 7, 12, 60, 33]])
    expected = target.generate(ids, do_sample=False, max_new_tokens=16, eos_token_id=None)
    out = target.generate(
        ids, custom_generate=hsd_fast.generate, drafts=drafts, T=[2], do_sample=False, max_new_tokens=16,
        eos_token_id=None, compile=True,
    )  # fmt: skip
    assert out.tolist() == expected.tolist()
