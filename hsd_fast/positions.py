"""The one position-limit check: do the positions a run needs fit every model's position table?

A row whose prompt may grow by ``max_new_tokens`` needs ``prompt + max_new_tokens`` positions (the
last token drawn is never fed, but a verification feeds the one before it, at position
``needed - 1``): a model of ``max_position_embeddings = L`` serves it when ``needed <= L``, as HF's
``generate`` does. The request (a loaded model's config), the HF runner (the engine's own safety
net), ``hsd-fast select`` and ``hsd-fast demo`` (a checkpoint's config.json, read without loading
the model) all check here; each says what asked for the positions and what to change instead.

Pure Python: configs are read as attributes (a transformers config) or keys (a config.json).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

LIMIT = "max_position_embeddings"

MODEL_FORM = "{asked} = {needed} positions, beyond the " + LIMIT + " = {limit} of the {whose}: {remedy}"
"""The message naming one model (``whose``: ``"target (LlamaForCausalLM)"``): the Python API's."""

COMMAND_FORM = "{asked} = {needed} positions, beyond the {whose} " + LIMIT + " ({limit}); {remedy}"
"""The message naming the fewest positions of several models (``whose``: ``"models'"``): a
command line's, whose remedy names its options."""


def max_positions(config: Any) -> int | None:
    """The positions ``config`` states (a transformers config, or a config.json as a dict); None
    where it states none."""
    limit = config.get(LIMIT) if isinstance(config, dict) else getattr(config, LIMIT, None)
    return limit if isinstance(limit, int) and not isinstance(limit, bool) else None


def read_config(path: Path) -> dict | None:
    """A checkpoint's config.json as a dict, without loading the model; None when there is no
    readable one (the loader names that problem better)."""
    try:
        config = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


def fewest_positions(configs: Iterable[Any]) -> int | None:
    """The fewest positions any of ``configs`` takes (``None`` entries skipped); None when none
    states a limit."""
    limits = (max_positions(c) for c in configs if c is not None)
    return min((limit for limit in limits if limit is not None), default=None)


def check_positions(
    needed: int,
    limits: Iterable[tuple[str, int | None]],
    *,
    asked: str,
    remedy: str,
    form: str = MODEL_FORM,
) -> None:
    """``ValueError`` when ``needed`` positions exceed one of ``limits``: (whose limit, the limit or
    None where none is stated), the first one exceeded named. ``asked``: what needs the positions
    (``"prompt + max_new_tokens"``); ``remedy``: what to change instead (``"lower max_new_tokens"``,
    ``"use --context <= N"``); ``form``: ``MODEL_FORM`` or ``COMMAND_FORM``."""
    for whose, limit in limits:
        if limit is not None and needed > limit:
            raise ValueError(form.format(asked=asked, needed=needed, limit=limit, whose=whose, remedy=remedy))
