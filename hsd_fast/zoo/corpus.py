"""The zoo's training text: documents from text present offline, in a fixed order, split by hash.

Sources (docs/design.md, 'The zoo'): the running Python's standard library code, the Python docs'
reST sources, Perl's pod pages and the King James Bible. The last three come from Debian packages
(``apt-get install python3.11-doc perl-doc bible-kjv`` for the committed zoo, built on Debian 12 with
Python 3.11). Their paths carry version numbers, so each source is *found*: a glob over versions,
sorted, the newest match picked (for the docs, the running Python's release when it is there).
``hsd-fast zoo sources`` shows what was found; a missing source is an error naming its package.

A document goes to validation when the CRC-32 of its id is 0 mod ``VAL_MODULUS`` (plus the smallest
CRC-32 of each source): the split does not depend on what else is present.

The token file (``tokens.npz``: train/val uint16 arrays per source, documents separated by the EOS
id) is what training reads; its hash, recorded in ``zoo/manifest.json``, identifies the corpus, so a
machine with other text (another Python, other packages) can check it holds the same tokens.
"""

from __future__ import annotations

import glob
import hashlib
import re
import shutil
import subprocess
import sys
import sysconfig
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

VAL_MODULUS = 50  # ~2% of the documents of every source are held out


@dataclass(frozen=True)
class Document:
    source: str
    doc_id: str  # stable name (relative path, or book and chapter)
    text: str

    @property
    def crc(self) -> int:
        return zlib.crc32(self.doc_id.encode())


def validation_ids(docs: list[Document]) -> set[tuple[str, str]]:
    """(source, doc_id) of the held-out documents."""
    held = {(d.source, d.doc_id) for d in docs if d.crc % VAL_MODULUS == 0}
    for source in {d.source for d in docs}:
        first = min((d for d in docs if d.source == source), key=lambda d: d.crc)
        held.add((source, first.doc_id))
    return held


# -- finding the sources ---------------------------------------------------------------------------


def _glob_versions(pattern: str) -> list[tuple[tuple[int, ...], Path]]:
    """(version, path) of each match of ``pattern``, oldest version first. The version is the numbers
    in the path component the ``*`` stands for (``5.36.0`` -> (5, 36, 0)), compared as numbers. Paths
    are resolved and deduplicated: Debian links ``/usr/share/perl/5.36`` to ``5.36.0``, and the same
    files must not count as two versions."""
    depth = next(i for i, part in enumerate(Path(pattern).parts) if "*" in part)
    found: dict[Path, tuple[int, ...]] = {}
    for match in glob.glob(pattern):
        path = Path(match)
        version = tuple(int(n) for n in re.findall(r"\d+", path.parts[depth]))
        found[path.resolve()] = max(version, found.get(path.resolve(), ()))
    return sorted(((v, p) for p, v in found.items()), key=lambda vp: (vp[0], vp[1].as_posix()))


def _python_stdlib() -> Path | None:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return stdlib if (stdlib / "os.py").is_file() else None


PYTHON_DOCS = "/usr/share/doc/python3.*-doc/html/_sources"


def _python_docs() -> Path | None:
    """The running Python's docs when installed (code and docs of one release), else the newest."""
    found = [(v, p) for v, p in _glob_versions(PYTHON_DOCS) if (p / "contents.rst.txt").is_file()]
    running = [p for v, p in found if v == tuple(sys.version_info[:2])]
    return (running or [p for _, p in found] or [None])[-1]


# perl-modules-5.xx also ships one page (perldiag.pod) in the same directory: look for a page only
# perl-doc installs, so a machine without perl-doc reports it missing instead of reading one page.
PERL_POD = "/usr/share/perl/5.*/pod/perl.pod"


def _perl_pod() -> Path | None:
    found = _glob_versions(PERL_POD)
    return found[-1][1].parent if found else None


def _bible() -> Path | None:
    found = shutil.which("bible")
    return Path(found) if found else None


# -- reading them ----------------------------------------------------------------------------------


def _files(root: Path, pattern: str, exclude: tuple[str, ...] = ()) -> Iterator[tuple[str, str]]:
    for path in sorted(root.rglob(pattern)):
        rel = path.relative_to(root).as_posix()
        if path.is_file() and not rel.startswith(exclude):
            yield rel, path.read_text(encoding="utf-8", errors="replace")


def _read_python_code(stdlib: Path) -> Iterator[tuple[str, str]]:
    yield from _files(stdlib, "*.py", exclude=("site-packages/", "test/", "idlelib/idle_test/"))


def _read_python_docs(root: Path) -> Iterator[tuple[str, str]]:
    yield from _files(root, "*.rst.txt")


def _read_perl_pod(root: Path) -> Iterator[tuple[str, str]]:
    yield from _files(root, "*.pod")


_VERSE = re.compile(r"^(\S+?)(\d+):(\d+) (.*)$")


def _read_bible(command: Path) -> Iterator[tuple[str, str]]:
    """One document per chapter, verse references stripped."""
    dump = subprocess.run(
        [str(command), "-f", "Gen1:1-Rev22:21"], capture_output=True, text=True, check=True
    ).stdout
    chapter, verses = None, []
    for line in dump.splitlines():
        match = _VERSE.match(line)
        if match is None:  # a verse wrapped over several lines
            if verses and line.strip():
                verses[-1] += " " + line.strip()
            continue
        key = f"{match[1]} {match[2]}"
        if key != chapter and verses:
            yield chapter, "\n".join(verses) + "\n"
            verses = []
        chapter = key
        verses.append(match[4].strip())
    if verses:
        yield chapter, "\n".join(verses) + "\n"


@dataclass(frozen=True)
class Source:
    """One kind of training text: what provides it, where it is looked for, how it is read."""

    name: str
    package: str | None  # the Debian package that installs it; None: the running Python's own files
    looks_for: str  # shown when it is missing
    locate: Callable[[], Path | None]
    read: Callable[[Path], Iterator[tuple[str, str]]]

    def find(self) -> Path:
        path = self.locate()
        if path is None:
            raise MissingSourcesError([self])
        return path


SOURCES: dict[str, Source] = {
    s.name: s
    for s in [
        Source(
            "python-code",
            None,
            "Python standard library (sysconfig 'stdlib')",
            _python_stdlib,
            _read_python_code,
        ),
        Source(
            "python-docs",
            f"python3.{sys.version_info.minor}-doc",
            PYTHON_DOCS,
            _python_docs,
            _read_python_docs,
        ),
        Source("perl-pod", "perl-doc", PERL_POD, _perl_pod, _read_perl_pod),
        Source("bible", "bible-kjv", "`bible` command on PATH", _bible, _read_bible),
    ]
}


class MissingSourcesError(FileNotFoundError):
    """Some corpus text is not on this machine; the message names the Debian packages to install."""

    def __init__(self, missing: list[Source]) -> None:
        self.missing = missing
        lines = [f"  {s.name}: no {s.looks_for} (Debian package {s.package or '-'})" for s in missing]
        packages = " ".join(s.package for s in missing if s.package)
        install = f"\ninstall with: apt-get install {packages}" if packages else ""
        super().__init__(
            "the zoo corpus needs text this machine does not have:\n"
            + "\n".join(lines)
            + install
            + "\n(`hsd-fast zoo sources` lists every source and where it was found)"
        )


def locate_sources(names: tuple[str, ...] = tuple(SOURCES)) -> dict[str, Path | None]:
    """Where each source is on this machine (None: missing); finds, reads nothing."""
    return {name: SOURCES[name].locate() for name in names}


def python_code() -> Iterator[tuple[str, str]]:
    """(relative path, text) of the running Python's standard library modules, tests excluded."""
    yield from _read_python_code(SOURCES["python-code"].find())


def documents(sources: tuple[str, ...] = tuple(SOURCES)) -> Iterator[Document]:
    """Every document of ``sources``, in a fixed order; empty documents are skipped. Raises
    :class:`MissingSourcesError`, naming every missing source at once, before reading any."""
    found = locate_sources(sources)
    missing = [SOURCES[name] for name, path in found.items() if path is None]
    if missing:
        raise MissingSourcesError(missing)
    for name, path in found.items():
        for doc_id, text in SOURCES[name].read(path):
            if text.strip():
                yield Document(name, doc_id, text)


def text_hash(docs: list[Document]) -> str:
    digest = hashlib.sha256()
    for doc in docs:
        digest.update(f"{doc.source}\0{doc.doc_id}\0".encode())
        digest.update(doc.text.encode())
    return digest.hexdigest()


@dataclass
class TokenCorpus:
    """uint16 token streams per source and split; documents separated by ``eos_id``."""

    train: dict[str, np.ndarray]
    val: dict[str, np.ndarray]

    def save(self, path: Path) -> str:
        arrays = {f"train/{k}": v for k, v in self.train.items()}
        arrays |= {f"val/{k}": v for k, v in self.val.items()}
        np.savez_compressed(path, **arrays)
        return self.hash()

    @classmethod
    def load(cls, path: Path, expected_hash: str | None = None) -> TokenCorpus:
        with np.load(path) as data:
            train = {k.split("/", 1)[1]: data[k] for k in data.files if k.startswith("train/")}
            val = {k.split("/", 1)[1]: data[k] for k in data.files if k.startswith("val/")}
        corpus = cls(train, val)
        if expected_hash is not None and corpus.hash() != expected_hash:
            raise ValueError(
                f"{path} holds another corpus (sha256 {corpus.hash()[:12]}, expected {expected_hash[:12]})"
            )
        return corpus

    def hash(self) -> str:
        """sha256 over the arrays themselves (not the zip file, whose metadata may vary)."""
        digest = hashlib.sha256()
        for split, arrays in (("train", self.train), ("val", self.val)):
            for name in sorted(arrays):
                digest.update(f"{split}/{name}\0".encode())
                digest.update(np.ascontiguousarray(arrays[name], dtype="<u2").tobytes())
        return digest.hexdigest()

    def summary(self) -> dict[str, dict[str, int]]:
        return {k: {"train": int(self.train[k].size), "val": int(self.val[k].size)} for k in self.train}


def tokenize(
    docs: list[Document], encode_batch: Callable[[list[str]], list[list[int]]], eos_id: int
) -> TokenCorpus:
    """Encode ``docs`` into a :class:`TokenCorpus` (each document followed by ``eos_id``)."""
    streams: dict[tuple[str, bool], list[np.ndarray]] = {}
    held = validation_ids(docs)
    ids = encode_batch([doc.text for doc in docs])
    for doc, doc_ids in zip(docs, ids, strict=True):
        val = (doc.source, doc.doc_id) in held
        streams.setdefault((doc.source, val), []).append(np.asarray([*doc_ids, eos_id]))
    sources = list(dict.fromkeys(doc.source for doc in docs))
    empty = np.zeros(0, np.uint16)

    def join(source: str, val: bool) -> np.ndarray:
        parts = streams.get((source, val))
        return np.concatenate(parts).astype(np.uint16) if parts else empty

    return TokenCorpus({s: join(s, False) for s in sources}, {s: join(s, True) for s in sources})
