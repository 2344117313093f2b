"""The zoo's training text: documents from text present offline, in a fixed order, split by hash.

Sources (DESIGN.md §5, ZOO_NOTES.md): the Python standard library's code, the Python docs' reST
sources, Perl's pod pages and the King James Bible. The last three come from Debian packages
(``apt-get install python3.11-doc perl-doc bible-kjv``). A document goes to validation when the
CRC-32 of its id is 0 mod ``VAL_MODULUS``: the split does not depend on what else is present.

The token file (``tokens.npz``: train/val uint16 arrays per source, documents separated by the EOS
id) is what training reads; its hash, recorded in ``zoo/manifest.json``, identifies the corpus, so a
machine with other text (another Python, other packages) can check it holds the same tokens.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
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


def _files(root: Path, pattern: str, exclude: tuple[str, ...] = ()) -> Iterator[tuple[str, str]]:
    if not root.is_dir():
        raise FileNotFoundError(f"{root} is missing")
    for path in sorted(root.rglob(pattern)):
        rel = path.relative_to(root).as_posix()
        if path.is_file() and not rel.startswith(exclude):
            yield rel, path.read_text(encoding="utf-8", errors="replace")


def python_code() -> Iterator[tuple[str, str]]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    yield from _files(stdlib, "*.py", exclude=("site-packages/", "test/", "idlelib/idle_test/"))


def python_docs() -> Iterator[tuple[str, str]]:
    yield from _files(Path("/usr/share/doc/python3.11-doc/html/_sources"), "*.rst.txt")


def perl_pod() -> Iterator[tuple[str, str]]:
    yield from _files(Path("/usr/share/perl/5.36.0/pod"), "*.pod")


_VERSE = re.compile(r"^(\S+?)(\d+):(\d+) (.*)$")


def bible() -> Iterator[tuple[str, str]]:
    """One document per chapter, verse references stripped."""
    dump = subprocess.run(
        ["bible", "-f", "Gen1:1-Rev22:21"], capture_output=True, text=True, check=True
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


SOURCES: dict[str, Callable[[], Iterator[tuple[str, str]]]] = {
    "python-code": python_code,
    "python-docs": python_docs,
    "perl-pod": perl_pod,
    "bible": bible,
}


def documents(sources: tuple[str, ...] = tuple(SOURCES)) -> Iterator[Document]:
    """Every document of ``sources``, in a fixed order; empty documents are skipped."""
    for name in sources:
        for doc_id, text in SOURCES[name]():
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


def tokenize(docs: list[Document], encode_batch: Callable[[list[str]], list[list[int]]], eos_id: int):
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
