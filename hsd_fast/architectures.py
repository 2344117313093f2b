"""Which Hugging Face models hsd_fast runs exactly: a rule that follows how transformers builds its
decoder-only models, instead of a list of names (docs/design.md, "Architectures by rule").

A model is admitted when its class is a causal LM that transformers itself ships, its attention goes
through transformers' attention interface (which takes the 4D mask it is given and writes K/V with
``Cache.update``), and every layer is full or sliding-window attention. Refused, with the reason:
remote code and subclasses, encoder-decoders, multimodal wrappers, recurrent / linear-attention /
state-space / convolution layers (their state cannot be rolled back), other attention patterns
(chunked, indexed, compressed), and hybrid full/sliding models whose forward cannot take one mask per
layer type. The runner checks the rest at its first forward: one ``Cache.update`` per layer
(``hf_runner.py``).

``python -m hsd_fast.architectures`` prints the support table of the installed transformers
(``docs/support.md`` shows its output).
"""

from __future__ import annotations

import functools
import inspect
import re
import sys
from dataclasses import dataclass
from typing import Any

import torch

from hsd_fast.report import markdown_table

FULL = "full_attention"
SLIDING = "sliding_attention"
ATTENTION_LAYER_TYPES = (FULL, SLIDING)
WRAPPER_SUB_CONFIGS = ("text_config", "vision_config", "audio_config")
# `if not isinstance(causal_mask_mapping := attention_mask, dict):` in the decoder's forward: a dict of
# masks keyed by layer type is used as is (docs/design.md, "Masks per layer type").
_TAKES_MASK_DICT = re.compile(r"isinstance\(\s*(?:\w+\s*:=\s*)?attention_mask\s*,\s*dict\s*\)")
_BUILDS_SLIDING_MASKS = "create_sliding_window_causal_mask"


def layer_types(config: Any, source: str) -> list[str]:
    """The attention type of every layer of a model whose modeling module has this ``source`` code:
    ``config.layer_types`` where the config has them, else every layer slides when
    ``config.sliding_window`` is set (Mistral, Phi-3, Starcoder2 build one sliding mask for all
    layers). A layer slides only where the module builds sliding-window masks at all: Moshi's config
    has a window its SDPA and eager paths never apply. Without source code the config is taken as it is
    (``refusal`` then refuses sliding layers)."""
    num_layers = config.num_hidden_layers
    given = getattr(config, "layer_types", None)
    types = list(given[:num_layers]) if given else [SLIDING if _window_size(config) else FULL] * num_layers
    if source and _BUILDS_SLIDING_MASKS not in source:
        types = [FULL if t == SLIDING else t for t in types]
    return types


def _window_size(config: Any) -> int | None:
    return getattr(config, "sliding_window", None) or None  # 0 means none (Qwen2-MoE's default)


def window(config: Any, layer_type: str) -> int | None:
    """How many positions a query of this layer type sees (itself included), None for all: a key at
    position k is visible to a query at q iff k <= q and k > q - window (transformers'
    ``sliding_window_overlay``)."""
    return int(config.sliding_window) if layer_type == SLIDING else None


def refusal(model_cls: type, config: Any, decoder_code: str | None = None) -> str | None:
    """Why hsd_fast cannot run a model of this class and config exactly, or None when it can: a short
    category, a colon, the details. Which layers slide is read from the class's modeling module;
    whether a hybrid model takes a dict of masks from ``decoder_code``, the code of its decoder's
    forward (default: the whole module)."""
    if getattr(config, "is_encoder_decoder", False):
        return "encoder-decoder: only decoder-only causal LMs are supported"
    if not is_transformers_causal_lm(model_cls):
        return (
            "not a transformers causal LM class: remote code or a subclass; only the classes transformers "
            "registers for AutoModelForCausalLM are checked by this rule"
        )
    wrapped = [key for key in getattr(config, "sub_configs", {}) if key in WRAPPER_SUB_CONFIGS]
    if wrapped:
        return (
            f"a wrapper around other models: sub-configs {', '.join(wrapped)} (multimodal, or an "
            "assistant that reads its target's states). Loading such a checkpoint into the family's "
            "text-only *ForCausalLM class can leave its weights random (its keys carry the wrapper's "
            "prefix): use a text-only checkpoint, and check the loading report"
        )
    if getattr(config, "num_hidden_layers", None) is None:
        parts = ", ".join(getattr(config, "sub_configs", {})) or "none"
        return f"no single decoder stack: its config has no num_hidden_layers (sub-configs {parts})"
    source = module_source(model_cls)
    types = layer_types(config, source)
    unknown = sorted(set(types) - set(ATTENTION_LAYER_TYPES))
    # transformers <= 5.24 marks recurrent classes `_is_stateful`; 5.25 dropped the flag and names their
    # layers' types instead (`linear_attention`, `conv`, `hybrid`), which `_keeps_state` reads
    if getattr(model_cls, "_is_stateful", False) or any(_keeps_state(t) for t in unknown):
        return (
            "layers with state: recurrent, linear-attention, state-space or convolution layers, whose "
            "state cannot be rolled back after a rejected draft"
        )
    loops = {k: v for k, v in vars(config).items() if "loop" in k and type(v) is int and v > 1}
    if loops:
        return (
            f"looped layers: {', '.join(f'{k}={v}' for k, v in sorted(loops.items()))}; layers that run "
            "several times per forward write copies of their cache layers the runner's cache does not hold"
        )
    if unknown:
        return (
            f"another attention pattern: layer types {unknown}; the runner's masks implement full and "
            "sliding-window attention only"
        )
    if not model_cls._supports_attention_backend:
        return (
            "attention of its own: the class does not declare _supports_attention_backend (its attention "
            "does not go through transformers' attention interface), so it may build its own causal mask "
            "over the cache"
        )
    if getattr(config, "num_kv_shared_layers", 0):
        return (
            f"K/V shared across layers: its last {config.num_kv_shared_layers} layers read the K/V of "
            "earlier ones (the runner also refuses, at its first forward, any model that does not call "
            "Cache.update once per layer)"
        )
    if SLIDING in types and not source:
        return "unreadable code: sliding-window layers, but no source to confirm how it masks them"
    if len(set(types)) > 1 and not _TAKES_MASK_DICT.search(source if decoder_code is None else decoder_code):
        return "hybrid without masks per layer type: its forward builds its own full and sliding masks"
    return None


def _keeps_state(layer_type: str) -> bool:
    """Linear attention, and every layer type that is no attention at all (``mamba``, ``conv``, the
    ``mlp`` / ``moe`` blocks of Nemotron-H-style hybrids): a recurrent state, or a place in a stack of
    layers that keep one."""
    return layer_type == "linear_attention" or not layer_type.endswith("attention")


def is_transformers_causal_lm(model_cls: type) -> bool:
    """The class is one transformers registers for AutoModelForCausalLM (checked by identity: a
    subclass may change the forward pass)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if not model_cls.__module__.startswith("transformers.models."):
        return False
    if model_cls.__name__ not in set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values()):
        return False
    return getattr(sys.modules[model_cls.__module__], model_cls.__name__, None) is model_cls


@functools.cache
def _source(code: object) -> str:
    """``inspect.getsource`` ("" where no source is installed), read once per module or function:
    every request checks its models, and reading a modeling module costs milliseconds."""
    try:
        return inspect.getsource(code)
    except (OSError, TypeError):
        return ""


def module_source(model_cls: type) -> str:
    """The code of the class's modeling module ("" where no source is installed)."""
    return _source(sys.modules[model_cls.__module__])


def decoder_source(model: torch.nn.Module) -> str:
    """The code of a loaded model's decoder forward (its base model, e.g. ``LlamaModel.forward``),
    or of its modeling module where the base model is not found."""
    base = getattr(model, getattr(model, "base_model_prefix", ""), None)
    if base is None or base is model:
        return module_source(type(model))
    return _source(type(base).forward)


def model_refusal(model: torch.nn.Module) -> str | None:
    """``refusal`` for a loaded model (its class, config and decoder code), plus what only the loaded
    modules show: self-attention built bidirectional (an encoder family whose config has
    ``is_decoder=False``)."""
    reason = refusal(type(model), model.config, decoder_source(model))
    if reason is None and any(getattr(m, "is_causal", True) is False for m in model.modules()):
        reason = (
            "bidirectional self-attention: an encoder (its config has is_decoder=False); load it with "
            "is_decoder=True to use it as a causal LM"
        )
    return reason


@dataclass(frozen=True)
class Family:
    """One entry of transformers' causal-LM registry and what the rule says about its default config."""

    model_type: str
    class_name: str
    reason: str | None  # None: admitted

    @property
    def admitted(self) -> bool:
        return self.reason is None


def families() -> list[Family]:
    """Every causal LM the installed transformers registers, with the rule's verdict on its default
    configuration (a family whose class or config cannot even be built here says why)."""
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    out = []
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # default configs warn about their own token ids
    try:
        for model_type, class_name in sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items()):
            try:
                reason = refusal(getattr(transformers, class_name), CONFIG_MAPPING[model_type]())
            except Exception as err:  # this environment cannot build it (a missing extra, a bad default)
                reason = f"cannot be checked here: {type(err).__name__} ({str(err).splitlines()[0][:80]})"
            out.append(Family(model_type, class_name, reason))
    finally:
        transformers.logging.set_verbosity(verbosity)
    return out


def support_table(entries: list[Family] | None = None) -> str:
    """The support table (docs/support.md): admitted families, then the refused ones grouped by reason."""
    import transformers

    entries = families() if entries is None else entries
    admitted = [f for f in entries if f.admitted]
    by_reason: dict[str, list[Family]] = {}
    for f in entries:
        if not f.admitted:
            by_reason.setdefault(category(f.reason), []).append(f)
    rows = [[f"admitted ({len(admitted)})", ", ".join(f.model_type for f in admitted)]]
    for reason, group in sorted(by_reason.items(), key=lambda item: (-len(item[1]), item[0])):
        rows.append([f"refused ({len(group)}): {reason}", ", ".join(f.model_type for f in group)])
    title = (
        f"Generated by `python -m hsd_fast.architectures` on transformers {transformers.__version__}: "
        f"{len(admitted)} of {len(entries)} registered causal LMs admitted."
    )
    return "\n".join([title, "", *markdown_table(["", "model types"], rows)])


def category(reason: str) -> str:
    """The part of a refusal that families share (for grouping them)."""
    return reason.split(":")[0]


README_BEGIN = "<!-- support table: `python -m hsd_fast.architectures --readme docs/support.md` writes it -->"
README_END = "<!-- end of the support table -->"


def readme_table(text: str) -> str | None:
    """The support table inside a README's text (between the markers), or None."""
    from hsd_fast.report import marked_section

    return marked_section(text, README_BEGIN, README_END)


def main(argv: list[str] | None = None) -> int:
    import argparse
    from pathlib import Path

    parser = argparse.ArgumentParser(description="the support table of the installed transformers")
    parser.add_argument("--readme", type=Path, help="write it between the markers of this README instead")
    args = parser.parse_args(argv)
    table = support_table()
    if args.readme is None:
        print(table)
        return 0
    from hsd_fast.report import write_marked_section

    try:
        write_marked_section(args.readme, README_BEGIN, README_END, table)
    except ValueError as err:
        parser.error(str(err))
    return 0


if __name__ == "__main__":
    sys.exit(main())
