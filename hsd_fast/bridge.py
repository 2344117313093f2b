"""The byte bridge between two tokenizers (docs/design.md, "Drafts with another tokenizer").

Terms:
    token bytes   the bytes a token id stands for in the text (byte-level BPE: its string through
                  the byte-to-character table; SentencePiece style: ``▁`` as a space, ``<0xNN>`` as
                  byte NN); None for a special token, which has no text
    stream        a row's text as bytes: the concatenated token bytes of its ids, in order
    complete      a stream prefix that ends on a UTF-8 character boundary: only such text can be
                  handed to a tokenizer, which encodes ``str``

Lives in Python, not beside the C++ ledger: encoding needs the tokenizer itself (the Rust tokenizer
behind HF's fast tokenizers, reached through Python), and the work per round is a few short strings.
"""

from __future__ import annotations

import functools
import json
import re
import weakref

from hsd_fast.attached import attached

_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


@functools.cache
def _byte_of_char() -> dict[str, int]:
    """GPT-2's byte-level alphabet, inverted: the character each byte is written as -> the byte."""
    spans = (("!", "~"), ("¡", "¬"), ("®", "ÿ"))  # bytes written as themselves
    printable = {b for first, last in spans for b in range(ord(first), ord(last) + 1)}
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:  # the bytes with no printable character of their own go to 256, 257, ...
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


class TokenBytes:
    """Every id's bytes for one tokenizer (``of`` keeps one table per tokenizer object)."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        special = set(getattr(tokenizer, "all_special_ids", ()))
        pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
        style = _decoder_style(tokenizer)
        self.table: list[bytes | None] = [
            None if i in special or piece is None else _piece_bytes(tokenizer, i, piece, style)
            for i, piece in enumerate(pieces)
        ]
        self.shared: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # target -> shared_ids

    @classmethod
    def of(cls, tokenizer) -> TokenBytes:
        tables = attached(tokenizer, "bytes")
        if "table" not in tables:
            tables["table"] = cls(tokenizer)
        return tables["table"]

    def bytes_of(self, ids) -> bytes:
        """The stream of ``ids`` (special tokens add nothing)."""
        table = self.table
        return b"".join(table[i] or b"" for i in ids if i < len(table))

    def lengths(self, ids) -> list[int]:
        """Each id's byte count, in order."""
        table = self.table
        return [len(table[i] or b"") if i < len(table) else 0 for i in ids]

    def encode(self, data: bytes) -> list[int] | None:
        """``data`` as this tokenizer's ids, or None where ``data`` is not UTF-8 text or the ids do
        not spell it back byte for byte (a normaliser changed the text): the bridge then proposes
        nothing rather than something it cannot place."""
        if not data:
            return []
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:  # bytes no text spells (a model may emit them): nothing to encode
            return None
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return ids if self.bytes_of(ids) == data else None


def shared_ids(draft: TokenBytes, target: TokenBytes) -> tuple[list[int], list[int]]:
    """The vocabulary two tokenizers share: the draft ids whose bytes are exactly one target id's,
    and those target ids, one to one (a target id spelled by several draft ids keeps the first).
    Special tokens have no bytes and share nothing here. Computed once per pair of tables."""
    if target in draft.shared:
        return draft.shared[target]
    target_of: dict[bytes, int] = {}
    for i, piece in enumerate(target.table):
        if piece:
            target_of.setdefault(piece, i)
    sources, targets, taken = [], [], set()
    for i, piece in enumerate(draft.table):
        t = target_of.get(piece) if piece else None
        if t is not None and t not in taken:
            sources.append(i)
            targets.append(t)
            taken.add(t)
    draft.shared[target] = (sources, targets)
    return sources, targets


def complete_prefix(data: bytes) -> int:
    """The length of the longest prefix of ``data`` that is UTF-8 text: up to an unfinished
    character at the end, or to the first byte no text spells."""
    try:
        data.decode("utf-8")
        return len(data)
    except UnicodeDecodeError as err:
        return err.start


def _decoder_style(tokenizer) -> str:
    """ "byte-level", "sentencepiece" or "decode" (each id decoded alone: any other decoder)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return "decode"
    text = json.dumps(json.loads(backend.to_str()).get("decoder"))
    if '"ByteLevel"' in text:
        return "byte-level"
    if '"ByteFallback"' in text or "\\u2581" in text or "▁" in text:
        return "sentencepiece"
    return "decode"


def _piece_bytes(tokenizer, i: int, piece: str, style: str) -> bytes:
    if style == "byte-level":
        table = _byte_of_char()
        if all(c in table for c in piece):
            return bytes(table[c] for c in piece)
        return piece.encode("utf-8")  # an added token, written as plain text
    if style == "sentencepiece":
        fallback = _BYTE_FALLBACK.match(piece)
        if fallback:
            return bytes([int(fallback.group(1), 16)])
        return piece.replace("▁", " ").encode("utf-8")
    return tokenizer.decode([i]).encode("utf-8")


def common_prefix(a, b) -> int:
    """How many leading items ``a`` and ``b`` (bytes or lists) share: a binary search over slice
    comparisons, each a C-level compare, rather than a Python loop over a long stream."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        mid = (low + high + 1) // 2
        if a[:mid] == b[:mid]:
            low = mid
        else:
            high = mid - 1
    return low
