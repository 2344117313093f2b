"""What compiling a hierarchy's steps costs on this machine, as the last process that compiled them
measured it (docs/design.md, "Compiled steps"): the price ``compile="auto"`` waits for.

``compile="auto"`` decodes a hierarchy eagerly until it has spent about what compiling it costs, then
compiles (rent or buy: ``engine.AUTO_COMPILE_AFTER_SECONDS``). Where nothing is cached that is a
minute or more on a 2-core CPU; where inductor's cache on disk holds the steps an earlier process
compiled (``graph_cache.py``), a later process loads them in a fraction of that (the demo's three
steps: 75 s compiled, 18 s loaded). No one can tell which of the two a compile will be before it
runs, but the last process that compiled the same hierarchy can: it writes what it spent here.

The record is a small JSON file in inductor's cache directory (so it goes when the cache goes):
``{key: seconds}``, where the key is a SHA-256 over the hierarchy's levels (each model by the digest
of its weights, ``graph_cache.model_digest``; a proposal level by its class and its models') and its
block sizes. After each run that compiled something, the process writes the seconds it has spent so
far compiling that hierarchy's steps (a later run may compile a shape the first did not meet), which
replaces what an earlier process wrote. Only CPU hierarchies whose models inductor's cache keeps
(``graph_cache.cacheable``) are recorded: elsewhere every process pays the full compile, which the
default price already assumes. The record decides only when ``auto`` compiles; it never changes what
a step computes."""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

import torch

from hsd_fast import graph_cache
from hsd_fast.files import write_atomically
from hsd_fast.proposal_level import ProposalLevel

RECORD_FILE = "hsd_fast_compile_seconds.json"
"""The record's name in inductor's cache directory."""
MAX_RECORDED = 256
"""Hierarchies the record keeps; the oldest go first."""

_SPENT: dict[str, float] = {}
"""key -> seconds this process has spent compiling that hierarchy's steps."""


def hierarchy_key(levels: Sequence[object], block_sizes: Sequence[object]) -> str | None:
    """The record's key for a hierarchy (``levels``: runners and proposal levels, the target last;
    ``block_sizes``: its T, or what stands for them in an adaptive run), or None where its compiled
    steps are not kept across processes (a model off the CPU, or too large for inductor's cache)."""
    parts = [repr(tuple(block_sizes))]
    for level in levels:
        if isinstance(level, ProposalLevel):
            models, name = level.models, type(level).__qualname__
        else:
            models, name = (getattr(level, "model", None),), "model"
        if not all(isinstance(m, torch.nn.Module) and _kept_across_processes(m) for m in models):
            return None
        parts.append(" ".join([name, *(graph_cache.model_digest(m) for m in models)]))
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _kept_across_processes(model: torch.nn.Module) -> bool:
    return all(p.device.type == "cpu" for p in model.parameters()) and graph_cache.cacheable(model)


def recorded_seconds(key: str) -> float | None:
    """What the last process that compiled the hierarchy ``key`` spent compiling it, or None where no
    record says (never compiled here, or the record is unreadable)."""
    seconds = _read().get(key)
    return float(seconds) if isinstance(seconds, (int, float)) and seconds >= 0 else None


def recorded_hierarchies() -> int:
    """How many hierarchies the record holds a price for."""
    return len(_read())


def add_spent(key: str, seconds: float) -> None:
    """Count ``seconds`` more of compiling the hierarchy ``key`` in this process, and record this
    process's total for later ones. A record that cannot be written is left as it is."""
    _SPENT[key] = _SPENT.get(key, 0.0) + seconds
    record = {k: v for k, v in _read().items() if k != key}
    record[key] = round(_SPENT[key], 3)  # last: the newest
    record = dict(list(record.items())[-MAX_RECORDED:])
    with contextlib.suppress(OSError):
        write_atomically(_path(), json.dumps(record))  # a process reading at the same time sees one version


def _read() -> dict:
    try:
        record = json.loads(_path().read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _path() -> Path:
    return Path(graph_cache.cache_dir()) / RECORD_FILE
