"""The fused verification kernel equals its torch reference: identical accepted counts and tokens.

On CPU the kernel runs under the Triton interpreter (conftest.py) on tiny shapes, fp16/fp32 (the
interpreter mishandles bf16, FACTS.md); `-m gpu` runs real sizes and bf16 natively on CUDA."""

import os
import subprocess
import sys

import pytest
import torch

from hsd_fast.engine import run_hsd
from hsd_fast.table_model import TableRunner, table_family
from hsd_fast.triton_kernels.rejection import verify_torch, verify_triton


def _case(counts: list[int], vocab: int, dtype: torch.dtype, seed: int, masked: bool = False):
    gen = torch.Generator().manual_seed(seed)
    rows, drafts = len(counts), sum(counts)
    verifier = 2 * torch.randn(rows + drafts, vocab, generator=gen)
    draft = 2 * torch.randn(drafts, vocab, generator=gen)
    if masked:  # top-k style exclusions on both sides
        verifier[:, ::3] = -float("inf")
        draft[:, 1::4] = -float("inf")
    temperature = torch.rand(rows, generator=gen) + 0.5
    offsets = torch.tensor([0, *torch.tensor(counts, dtype=torch.int64).cumsum(0).tolist()])
    owner = torch.repeat_interleave(torch.arange(rows), torch.tensor(counts, dtype=torch.int64))
    draft_lse = torch.logsumexp(draft.to(dtype).float() / temperature[owner, None], -1)
    q = torch.softmax(draft / temperature[owner, None], -1)
    tokens = torch.multinomial(q, 1, generator=gen)[:, 0] if drafts else torch.zeros(0, dtype=torch.long)
    seeds = torch.randint(0, 2**40, (rows,), generator=gen)
    positions = torch.randint(0, 500, (rows,), generator=gen)
    return (verifier.to(dtype), draft.to(dtype), draft_lse, tokens, offsets, temperature, seeds, positions)


@pytest.mark.parametrize("counts", [[0], [1], [5], [0, 1, 5], [5, 2, 3]], ids=str)
@pytest.mark.parametrize(("vocab", "block"), [(7, None), (64, 64), (65, 64)], ids=["V7", "V64", "V65"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("greedy", [False, True], ids=["sampled", "greedy"])
def test_kernel_equals_reference(counts, vocab, block, dtype, greedy) -> None:
    for seed in range(3):
        args = _case(counts, vocab, dtype, seed, masked=seed == 2)
        ref = verify_torch(*args, level=2, greedy=greedy)
        out = verify_triton(*args, level=2, greedy=greedy, block_v=block)
        assert out.num_accepted.tolist() == ref.num_accepted.tolist()
        assert out.next_token.tolist() == ref.next_token.tolist()
        torch.testing.assert_close(out.verifier_lse, ref.verifier_lse, atol=1e-5, rtol=1e-5)


def test_kernel_rejects_and_accepts_in_these_cases() -> None:
    """Guard against a vacuous comparison: the cases above take every path of the op."""
    accepted = []
    for seed in range(3):
        res = verify_torch(*_case([5, 2, 3], 7, torch.float32, seed), level=2, greedy=False)
        accepted += res.num_accepted.tolist()
    assert 0 in accepted and any(0 < a < 5 for a in accepted) and (2 in accepted or 3 in accepted)


def test_engine_through_the_interpreted_kernel() -> None:
    family = table_family(5, 2, 3, spread=2.0, seed=4)
    prompts = [torch.tensor([0, 1, 2]), torch.tensor([4, 4])]
    kwargs = {"batch_sizes": [2, 2], "max_new_tokens": 10, "eos_token_id": 3, "seeds": 9}
    ref = run_hsd([TableRunner(m) for m in family], prompts, use_kernel=False, **kwargs)
    out = run_hsd([TableRunner(m) for m in family], prompts, use_kernel=True, **kwargs)
    assert [s.tolist() for s in out.sequences] == [s.tolist() for s in ref.sequences]
    assert out.stats.corrections == ref.stats.corrections and sum(ref.stats.corrections) > 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("vocab", [32000, 128256, 151936])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_kernel_equals_reference_on_cuda(vocab, dtype) -> None:
    args = [a.cuda() for a in _case([4, 0, 8, 16, 1], vocab, dtype, seed=0)]
    for greedy in (False, True):
        ref = verify_torch(*args, level=1, greedy=greedy)
        out = verify_triton(*args, level=1, greedy=greedy)
        assert out.num_accepted.tolist() == ref.num_accepted.tolist()
        assert out.next_token.tolist() == ref.next_token.tolist()
        torch.testing.assert_close(out.verifier_lse, ref.verifier_lse, atol=1e-4, rtol=1e-5)


def test_kernel_compiles_for_hopper_and_ampere() -> None:
    """The interpreter skips type checks the compiler makes (loop-carried types, constexprs): compile
    the kernel to a cubin for sm_90 and sm_80 without a GPU, in a process without the interpreter."""
    script = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from hsd_fast.triton_kernels.rejection import _verify_kernel
sig = {n: t for n, t in zip(_verify_kernel.arg_names, [
    "*bf16", "i64", "*bf16", "i64", "*fp32", "*i64", "*i64", "*fp32", "*i64", "*i64", "*i64", "*i64",
    "*fp32", "i32", "i32", "fp32", "constexpr", "constexpr"])}
for arch in (90, 80):
    for greedy in (False, True):
        src = ASTSource(fn=_verify_kernel, signature=sig, constexprs={"GREEDY": greedy, "BLOCK_V": 1024})
        assert "cubin" in triton.compile(src, target=GPUTarget("cuda", arch, 32)).asm
print("ok")
"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
