"""``hsd-fast doctor [--target PATH --drafts PATH ...]``: what a user checks before the first run.

Prints the versions (Python, torch, triton, transformers, CUDA), whether the Triton kernels or the
torch references will run, where compiled CPU steps are kept for later processes (inductor's cache:
its size, the disk left, the compile prices recorded), and for each given model (a checkpoint
directory or a zoo name) whether it is admitted (and why not), its vocabulary, dtype and device;
then whether the given models can form one hierarchy (one vocabulary, one device); last, every
causal LM family the installed transformers registers that the rule refuses, with the reason
(docs/design.md, "Architectures by rule"). Exit status 1 when a given model or the hierarchy is
refused.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import os
import platform
import shutil
from pathlib import Path

import torch

from hsd_fast.cli_args import device
from hsd_fast.select_levels import load_model


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "doctor", help="versions, kernels or references, and whether given models are admitted (and why not)"
    )
    p.add_argument("--target", help="checkpoint directory or zoo name")
    p.add_argument(
        "--drafts", nargs="+", default=[], help="checkpoint directories or zoo names, smallest first"
    )
    p.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16", "float16"],
        help="load the models in this dtype (default: the checkpoint's own)",
    )
    p.add_argument(
        "--device", type=device, default="cpu", help="load the models on this device (default: cpu)"
    )
    p.add_argument(
        "--no-families", action="store_true", help="skip the list of refused transformers families (slow)"
    )
    return p


def versions() -> list[str]:
    """One line per component: Python, torch, triton, transformers, CUDA."""
    lines = [f"python       {platform.python_version()}", f"torch        {torch.__version__}"]
    for package in ("triton", "transformers"):
        try:
            lines.append(f"{package:<12} {importlib.metadata.version(package)}")
        except importlib.metadata.PackageNotFoundError:
            lines.append(f"{package:<12} not installed")
    if torch.version.cuda is None:
        lines.append("CUDA         none (a CPU build of torch)")
    elif not torch.cuda.is_available():
        lines.append(f"CUDA         {torch.version.cuda} (torch built for it; no device visible)")
    else:
        names = sorted({torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())})
        lines.append(
            f"CUDA         {torch.version.cuda}, {torch.cuda.device_count()} device(s): {', '.join(names)}"
        )
    return lines


def ops_line() -> str:
    """Which implementation of the ops (verify, sample) a run here uses (docs/design.md, "The house rule
    for ops"): the Triton kernels on CUDA tensors in eager steps, the torch references elsewhere and
    inside compiled steps (traced by torch.compile)."""
    if not torch.cuda.is_available():
        return "ops          torch references (no CUDA device: the Triton kernels run on CUDA tensors only)"
    from hsd_fast.triton_kernels.ops import triton_installed

    if not triton_installed():
        return "ops          torch references (CUDA is here but triton is not installed)"
    return "ops          Triton kernels on CUDA tensors (compiled steps trace the torch references instead)"


def compiled_steps_line() -> str:
    """Where a CPU run's compiled steps are kept for later processes (inductor's FX graph cache,
    ``graph_cache.py``), what they take on disk (nothing is evicted: each step of a model holds a
    copy of its weights), and how many hierarchies have a compile price recorded
    (``compile_price.py``)."""
    from hsd_fast import compile_price, graph_cache

    if os.environ.get("TORCHINDUCTOR_FX_GRAPH_CACHE") == "0":
        return "compiled     steps compile in every process (TORCHINDUCTOR_FX_GRAPH_CACHE=0)"
    try:
        root = Path(graph_cache.cache_dir())
    except OSError as error:  # it is created where missing
        return f"compiled     steps compile in every process: inductor's cache directory unusable ({error})"
    size = 0
    for path in root.rglob("*"):
        with contextlib.suppress(OSError):  # removed while we walk
            size += path.stat().st_size if path.is_file() else 0
    free = shutil.disk_usage(root).free
    count = compile_price.recorded_hierarchies()
    return (
        f"compiled     CPU steps kept for later processes in {root} ({size / 2**20:.0f} MiB, "
        f"{free / 2**30:.1f} GiB free; nothing is evicted: delete it to reclaim the space), compile price "
        f"recorded for {count} {'hierarchy' if count == 1 else 'hierarchies'}"
    )


def model_lines(role: str, name: str, model: torch.nn.Module) -> tuple[list[str], bool]:
    """What ``generate`` would say about one model: admitted or why not, then vocabulary, dtype and
    device. Returns the lines and whether it is admitted."""
    from hsd_fast.compat import check_model
    from hsd_fast.hf_runner import HFRunner

    param = next(model.parameters())
    vocab = model.get_output_embeddings().weight.shape[0]
    facts = f"vocab {vocab}, {str(param.dtype).removeprefix('torch.')}, {param.device}"
    head = f"{role:<8} {name} ({type(model).__name__}, {model.config.model_type})"
    try:
        check_model(model, role)
        HFRunner(model, vocab).prepare(1, 2)  # the first forward: one Cache.update per layer
    except ValueError as err:
        return [head, f"         refused: {err}", f"         {facts}"], False
    return [head, "         admitted", f"         {facts}"], True


def hierarchy_line(models: list[torch.nn.Module]) -> tuple[str, bool]:
    from hsd_fast.compat import check_devices, hierarchy_vocab_size

    target, *drafts = models
    try:
        vocab = hierarchy_vocab_size(target, drafts)
        check_devices(
            target, drafts, torch.zeros(1, dtype=torch.int64, device=next(target.parameters()).device)
        )
    except ValueError as err:
        return f"hierarchy    refused: {err}", False
    return f"hierarchy    one vocabulary ({vocab} tokens) and one device: can run together", True


def early_exit_line(target: torch.nn.Module) -> str:
    """Whether the target's own first layers can be a draft level (``hsd_fast.EarlyExit``), and how
    they run."""
    from hsd_fast.early_exit import EarlyExit, decoder_layers_path, num_layers
    from hsd_fast.exit_reuse import refusal

    try:
        path, layers = decoder_layers_path(target), num_layers(target)
    except ValueError as err:
        return f"early exit   refused: {err}"
    line = f"early exit   EarlyExit(target, k) for k in 1..{layers - 1} (layers at {path}): "
    why_not = refusal(EarlyExit(target, 1), target)
    if why_not is None:
        return line + "the target verifies from its hidden states (layers < k not recomputed)"
    return line + f"the target recomputes layers < k when it verifies ({why_not})"


_NOT_DECODING = {
    "bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id", "use_cache",
    "output_attentions", "output_hidden_states", "return_dict_in_generate", "transformers_version",
}  # fmt: skip
"""generation_config fields the doctor does not list: token ids and what a call returns."""


def generation_line(target: torch.nn.Module) -> tuple[str, bool]:
    """What the checkpoint's own ``generation_config`` asks of a plain ``generate`` call, and how
    hsd_fast serves it: which logits processors run inside the compiled steps, which per position
    (eager), or why it is refused."""
    from hsd_fast.generation_options import check_generation_options
    from hsd_fast.processors import generation_sampling

    config = target.generation_config
    asked = {
        k: v for k, v in config.to_diff_dict().items() if k not in _NOT_DECODING and not k.startswith("_")
    }
    shown = ", ".join(f"{k}={v}" for k, v in sorted(asked.items())) or "HF's defaults"
    try:
        check_generation_options(config)
        transform, greedy = generation_sampling(target)
    except ValueError as err:
        return f"generation   its generation_config ({shown}): refused: {err}", False
    names = [type(p).__name__ for p in transform.processors]
    compiled = [n for i, n in enumerate(names) if i not in transform.general]
    if transform.temperature != 1.0:
        compiled.insert(0, f"temperature {transform.temperature:g} (fused into the verification)")
    eager = [names[i] for i in transform.general]
    parts = [("greedy" if greedy else "sampled")]
    parts.append(f"compiled: {', '.join(compiled)}" if compiled else "no logits processor")
    if eager:
        parts.append(f"per position, eager (such a run is not compiled): {', '.join(eager)}")
    return f"generation   its generation_config ({shown}): {'; '.join(parts)}", True


def family_lines() -> list[str]:
    """The refused families of the installed transformers, one line each with the reason."""
    import transformers

    from hsd_fast.architectures import families

    entries = families()
    refused = [f for f in entries if not f.admitted]
    lines = [
        f"transformers {transformers.__version__} registers {len(entries)} causal LMs: "
        f"{len(entries) - len(refused)} admitted by the rule, {len(refused)} refused:"
    ]
    lines += [f"  {f.model_type} ({f.class_name}): {f.reason}" for f in refused]
    return lines


def run(args: argparse.Namespace) -> int:
    print("\n".join([*versions(), ops_line(), compiled_steps_line()]))
    named = ([("target", args.target)] if args.target else []) + [
        (f"draft {i}", name) for i, name in enumerate(args.drafts)
    ]
    dtype = None if args.dtype == "auto" else getattr(torch, args.dtype)
    ok, models = True, []
    for role, name in named:
        model = load_model(name, dtype, args.device)
        lines, admitted = model_lines(role, name, model)
        print("\n".join(lines))
        if role == "target" and admitted:
            print(early_exit_line(model))
            line, served = generation_line(model)
            print(line)
            ok = ok and served
        ok, models = ok and admitted, [*models, model]
    if args.target and args.drafts:
        line, fits = hierarchy_line(models)
        print(line)
        ok = ok and fits
    if not args.no_families:
        print("\n".join(family_lines()))
    return 0 if ok else 1
