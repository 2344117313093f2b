"""Argument types of the ``hsd-fast`` command line: argparse ``type=`` callables that turn a bad value
into a usage error saying what was wanted, before any work. Outputs (``--json``, ``--out``) are checked
against the file system then too: a run that measures for an hour must not fail at its end.

A leaf module (it reads only ``tree.MAX_NODES``): the commands (``cli``, ``select_command``, ...) share
these types, and none of them needs another command's module to get them.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from pathlib import Path

from hsd_fast.tree import MAX_NODES


def _number(kind: type, test: Callable[[float], bool], wanted: str) -> Callable[[str], int | float]:
    """An argparse type: ``kind(text)`` passing ``test``, or a usage error saying what is wanted."""

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {wanted}, got {text!r}") from None
        if not test(value):
            raise argparse.ArgumentTypeError(f"expected {wanted}, got {text}")
        return value

    return parse


positive_int = _number(int, lambda v: v >= 1, "an integer >= 1")
non_negative_int = _number(int, lambda v: v >= 0, "an integer >= 0")
positive_float = _number(float, lambda v: math.isfinite(v) and v > 0, "a finite number > 0")
probability = _number(float, lambda v: 0 < v <= 1, "a number in (0, 1]")
tree_size = _number(
    int, lambda v: 1 <= v <= MAX_NODES, f"an integer >= 1 and <= {MAX_NODES} (tree.MAX_NODES)"
)


def device(text: str) -> str:
    """``--device``: a torch device that exists here (CUDA only where torch sees a GPU)."""
    import torch  # here only: ``hsd-fast --help`` should not wait for torch

    try:
        parsed = torch.device(text)
    except RuntimeError as err:
        raise argparse.ArgumentTypeError(f"not a device: {text!r} ({err})") from None
    if parsed.type == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(f"{text}: CUDA is not available here")
    if parsed.type == "cuda" and (parsed.index or 0) >= torch.cuda.device_count():
        raise argparse.ArgumentTypeError(f"{text}: only {torch.cuda.device_count()} CUDA device(s) here")
    return text


def output_folder(text: str) -> Path:
    """``--out``: a folder the results can be written to (created if missing), checked when the
    arguments are read, not after the measuring."""
    path = Path(text)
    problem = unwritable(path, folder=True)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return path


def report_stem(text: str) -> Path:
    """``--json``: the report's stem (``<stem>.json`` and ``<stem>.md`` are written), also given as
    the ``.json`` path. A ``.md`` path would be overwritten by the markdown half: refused."""
    path = Path(text)
    if path.suffix == ".md":
        raise argparse.ArgumentTypeError(
            f"{text} would be overwritten by the markdown report: give the stem ({path.with_suffix('')}) "
            f"or the .json path ({path.with_suffix('.json')}); both .json and .md are written"
        )
    if not path.name or path.name in (".", "..") or text.endswith(("/", "\\")):
        raise argparse.ArgumentTypeError(f"expected a file stem, got the directory {text!r}")
    stem = path.with_suffix("") if path.suffix == ".json" else path
    for suffix in (".json", ".md"):  # checked now: the report is written after the whole run
        problem = unwritable(stem.parent / f"{stem.name}{suffix}")
        if problem is not None:
            raise argparse.ArgumentTypeError(problem)
    return stem


def unwritable(path: Path, folder: bool = False) -> str | None:
    """Why ``path`` (a file, or with ``folder`` a folder) could not be written, its missing parent
    folders created first; None when it could. What the file system says now: the commands ask before
    their work, which can take an hour, and not at its end."""
    if path.exists():
        if path.is_dir() != folder:
            return f"{path} is {'a file' if folder else 'a folder'}, not {'a folder' if folder else 'a file'}"
        return None if os.access(path, os.W_OK | (os.X_OK if folder else 0)) else f"{path} is not writable"
    parent = path.parent
    while not parent.exists() and parent != parent.parent:  # the nearest folder that is there
        parent = parent.parent
    if not parent.is_dir():
        return f"{parent} is a file, not a folder: {path} cannot be created"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"{parent} is not writable: {path} cannot be created"
    return None
