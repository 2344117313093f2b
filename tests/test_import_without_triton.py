"""The package imports and decodes where Triton is not installed (macOS, Windows): the engine uses
the torch references and loads the kernel modules only when a CUDA tensor needs them.

The subprocess hides Triton from the path finder, as a machine without it has it: ``find_spec``
answers None (torch 2.14 asks it while importing; a finder that raised instead broke ``import torch``
itself)."""

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import importlib.machinery, importlib.util, sys

    class NoTriton(importlib.machinery.PathFinder):  # site-packages as if Triton were not installed
        @classmethod
        def find_spec(cls, name, path=None, target=None):
            if name == "triton" or name.startswith("triton."):
                return None  # what the path finder says of a package that is not there
            return super().find_spec(name, path, target)

    sys.meta_path = [NoTriton if f is importlib.machinery.PathFinder else f for f in sys.meta_path]
    assert NoTriton in sys.meta_path and importlib.util.find_spec("triton") is None
    import torch
    import hsd_fast
    from hsd_fast.testing.tables import TableRunner, table_family
    from transformers import LlamaConfig, LlamaForCausalLM

    levels = [TableRunner(m) for m in table_family(vocab_size=4, order=2, num_levels=3)]
    out = hsd_fast.run_hsd(levels, [torch.tensor([0, 1])] * 3, block_sizes=[2, 2], max_new_tokens=6)
    assert all(len(s) == 8 for s in out.sequences), out

    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, attn_implementation="sdpa")
    torch.manual_seed(0)
    target = LlamaForCausalLM(config).eval()
    ids = torch.tensor([[3, 4, 5, 6]])
    kwargs = {"do_sample": False, "max_new_tokens": 8, "eos_token_id": None}
    got = target.generate(ids, custom_generate=hsd_fast.generate, drafts=[target], T=[3], **kwargs)
    assert torch.equal(got, target.generate(ids, **kwargs))
    from hsd_fast.triton_kernels import ops

    class OnCuda:  # what dispatch reads of a CUDA tensor
        is_cuda = True

    assert not ops._use_kernel(None, OnCuda()), "CUDA without Triton must run the references"
    loaded = sorted(m for m in sys.modules if m.startswith(("triton", "hsd_fast.triton_kernels.")))
    print("loaded:", loaded)
    assert not any(m == "triton" or m.startswith("triton.") for m in loaded), loaded
    """
)


def test_hsd_runs_with_triton_unimportable() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "hsd_fast.triton_kernels.rejection'" not in done.stdout  # only the references were loaded
    assert "hsd_fast.triton_kernels.rejection_torch" in done.stdout


def test_import_loads_neither_triton_nor_transformers() -> None:
    """``import hsd_fast`` (and the engine) stays light: transformers and triton load on first use."""
    script = (
        "import sys, hsd_fast, hsd_fast.engine, hsd_fast.steps\n"
        "print(sorted(m for m in ('transformers', 'triton') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[]"
