"""A cost twin computes the same function as its source: fp32 logits, and greedy HSD outputs."""

import pytest
import torch
from hf_models import derived_drafts, tiny_model

import hsd_fast
from hsd_fast.zoo import cost_twin

pytestmark = pytest.mark.hf


@pytest.fixture(scope="module")
def source() -> torch.nn.Module:
    model = tiny_model("llama", layers=3, seed=4)  # GQA (4 heads over 2 KV heads), untied head
    with torch.no_grad():  # non-trivial norm weights, so the sqrt(d/D) rescaling is exercised
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    return model


@pytest.mark.parametrize(
    "shape",
    [
        {"hidden_size": 160, "num_layers": 5, "intermediate_size": 320, "num_heads": 10},
        {"hidden_size": 64, "num_layers": 3, "intermediate_size": 128, "num_heads": 6},  # heads only
        {"shape": "xs"},
    ],
    ids=["all", "heads", "named"],
)
def test_twin_logits_equal_source(source, shape) -> None:
    twin = cost_twin(source, **shape)
    ids = torch.randint(3, 96, (3, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected, got = source(ids).logits, twin(ids).logits
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert sum(p.numel() for p in twin.parameters()) > sum(p.numel() for p in source.parameters())
    assert twin.config.head_dim == source.config.head_dim


def test_twin_shape_follows_arguments(source) -> None:
    twin = cost_twin(source, hidden_size=128, num_layers=6, intermediate_size=256)
    config = twin.config
    assert (config.hidden_size, config.num_hidden_layers, config.intermediate_size) == (128, 6, 256)
    assert config.num_attention_heads == 128 // source.config.head_dim  # default: heads fill hidden
    assert config.num_key_value_heads == config.num_attention_heads // 2  # the source's GQA group kept
    assert twin.model.layers[5].mlp.down_proj.weight.abs().max() == 0  # added layers write nothing
    assert twin.model.layers[5].mlp.up_proj.weight.abs().max() > 0  # ...but read (dense matmuls)


def test_greedy_hsd_through_a_twin_target_equals_the_source(source) -> None:
    twin = cost_twin(source, hidden_size=128, num_layers=5, intermediate_size=256)
    drafts = derived_drafts(source, 2)
    ids = torch.randint(3, 96, (2, 9), generator=torch.Generator().manual_seed(1))
    expected = source.generate(ids, do_sample=False, max_new_tokens=30)
    out = twin.generate(
        ids, custom_generate=hsd_fast.generate, drafts=drafts, T=[2, 3], do_sample=False, max_new_tokens=30
    )
    assert out.tolist() == expected.tolist()
    # and the twin as a draft of its source
    out = source.generate(
        ids, custom_generate=hsd_fast.generate, drafts=[twin], T=[4], do_sample=False, max_new_tokens=30
    )
    assert out.tolist() == expected.tolist()


def test_twin_refuses_what_it_cannot_preserve(source) -> None:
    with pytest.raises(ValueError, match="can only grow"):
        cost_twin(source, hidden_size=32)
    with pytest.raises(ValueError, match="multiple of the source's GQA group"):
        cost_twin(source, num_heads=5)
    with pytest.raises(ValueError, match="unknown shape"):
        cost_twin(source, shape="huge")
    with pytest.raises(TypeError, match="LlamaForCausalLM"):
        cost_twin(tiny_model("gpt2"))


@pytest.mark.parametrize(
    "heads",
    [
        {"head_dim": 32, "num_heads": 8, "num_kv_heads": 4},  # larger heads (RoPE remapped), GQA regrouped
        {"head_dim": 64, "num_heads": 16, "num_kv_heads": 2},  # the source's 2 KV heads, groups of 8
        {"head_dim": 16, "num_heads": 12, "num_kv_heads": 3},  # same head dim, one KV head added
    ],
    ids=["dim2x", "dim4x-group8", "kv-added"],
)
def test_twin_with_larger_heads_and_other_groups_keeps_the_logits(source, heads) -> None:
    """A twin of a family's shape: the source's heads placed inside larger ones, regrouped for GQA."""
    twin = cost_twin(source, hidden_size=128, num_layers=4, intermediate_size=256, **heads)
    assert (twin.config.head_dim, twin.config.num_key_value_heads) == (
        heads["head_dim"],
        heads["num_kv_heads"],
    )
    ids = torch.randint(3, 96, (2, 50), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        torch.testing.assert_close(twin(ids).logits, source(ids).logits, atol=1e-5, rtol=1e-5)


def test_a_planted_rope_misplacement_changes_the_logits(source, monkeypatch) -> None:
    """The logit check above can fail: coordinates placed without the rotary stride rotate at the
    wrong frequencies."""
    from hsd_fast.zoo import twin as twin_module

    monkeypatch.setattr(twin_module, "rotary_positions", lambda d, D: torch.arange(d))  # no stride
    twin = cost_twin(source, hidden_size=128, head_dim=32, num_heads=8, num_kv_heads=4)
    ids = torch.randint(3, 96, (2, 50), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert (twin(ids).logits - source(ids).logits).abs().max() > 1e-3


def test_family_shapes_and_their_refusals(source) -> None:
    from hsd_fast.zoo.twin import FAMILY_SHAPES

    assert FAMILY_SHAPES["llama-3-8b"].num_kv_heads == 8 and FAMILY_SHAPES["llama-3-8b"].head_dim == 128
    with pytest.raises(ValueError, match="multiple of the source"):
        cost_twin(source, head_dim=24)
    with pytest.raises(ValueError, match="at least the source's 2 query heads"):
        cost_twin(source, num_heads=8, num_kv_heads=8)
    with pytest.raises(ValueError, match="can only grow"):
        cost_twin(source, num_kv_heads=1, num_heads=4)


def test_twin_built_in_another_dtype_keeps_rope_in_fp32(source) -> None:
    twin = cost_twin(source, hidden_size=128, head_dim=32, num_heads=8, num_kv_heads=4, dtype=torch.bfloat16)
    assert twin.model.embed_tokens.weight.dtype == torch.bfloat16
    assert twin.model.rotary_emb.inv_freq.dtype == torch.float32
    ids = torch.randint(3, 96, (1, 30), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        got, expected = twin(ids).logits.float(), source(ids).logits
    assert (got - expected).abs().max() < 0.1 * expected.abs().max()  # bf16 rounding, not another function


def test_twin_draws_from_its_own_generator(source) -> None:
    shape = {"hidden_size": 128, "num_layers": 5, "intermediate_size": 256}
    state = torch.random.get_rng_state()
    a = cost_twin(source, **shape, seed=3)
    assert torch.equal(torch.random.get_rng_state(), state)  # the global generator is left alone
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1234)  # ...and does not matter
        b = cost_twin(source, **shape, seed=3)
    c = cost_twin(source, **shape, seed=4)
    for name, weight in a.state_dict().items():
        assert torch.equal(weight, b.state_dict()[name]), name
    # another seed: other random reads (the new layer's, the new heads'), the same function
    assert not torch.equal(a.model.layers[4].mlp.up_proj.weight, c.model.layers[4].mlp.up_proj.weight)
    new_heads = a.model.layers[0].self_attn.q_proj.weight[source.config.hidden_size :]
    assert abs(float(new_heads.detach().std()) - source.config.initializer_range) < 5e-3
    ids = torch.randint(3, 96, (2, 20), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(a(ids).logits, c(ids).logits, atol=1e-5, rtol=1e-5)
