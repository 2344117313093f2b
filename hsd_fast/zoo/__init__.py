"""The model zoo: a family of small Llama LMs sharing one tokenizer, committed under ``zoo/``.

>>> from hsd_fast import zoo
>>> zoo.names()                       # smallest first
>>> target = zoo.load("s"); drafts = [zoo.load("xxs"), zoo.load("xs")]
>>> se = zoo.load("se")               # s trained on for early exits: hsd_fast.EarlyExit(se, k)
>>> sx = zoo.load("sx")               # s's shape trained from scratch for early exits
>>> tokenizer = zoo.load_tokenizer()
>>> other = zoo.load("xs4k")          # xs's shape on a tokenizer of its own (4096 entries)...
>>> other_tokenizer = zoo.load_tokenizer("xs4k")  # ...which it loads by the model's name

``hsd-fast zoo info`` lists what is there, ``hsd-fast zoo accept`` measures the acceptance matrix,
``hsd-fast zoo build`` rebuilds it (corpus, tokenizer, training, int8 storage); see ``zoo/README.md``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # transformers is imported only when a model or the tokenizer is loaded
    import torch
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

__all__ = ["SIZES", "cost_twin", "load", "load_tokenizer", "manifest", "names", "zoo_dir"]


def zoo_dir() -> Path:
    """Where the zoo is read from: ``$HSD_FAST_ZOO``, else the installed data (``zoo/`` of the
    repository, installed as ``hsd_fast.zoo_data``)."""
    if "HSD_FAST_ZOO" in os.environ:
        return Path(os.environ["HSD_FAST_ZOO"])
    import hsd_fast.zoo_data

    return Path(hsd_fast.zoo_data.__file__).parent


def manifest() -> dict:
    """The zoo's ``manifest.json``: FileNotFoundError where there is none, ValueError naming it
    where it is not a JSON object."""
    path = zoo_dir() / "manifest.json"
    if not path.is_file():
        raise FileNotFoundError(f"no zoo manifest at {path}; build one with `hsd-fast zoo build`")
    try:
        content = json.loads(path.read_text())
    except ValueError as err:  # JSON or text decoding
        raise ValueError(f"{path} is not a zoo manifest ({err})") from None
    if not isinstance(content, dict):
        raise ValueError(f"{path} is not a zoo manifest (not a JSON object)")
    return content


def in_family(record: dict) -> bool:
    """Whether a manifest record is one of the family's sizes: not a variant (``variant_of``), and on
    the shared tokenizer (a record naming a ``tokenizer`` directory has its own)."""
    return "variant_of" not in record and "tokenizer" not in record


def names(variants: bool = False) -> list[str]:
    """The zoo's family of sizes, smallest first (the last one: the target by default wherever the
    zoo is used; each can draft for the larger ones, token for token). With ``variants``, also every
    other model, in order of size: those of a size's shape trained for another purpose (``se``, ``s``
    trained on for early exits: ``hsd_fast.EarlyExit``; ``sx``, ``s``'s shape trained from scratch for
    them) and those on a tokenizer of their
    own (``xs4k``: ``load_tokenizer("xs4k")``), which cannot draft for the family token for token."""
    models = manifest().get("models")
    if not isinstance(models, dict):
        raise ValueError(f"{zoo_dir() / 'manifest.json'} lists no models (no 'models' object)")
    chosen = [name for name in models if variants or in_family(models[name])]
    return sorted(chosen, key=lambda name: models[name]["params"])


def load(name: str, dtype: torch.dtype | None = None, device: str | torch.device = "cpu") -> LlamaForCausalLM:
    """A zoo model, de-quantised to ``dtype`` (default float32) on ``device``, in eval mode."""
    import torch

    from hsd_fast.zoo.models import load_int8

    available = names(variants=True)
    if name not in available:
        raise ValueError(f"no zoo model {name!r}; the zoo holds {available}")
    model = load_int8(zoo_dir() / name, dtype or torch.float32, device)
    model.config.name_or_path = f"hsd_fast.zoo/{name}"
    return model


def load_tokenizer(name: str | None = None) -> PreTrainedTokenizerFast:
    """The tokenizer of zoo model ``name``: the shared one (``zoo/tokenizer``, 8192 entries) for every
    model but those whose manifest record names a directory of their own (``xs4k``:
    ``zoo/tokenizer_4096``); without a name, the shared one."""
    from hsd_fast.zoo.tokenizer import load_tokenizer as load_from

    directory = "tokenizer"
    if name is not None:
        available = names(variants=True)
        if name not in available:
            raise ValueError(f"no zoo model {name!r}; the zoo holds {available}")
        directory = manifest()["models"][name].get("tokenizer", directory)
    return load_from(zoo_dir() / directory)


def __getattr__(name: str) -> Any:
    if name == "cost_twin":
        from hsd_fast.zoo.twin import cost_twin

        return cost_twin
    if name == "SIZES":
        from hsd_fast.zoo.models import SIZES

        return SIZES
    raise AttributeError(f"module 'hsd_fast.zoo' has no attribute {name!r}")
