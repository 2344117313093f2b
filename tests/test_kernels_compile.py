"""Every Triton kernel compiles for the GPUs it targets, checked without a GPU, with the argument
types its launcher really passes.

The interpreter skips type checks the compiler makes (loop-carried types, constexprs), so each kernel
is compiled to a cubin for sm_90 and sm_80. The signatures are not guessed: this file, run as a
script in a process without the interpreter, calls every launcher once on small CPU tensors with
``JITFunction.run`` replaced by a recorder (nothing is launched), takes each argument's Triton type
from the value the launcher passed (a tensor's dtype for a pointer), and compiles with exactly those
signatures and constexprs. A dtype changed in a launcher is compiled as it now is.
"""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.triton

ARCHS = (90, 80)
KERNEL_MODULES = ("keyed_random", "rejection", "sampling", "tree_attention")
LOGITS_DTYPES = (("bfloat16", "bfloat16"), ("float32", "float32"), ("bfloat16", "float32"))
"""(verifier, draft) logits dtypes: the launchers take logits in the models' dtype, and the engine
keeps the widest dtype of the levels for the drafts' logits (bf16 target over an fp32 draft)."""


def test_kernels_compile_for_hopper_and_ampere() -> None:
    # conftest.py sets TRITON_INTERPRET=1 without a GPU; `@triton.jit` reads it at import, so the
    # kernels are real JITFunctions (compilable) only in a process started without it.
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    done = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    kernels = set(report["kernels"])
    assert {"_accept_kernel", "_sample_chunk_kernel", "_uniform_kernel", "_tree_attention_kernel"} <= kernels
    for arch in ARCHS:
        compiled = [c for c in report["compiled"] if c["arch"] == arch]
        assert {c["kernel"] for c in compiled} == kernels, f"sm_{arch}: a kernel was not compiled"
    for c in report["compiled"]:
        for name, ty in c["signature"].items():
            # every pointer parameter got a tensor from its launcher, every other one a scalar
            assert ty.startswith("*") == name.endswith("_ptr"), (c["kernel"], name, ty)
    # the logits pointers follow the caller's dtype: both dtypes were compiled
    stats = {c["signature"]["ver_ptr"] for c in report["compiled"] if c["kernel"] == "_chunk_stats_kernel"}
    assert stats == {"*bf16", "*fp32"}


# ------------------------------------------------------------------- the script (no interpreter)
def _triton_type(value) -> str:
    """The type Triton's runtime gives an argument (a pointer's by the tensor's dtype): Triton's own
    ``mangle_type`` where it has one, else the same rules spelled out."""
    import torch

    try:
        from triton.runtime.jit import mangle_type
    except ImportError:
        mangle_type = None
    if mangle_type is not None:
        return mangle_type(value)
    if isinstance(value, torch.Tensor):
        names = {
            torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64",
            torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8",
            torch.uint8: "u8", torch.bool: "u1",
        }  # fmt: skip
        return "*" + names[value.dtype]
    if isinstance(value, bool):
        return "u1"
    if isinstance(value, int):
        return "i32" if -(2**31) <= value < 2**31 else "i64" if -(2**63) <= value < 2**63 else "u64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"no Triton type for {type(value).__name__}")


def _run_launchers(logits_dtypes: tuple[str, str]) -> None:
    """Every launcher, once per mode, on a small batch laid out as the engine passes it: 3 rows with
    2, 0 and 3 drafts, padded to D = 3 draft columns (the verifier has D + 1)."""
    import torch

    from hsd_fast.triton_kernels import keyed_random, rejection, sampling

    ver_dtype, draft_dtype = (getattr(torch, d) for d in logits_dtypes)
    rows, width, vocab = 3, 3, 3000  # vocab above split.BLOCK_V_MAX: blocks and split as on a GPU
    gen = torch.Generator().manual_seed(0)
    draft = torch.randn(rows, width, vocab, generator=gen).to(draft_dtype)
    batch = {
        "verifier_logits": torch.randn(rows, width + 1, vocab, generator=gen).to(ver_dtype),
        "draft_logits": draft,
        "draft_lse": torch.logsumexp(draft.float(), -1),
        "draft_tokens": torch.randint(0, vocab, (rows, width), generator=gen),
        "num_drafts": torch.tensor([2, 0, 3]),
        "temperature": torch.ones(rows),
        "seeds": torch.tensor([11, 22, 33]),
        "positions": torch.tensor([4, 9, 6]),
    }
    for greedy in (False, True):
        rejection.verify_triton(**batch, level=1, greedy=greedy)
        point_masses = batch | {"draft_logits": None, "draft_lse": None}  # a lookup level's drafts
        rejection.verify_triton(**point_masses, level=1, greedy=greedy)
        sampling.sample_triton(
            batch["verifier_logits"][:, 0], batch["temperature"], batch["seeds"], batch["positions"],
            level=0, purpose=keyed_random.DRAFT, greedy=greedy,
        )  # fmt: skip
    keyed_random.uniform_triton(batch["seeds"], 1, batch["positions"], keyed_random.ACCEPT, vocab)


def _run_attention_launchers() -> None:
    """The tree-attention launcher in every model dtype, with one split and several (the combine
    kernel), plain and grouped-query heads and head dims 64 and 128."""
    import torch

    from hsd_fast.triton_kernels.tree_attention import tree_attention_triton
    from hsd_fast.triton_kernels.tree_attention_torch import attention_meta

    rows, width, slots = 2, 5, 512
    meta = attention_meta(torch.tensor([[3, 4, 5, 6, 7], [-1, 10, 11, 12, 13]]))
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for heads, kv_heads, dim in ((4, 4, 64), (8, 2, 128)):
            query = torch.randn(rows, heads, width, dim).to(dtype)
            cache = torch.randn(rows, kv_heads, slots, dim).to(dtype)
            for splits in (1, 4):
                tree_attention_triton(query, cache, cache, meta, dim**-0.5, splits=splits)


def _main() -> None:
    import importlib
    import inspect

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import JITFunction

    modules = [importlib.import_module(f"hsd_fast.triton_kernels.{m}") for m in KERNEL_MODULES]
    kernels = {
        name: fn
        for module in modules
        for name, fn in vars(module).items()
        if isinstance(fn, JITFunction) and name.endswith("_kernel")
    }
    assert kernels, "no JITFunction kernels: is TRITON_INTERPRET set?"

    launches = []

    def record(self, *args, grid, warmup, **kwargs):  # JITFunction.run, launching nothing
        launches.append((self, args, kwargs))

    JITFunction.run = record
    for dtypes in LOGITS_DTYPES:
        _run_launchers(dtypes)
    _run_attention_launchers()
    launched = {fn.__name__ for fn, _, _ in launches}
    assert launched == set(kernels), f"launched {sorted(launched)}, defined {sorted(kernels)}"

    variants = {}  # one compile per distinct (kernel, signature, constexprs, options)
    for fn, args, kwargs in launches:
        names = [p.name for p in fn.params]
        options = {k: v for k, v in kwargs.items() if k not in names}  # num_warps, num_stages, ...
        bound = inspect.signature(fn.fn).bind(*args, **{k: v for k, v in kwargs.items() if k in names})
        bound.apply_defaults()
        signature, constexprs = {}, {}
        for p in fn.params:
            value = bound.arguments[p.name]
            if p.is_constexpr:
                signature[p.name], constexprs[p.name] = "constexpr", value
            else:
                signature[p.name] = _triton_type(value)
        key = json.dumps([fn.__name__, signature, constexprs, options], sort_keys=True)
        variants[key] = (fn, signature, constexprs, options)

    compiled = []
    for arch in ARCHS:
        for fn, signature, constexprs, options in variants.values():
            src = ASTSource(fn=fn, signature=signature, constexprs=constexprs)
            asm = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options or None).asm
            assert "cubin" in asm, (fn.__name__, arch)
            compiled.append({"kernel": fn.__name__, "arch": arch, "signature": signature})
    print(json.dumps({"kernels": sorted(kernels), "compiled": compiled}))


if __name__ == "__main__":
    _main()
