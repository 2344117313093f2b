"""Prompt sets from text the zoo never trained on, found on the machine itself.

The zoo's corpus is Python's standard library code, the Python docs, Perl's pod pages and the
King James Bible (``zoo/README.md``); a selector calibrated and measured only on those flatters
itself. These sets are other kinds of text every Linux machine with Python and a C compiler has:

- ``licenses``: license prose (``/usr/share/common-licenses``, else Python's own LICENSE);
- ``c-headers``: C source, the C library's headers (``/usr/include``);
- ``tables``: data tables (``/etc/services``, ``/etc/protocols``, the time-zone rules);
- ``man-pages``: manual pages in their roff source (``/usr/share/man/man1``, gzip).

A user's own text file is a set too (``TextSet.of_file``: ``hsd-fast bench --prompts FILE``).

A set takes its files in sorted order, at most ``MAX_FILES`` of them spread evenly over the sorted
list and ``MAX_CHARS`` characters in all, so the same machine gives the same tokens. A set whose files
are all missing is absent (``available`` names what was found). Windows are cut from the set's token
stream at evenly spaced offsets: calibration windows and measured prompts interleave and never
overlap.
"""

from __future__ import annotations

import glob
import gzip
import sysconfig
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

MAX_FILES = 40
MAX_CHARS = 400_000


@dataclass(frozen=True)
class TextSet:
    name: str
    kind: str  # what the text is, for reports
    sources: tuple[tuple[str, ...], ...]  # groups of globs: the first group that finds files is used

    @classmethod
    def of_file(cls, path: Path) -> TextSet:
        """A set of one file, named by its stem (its path taken as it is, not as a glob)."""
        return cls(path.stem, str(path), ((glob.escape(str(path)),),))

    def files(self) -> list[Path]:
        """The files this machine has for the set (see the module doc for the choice)."""
        for group in self.sources:
            found = sorted({Path(p) for pattern in group for p in glob.glob(pattern) if Path(p).is_file()})
            if found:
                step = max(1, len(found) // MAX_FILES)
                return found[::step][:MAX_FILES]
        return []

    def text(self) -> str:
        """The set's files joined by blank lines, cut at ``MAX_CHARS``."""
        parts, size = [], 0
        for path in self.files():
            try:
                raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
            except (OSError, EOFError, gzip.BadGzipFile):
                continue  # unreadable or not really gzip: the set goes on without it
            parts.append(raw.decode("utf-8", errors="replace"))
            size += len(parts[-1])
            if size >= MAX_CHARS:
                break
        return "\n\n".join(parts)[:MAX_CHARS]


def _python_license() -> str:
    return str(Path(sysconfig.get_paths()["stdlib"]) / "LICENSE.txt")


TEXT_SETS = {
    s.name: s
    for s in (
        TextSet("licenses", "license prose", (("/usr/share/common-licenses/*",), (_python_license(),))),
        TextSet("c-headers", "C source (libc headers)", (("/usr/include/*.h",),)),
        TextSet("tables", "data tables (services, protocols, time zones)",
                (("/etc/services", "/etc/protocols", "/usr/share/zoneinfo/tzdata.zi"),)),
        TextSet("man-pages", "manual pages (roff source)", (("/usr/share/man/man1/*.1.gz",),)),
    )
}  # fmt: skip
"""The sets by name, in report order."""


def available() -> list[str]:
    """The names of the sets this machine has text for."""
    return [name for name, s in TEXT_SETS.items() if s.files()]


@dataclass(frozen=True)
class PromptSet:
    name: str
    kind: str
    calibration: torch.Tensor  # [n_calibration, calibration_len] what the selector profiles on
    prompts: torch.Tensor  # [n_prompts, prompt_len] what is measured


def prompt_set(
    name: str | TextSet,
    encode: Callable[[str], list[int]],
    calibration: int = 4,
    prompts: int = 3,
    calibration_len: int = 128,
    prompt_len: int = 64,
) -> PromptSet:
    """The set ``name`` (of ``TEXT_SETS``, or a ``TextSet``) tokenized by ``encode`` and cut into
    ``calibration`` windows of ``calibration_len`` tokens and ``prompts`` prompts of ``prompt_len``,
    alternating at evenly spaced offsets (a prompt first). A ValueError names the set when the machine
    lacks it or its text is too short for the windows asked."""
    if isinstance(name, TextSet):
        text_set, name = name, name.name
    elif name in TEXT_SETS:
        text_set = TEXT_SETS[name]
    else:
        raise ValueError(f"unknown text set {name!r}; known: {', '.join(TEXT_SETS)}")
    if not text_set.files():
        globs = ", ".join(p for group in text_set.sources for p in group)
        raise ValueError(f"text set {name!r}: none of {globs} exists on this machine")
    text = text_set.text()
    tokens = torch.tensor(encode(text), dtype=torch.long)
    count, width = calibration + prompts, max(calibration_len, prompt_len)
    if len(tokens) < count * width:
        raise ValueError(
            f"text set {name!r} ({text_set.kind}): {len(tokens)} tokens, fewer than the {count} windows of "
            f"{width} asked"
        )
    stride = (len(tokens) - width) // count  # offsets (i + 1/2) * stride: a file's header is no prompt
    prompt_starts: list[int] = []
    calibration_starts: list[int] = []
    for i in range(count):  # alternate while both want more, then fill the one that does
        takes_prompt = len(prompt_starts) < prompts and (i % 2 == 0 or len(calibration_starts) == calibration)
        (prompt_starts if takes_prompt else calibration_starts).append(i * stride + stride // 2)
    return PromptSet(
        name,
        text_set.kind,
        torch.stack([tokens[s : s + calibration_len] for s in calibration_starts]),
        torch.stack([tokens[s : s + prompt_len] for s in prompt_starts]),
    )
