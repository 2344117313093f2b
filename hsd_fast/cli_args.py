"""Argument types of the ``hsd-fast`` command line: argparse ``type=`` callables that turn a bad value
into a usage error saying what was wanted.

A leaf module: the commands (``cli``, ``select_command``, ...) share these types, and none of them
needs another command's module to get them.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path


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
    return path.with_suffix("") if path.suffix == ".json" else path
