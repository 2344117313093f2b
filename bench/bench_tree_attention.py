"""Benchmark of verification attention (`triton_kernels/tree_attention.py`): the kernel vs SDPA with the
dense mask (today's path) vs `flex_attention` with a block mask, side by side in one run.

    python bench/bench_tree_attention.py            # CUDA if present, else CPU (references only)
    python bench/bench_tree_attention.py --quick    # a small grid
    python bench/bench_tree_attention.py --flex     # also flex_attention (compiles once per shape)
    python bench/bench_tree_attention.py --splits   # the kernel at every slot split, decode-sized rows

One layer of a Llama-3-8B-shaped attention (32 query heads, 8 K/V heads, head dim 128, bf16 on CUDA,
fp32 on CPU): each row has a prefix of ``context - n`` cached slots and feeds a tree of n nodes
(a binary tree in breadth-first order; n = 1 is one token), all of it in one slot cache of
``context`` slots. Columns: kernel (the launcher's slot split), sdpa_dense (SDPA with the additive
``[B, 1, L, S]`` mask, grouped heads), *_graph (the GPU's own time: one call replayed from a CUDA
graph, no host launch cost, as in a compiled step under CUDA graphs), flex (a prebuilt block mask,
building it not timed; at batch 8 and trees of 8 and 64 nodes only: each shape compiles),
dense_mask_build (building the additive mask from the metadata, once per forward in the runner),
and the roofline: max(bytes the kernel must move / copy bandwidth, FLOPs / measured bf16 matmul
peak).
On CPU only the references run: the torch reference and SDPA with the dense mask.
Writes bench/results/tree_attention_<device>.{json,md}.

``--splits`` sweeps the kernel's slot split instead (``plan_splits`` splits only from 2048 slots,
``MIN_SPLIT_SLOTS``: at batch 1 and 8 K/V heads a shorter cache runs 8 programs on a GPU of 132
processors): per row the GPU's own time at every power-of-two split that leaves at least 64 slots a
split, each output checked against the reference, beside the launcher's own choice. Writes
bench/results/tree_attention_splits_<device>.{json,md}; on a CPU it runs under the Triton
interpreter (``TRITON_INTERPRET=1``) as a check, untimed.
"""

from __future__ import annotations

import functools
import itertools

import torch
import torch.nn.functional as F
import triton
from kernel_bench import graph_us, median_us, parse_args, run_meta, write_results

from hsd_fast.tree import Tree
from hsd_fast.triton_kernels.tree_attention import tree_attention_triton
from hsd_fast.triton_kernels.tree_attention_torch import attention_meta, tree_attention_torch, visible_slots

KEYS = ["batch", "context", "tree_nodes"]
HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128


def binary_tree(n: int) -> Tree:
    return Tree.from_parents([-1] + [(j - 1) // 2 for j in range(1, n)])


def make_case(batch: int, context: int, n: int, dtype: torch.dtype, device: str) -> dict:
    tree = binary_tree(n)
    prefix = context - n
    gen = torch.Generator(device=device).manual_seed(0)
    query = torch.randn(batch, n, HEADS, HEAD_DIM, generator=gen, device=device, dtype=dtype).transpose(1, 2)
    keys, values = (
        torch.randn(batch, KV_HEADS, context, HEAD_DIM, generator=gen, device=device, dtype=dtype)
        for _ in range(2)
    )
    last_seen = torch.full((batch, n), prefix, device=device) + torch.tensor(tree.depths, device=device)
    sees = tree.ancestors(device).expand(batch, -1, -1)
    meta = attention_meta(last_seen, torch.full((batch,), prefix, device=device), sees)
    return {"query": query, "keys": keys, "values": values, "meta": meta}


def additive_mask(meta: torch.Tensor, num_slots: int, dtype: torch.dtype) -> torch.Tensor:
    sees = visible_slots(meta, num_slots)[:, None]  # [B, 1, L, S]
    return torch.zeros(sees.shape, dtype=dtype, device=meta.device).masked_fill(~sees, torch.finfo(dtype).min)


def matmul_peak(dtype: torch.dtype) -> float:
    """Measured FLOP/s of a large square matmul."""
    a = torch.randn(8192, 8192, device="cuda", dtype=dtype)
    return 2 * 8192**3 / (triton.testing.do_bench(lambda: a @ a, return_mode="median") * 1e-3)


SPLITS = (1, 2, 4, 8, 16, 32)
MIN_SLOTS_PER_SPLIT = 64


def split_sweep(shapes: list[tuple[int, int, int]], device: str, dtype: torch.dtype) -> list[dict]:
    """For each (batch, context, tree nodes): the kernel's GPU time at every split in ``SPLITS`` that
    leaves ``MIN_SLOTS_PER_SPLIT`` slots a split and at the launcher's choice (None off CUDA), every
    output checked against the torch reference."""
    cuda = device == "cuda"
    rows = []
    for batch, context, n in shapes:
        case = make_case(batch, context, n, dtype, device)
        q, k, v, m = case["query"], case["keys"], case["values"], case["meta"]
        scale = HEAD_DIM**-0.5
        reference = tree_attention_torch(q, k, v, m, scale)
        row: dict = {"batch": batch, "context": context, "tree_nodes": n}
        for splits in (None, *(s for s in SPLITS if context >= s * MIN_SLOTS_PER_SPLIT)):
            call = functools.partial(tree_attention_triton, q, k, v, m, scale, splits=splits)
            torch.testing.assert_close(call(), reference, atol=2e-2, rtol=2e-2)
            row["launcher_us" if splits is None else f"splits_{splits}_us"] = graph_us(call) if cuda else None
        if cuda:
            timed = {key: us for key, us in row.items() if key.startswith("splits_")}
            best = min(timed, key=timed.get)
            row["best"] = best.removesuffix("_us")
            row["launcher_over_best"] = row["launcher_us"] / timed[best]
        rows.append(row)
        print(row, flush=True)
    return rows


def main() -> None:
    args = parse_args(
        __doc__,
        "batch {1, 8}, context {512, 8192}, tree {1, 16}",
        flex="also flex_attention (CUDA)",
        splits="sweep the kernel's slot split instead",
    )
    cuda = args.device == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    if args.splits:
        if cuda:
            shapes = list(itertools.product([1, 8], [512, 1024, 2048, 8192], [1, 8]))
        else:  # the interpreter: a check of the script, not a timing
            shapes = [(1, 128, 1), (1, 128, 8)]
        meta = run_meta(args.device, heads=HEADS, kv_heads=KV_HEADS, head_dim=HEAD_DIM, dtype=str(dtype))
        rows = split_sweep(shapes, args.device, dtype)
        notes = [
            "The GPU's own time (one call replayed from a CUDA graph) in microseconds, one attention "
            f"layer ({HEADS} query heads, {KV_HEADS} K/V heads, head dim {HEAD_DIM}, {dtype}), at each "
            "slot split and at the launcher's choice (`plan_splits`)."
        ]
        write_results(f"tree_attention_splits_{args.device}", "Slot splits", notes, KEYS, rows, meta)
        return
    if cuda:
        batches = [1, 8] if args.quick else [1, 8, 32]
        contexts = [512, 8192] if args.quick else [512, 2048, 8192, 32768]
        sizes = [1, 16] if args.quick else [1, 8, 32, 64]
    else:
        batches, contexts, sizes = [1, 4], [512, 2048], [1, 16]
    meta = run_meta(args.device, heads=HEADS, kv_heads=KV_HEADS, head_dim=HEAD_DIM, dtype=str(dtype))
    if cuda:
        meta["matmul_peak_TFLOPs"] = matmul_peak(dtype) / 1e12
    flex = None
    if args.flex and cuda:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        flex = torch.compile(flex_attention)
        torch._dynamo.config.recompile_limit = 64  # one graph per flex shape

    results = []
    for batch, context, n in itertools.product(batches, contexts, sizes):
        case = make_case(batch, context, n, dtype, args.device)
        q, k, v, m = case["query"], case["keys"], case["values"], case["meta"]
        scale = HEAD_DIM**-0.5
        mask = additive_mask(m, context, dtype)
        row = {"batch": batch, "context": context, "tree_nodes": n}
        sdpa = functools.partial(F.scaled_dot_product_attention, q, k, v, attn_mask=mask, enable_gqa=True)
        row["sdpa_dense_us"] = median_us(sdpa, cuda)
        row["dense_mask_build_us"] = median_us(functools.partial(additive_mask, m, context, dtype), cuda)
        if not cuda:
            row["reference_us"] = median_us(functools.partial(tree_attention_torch, q, k, v, m, scale), False)
            results.append(row)
            print(row, flush=True)
            continue
        if batch * context <= 8 * 8192:  # the fp32 reference needs ~40x the cache's memory
            out = tree_attention_triton(q, k, v, m, scale)
            torch.testing.assert_close(out, tree_attention_torch(q, k, v, m, scale), atol=2e-2, rtol=2e-2)
        row["kernel_us"] = median_us(functools.partial(tree_attention_triton, q, k, v, m, scale), True)
        # The GPU's own time (one call replayed from a CUDA graph): no host launch cost
        row["kernel_graph_us"] = graph_us(functools.partial(tree_attention_triton, q, k, v, m, scale))
        row["sdpa_dense_graph_us"] = graph_us(sdpa)
        if flex is not None and batch == 8 and n in (8, 64):  # each shape compiles: a few only
            sees = visible_slots(m, context)  # [B, L, S]
            block_mask = create_block_mask(
                lambda b, h, qi, ki, sees=sees: sees[b, qi, ki], batch, None, n, context, device="cuda"
            )
            try:
                row["flex_us"] = median_us(
                    functools.partial(flex, q, k, v, block_mask=block_mask, enable_gqa=True), True
                )
            except Exception as err:  # a shape flex cannot compile: say so, measure the rest
                row["flex_us"] = f"failed: {type(err).__name__}"
        visible_kv = context  # every row reads its whole prefix and the tree's slots
        bytes_moved = (
            2 * batch * KV_HEADS * visible_kv * HEAD_DIM * q.element_size() + 2 * q.numel() * q.element_size()
        )
        flops = 4 * batch * HEADS * n * visible_kv * HEAD_DIM
        row["roofline_us"] = (
            max(
                bytes_moved / (meta["copy_bandwidth_GBps"] * 1e9), flops / (meta["matmul_peak_TFLOPs"] * 1e12)
            )
            * 1e6
        )
        row["kernel_graph_over_roofline"] = row["kernel_graph_us"] / row["roofline_us"]
        row["sdpa_dense_over_kernel"] = row["sdpa_dense_us"] / row["kernel_us"]
        row["sdpa_dense_over_kernel_graph"] = row["sdpa_dense_graph_us"] / row["kernel_graph_us"]
        results.append(row)
        print(row, flush=True)

    notes = [
        f"Times in microseconds (medians), one attention layer: {HEADS} query heads, {KV_HEADS} K/V heads, "
        f"head dim {HEAD_DIM}, {dtype}.",
        "CPU: the references only (the Triton interpreter is not a speed path)." if not cuda else "",
    ]
    write_results(f"tree_attention_{args.device}", "Verification attention", notes, KEYS, results, meta)


if __name__ == "__main__":
    main()
