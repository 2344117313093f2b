"""The tree-attention kernel equals its torch reference, and the reference sees what the dense mask
of the HF runner sees (triton_kernels/tree_attention*.py, docs/design.md "Tree attention").

On CPU the kernel runs interpreted (conftest.py) on small ragged batches, fp32 and fp16 (the
interpreter's bf16 dot is wrong); `-m gpu` runs real sizes and bf16 natively on CUDA. The HF-level
checks (a tiny Llama, Qwen2 and GPT-2 forward through the registered implementation gives every
path its own logits) are in test_tree_runner.py."""

from __future__ import annotations

import pytest
import torch
from hf_models import tiny_model
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("triton")  # every test here runs a kernel: none without Triton

from hsd_fast import attention
from hsd_fast.hf_runner import HFRunner
from hsd_fast.layout import FedBlock
from hsd_fast.tree import Tree
from hsd_fast.triton_kernels.tree_attention import plan_splits, tree_attention_triton
from hsd_fast.triton_kernels.tree_attention_torch import (
    attention_meta,
    pack_tree_bits,
    tree_attention_torch,
    visible_slots,
)

pytestmark = [pytest.mark.triton, pytest.mark.hf]  # the kernel, and its wiring into transformers

TREES = {
    "none": None,
    "chain": Tree.chain(3),
    "full": Tree.full([2, 2]),
    "spine": Tree.spine(3, 2),
    "wide": Tree.full([3, 2, 1]),
    "parents": Tree.from_parents([-1, -1, 0, 1, 1, 3]),
}


def _block(tree: Tree | None, prefixes: list[int], catch_up: list[int], width: int) -> FedBlock:
    """Row r: ``catch_up[r]`` chain tokens ending at its prefix ``prefixes[r]`` (positions
    ``[P - c, P)``), then the tree's nodes at slots ``[P, P + n)`` (positions P + depth), right-aligned
    in ``width`` columns; a row with no tokens sits out. The ids are irrelevant to attention."""
    rows, n = len(prefixes), tree.num_nodes if tree else 0
    positions = torch.zeros(rows, width, dtype=torch.int64)
    slots = torch.zeros_like(positions)
    valid = torch.zeros(rows, width, dtype=torch.bool)
    sees = torch.zeros(rows, width, max(n, 1), dtype=torch.bool)
    for r, (prefix, c) in enumerate(zip(prefixes, catch_up, strict=True)):
        chain = torch.arange(prefix - c, prefix)
        node_positions = prefix + torch.tensor(tree.depths if tree else [], dtype=torch.int64)
        fed = c + n
        positions[r, width - fed :] = torch.cat([chain, node_positions])
        slots[r, width - fed :] = torch.cat([chain, prefix + torch.arange(n)])
        valid[r, width - fed :] = True
        if tree:
            sees[r, width - n :, :n] = tree.ancestors()
    if tree is None:
        return FedBlock(torch.zeros_like(positions), positions, valid, slots)
    return FedBlock(
        torch.zeros_like(positions), positions, valid, slots, torch.tensor(prefixes), sees[..., :n]
    )


def _meta(block: FedBlock) -> torch.Tensor:
    return attention_meta(torch.where(block.valid, block.positions, -1), block.tree_start, block.tree_sees)


@st.composite
def _cases(draw):
    tree = TREES[draw(st.sampled_from(sorted(TREES)))]
    rows = draw(st.integers(1, 3))
    n = tree.num_nodes if tree else 0
    catch_up = [draw(st.integers(0, 3)) for _ in range(rows)]
    prefixes = [draw(st.integers(c, 40)) for c in catch_up]  # prefix 0 included (then no catch-up)
    # With no tree, a chain block of its own (a row may feed nothing: it sits out); else padding may follow.
    width = max(max(catch_up), 1) if tree is None else max(catch_up) + n + draw(st.integers(0, 1))
    kv_heads, group = draw(st.sampled_from([(1, 1), (2, 1), (1, 4), (2, 2)]))
    dim = draw(st.sampled_from([32, 64, 80, 128]))  # 80: a head dim the kernel pads to a power of two
    dtype = draw(st.sampled_from([torch.float32, torch.float16]))
    splits = draw(st.sampled_from([None, 1, 2, 4]))
    return tree, prefixes, catch_up, width, kv_heads, group, dim, dtype, splits, draw(st.integers(0, 99))


def _inputs(rows, width, heads, kv_heads, slots, dim, dtype, seed, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    query = torch.randn(rows, width, heads, dim, generator=gen).transpose(1, 2)  # a strided view, as HF's
    keys, values = (torch.randn(rows, kv_heads, slots, dim, generator=gen) for _ in range(2))
    return (t.to(device=device, dtype=dtype) for t in (query, keys, values))


@settings(max_examples=40, deadline=None)
@given(_cases())
def test_kernel_equals_reference_on_ragged_batches(case) -> None:
    tree, prefixes, catch_up, width, kv_heads, group, dim, dtype, splits, seed = case
    block = _block(tree, prefixes, catch_up, width)
    meta = _meta(block)
    slots = 48 + (tree.num_nodes if tree else 0)
    query, keys, values = _inputs(len(prefixes), width, kv_heads * group, kv_heads, slots, dim, dtype, seed)
    expected = tree_attention_torch(query, keys, values, meta, dim**-0.5)
    out = tree_attention_triton(query, keys, values, meta, dim**-0.5, splits=splits, block_n=16)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-3
    torch.testing.assert_close(out, expected, atol=tolerance, rtol=tolerance)
    assert not out[~block.valid].any()  # padding columns: zeros


@pytest.mark.parametrize("tree", sorted(TREES))
def test_the_reference_sees_what_the_dense_mask_sees(tree: str) -> None:
    """On every real column, ``visible_slots`` of the metadata is the runner's dense SDPA mask."""
    runner = HFRunner(tiny_model("llama", layers=1), 96, "dense")
    runner.prepare(3, 40, tree_slots=8)
    block = _block(TREES[tree], [5, 0, 17], [2, 0, 3], 3 + (TREES[tree].num_nodes if TREES[tree] else 0))
    num_slots = runner.cache.num_slots
    dense = runner._mask(block, torch.arange(num_slots), None)[:, 0] == 0  # [B, L, S]
    sparse = visible_slots(_meta(block), num_slots)
    assert torch.equal(sparse[block.valid], dense[block.valid])
    assert not sparse[~block.valid].any()  # padding sees nothing (the dense mask shows it the scratch slot)


def test_tree_bits_pack_sixty_four_nodes_per_word() -> None:
    sees = torch.zeros(1, 2, 130, dtype=torch.bool)
    sees[0, 0, [0, 63, 64, 129]] = True
    sees[0, 1, 63] = True
    words = pack_tree_bits(sees)
    assert words.shape == (1, 2, 3)
    assert words[0, 0].tolist() == [1 - 2**63, 1, 2]  # bit 63 is the sign bit
    assert torch.equal(
        visible_slots(attention_meta(torch.tensor([[5, 5]]), torch.tensor([10]), sees), 140)[0, :, 10:],
        sees[0],
    )


def test_splits_depend_on_shapes_only() -> None:
    # Few programs over a long cache: split; many programs or a short cache: one split.
    assert plan_splits(programs=8, num_slots=32768, processors=132) == 32
    assert plan_splits(programs=512, num_slots=32768, processors=132) == 1
    assert plan_splits(programs=8, num_slots=384, processors=132) == 1


def test_mismatched_heads_and_bad_metadata_are_refused() -> None:
    query, keys, values = _inputs(1, 2, 3, 2, 16, 32, torch.float32, 0)
    meta = attention_meta(torch.tensor([[3, 4]]))
    with pytest.raises(ValueError, match="multiple of K/V heads"):
        tree_attention_triton(query, keys, values, meta, 1.0)
    query, keys, values = _inputs(1, 2, 4, 2, 16, 32, torch.float32, 0)
    with pytest.raises(ValueError, match="int64"):
        tree_attention_triton(query, keys, values, meta.int(), 1.0)


def test_models_the_kernel_cannot_serve_keep_the_dense_path() -> None:
    windowed = tiny_model("qwen2", use_sliding_window=True, sliding_window=4, max_window_layers=0)
    assert "sliding-window" in attention.refusal(windowed, HFRunner(windowed, 96, "dense").windows)
    eager = tiny_model("llama", attn="eager")
    assert "eager" in attention.refusal(eager, {"full_attention": None})
    with pytest.raises(ValueError, match="cannot take the fused attention kernel"):
        HFRunner(eager, 96, "fused")
    assert not HFRunner(tiny_model("llama"), 96, "auto").fused  # "auto" on the CPU: dense
    interpreted_bf16 = tiny_model("llama").to(torch.bfloat16)  # the interpreter's bf16 dots are wrong
    assert "interpreter" in attention.refusal(interpreted_bf16, {"full_attention": None})
    assert attention.refusal(tiny_model("llama").half(), {"full_attention": None}) is None


def test_the_environment_picks_the_default_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HSD_FAST_ATTENTION", "auto")
    assert not HFRunner(tiny_model("llama"), 96).fused  # auto, on the CPU: dense
    monkeypatch.setenv("HSD_FAST_ATTENTION", "fast")
    with pytest.raises(ValueError, match="HSD_FAST_ATTENTION must be 'auto' or 'dense'"):
        HFRunner(tiny_model("llama"), 96)


def test_a_switched_model_runs_sdpa_for_every_other_call() -> None:
    """``use_fused`` leaves a model's own calls (no metadata) on SDPA: the same logits as before."""
    model = tiny_model("llama", seed=5)
    ids = torch.tensor([[5, 17, 3, 40, 8, 11]])
    with torch.no_grad():
        before = model(input_ids=ids).logits
        runner = HFRunner(model, 96, "fused")
        assert runner.fused and model.config._attn_implementation == attention.IMPLEMENTATION
        after = model(input_ids=ids).logits
    torch.testing.assert_close(after, before, atol=0, rtol=0)


# ------------------------------------------------------------------------------------ real sizes
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(
    "dtype", [torch.bfloat16, torch.float16, torch.float32], ids=["bf16", "fp16", "fp32"]
)
@pytest.mark.parametrize("context", [512, 4096, 32768])
def test_kernel_equals_reference_on_cuda(dtype: torch.dtype, context: int) -> None:
    for tree, (kv_heads, group, dim) in [(Tree.full([4, 2, 2]), (8, 4, 128)), (None, (4, 1, 64))]:
        rows = 4
        prefixes = [context - 40, context // 2, 7, context - 100]
        block = _block(tree, prefixes, [3, 0, 2, 5], 5 + (tree.num_nodes if tree else 0))
        meta = _meta(block).cuda()
        query, keys, values = _inputs(
            rows, block.valid.shape[1], kv_heads * group, kv_heads, context, dim, dtype, 0, "cuda"
        )
        expected = tree_attention_torch(query, keys, values, meta, dim**-0.5)
        out = tree_attention_triton(query, keys, values, meta, dim**-0.5)
        tolerance = 2e-2 if dtype == torch.bfloat16 else 2e-3
        torch.testing.assert_close(out, expected, atol=tolerance, rtol=tolerance)


def test_the_fused_path_compiles_into_one_graph() -> None:
    """A tiny Llama's forward through the fused path traces into one graph (``fullgraph``): the
    kernel is an opaque op (``hsd_fast::tree_attention``) that a compiled step calls as it is; the
    logits equal the eager ones. The traced graph is run as it is, with no code generation."""
    model = tiny_model("llama", seed=6, layers=2)
    runner = HFRunner(model, 96, "fused")
    runner.prepare(2, 32, tree_slots=8)
    block = _block(TREES["full"], [5, 9], [1, 2], 2 + TREES["full"].num_nodes)
    block = block._replace(
        input_ids=torch.randint(3, 96, block.positions.shape, generator=torch.Generator().manual_seed(0))
    )
    graphs = []

    def backend(graph: torch.fx.GraphModule, example_inputs: list) -> object:
        graphs.append(graph.code)
        return graph.forward  # run the traced graph as it is

    torch._dynamo.reset()
    compiled = torch.compile(runner.forward, fullgraph=True, backend=backend)
    with torch.no_grad():
        eager = runner.forward(block, 4)
        traced = compiled(block, 4)
    torch.testing.assert_close(traced, eager, atol=1e-5, rtol=1e-5)
    assert len(graphs) == 1 and graphs[0].count("hsd_fast.tree_attention") == 2  # one call per layer
