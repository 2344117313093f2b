"""A draft with another tokenizer: a level 0 whose model reads and writes its own tokens, joined to
the level above by the byte bridge (docs/design.md, "Drafts with another tokenizer").

Terms:
    stream        a row's text as bytes (``bridge``): the target-domain ids the row holds, spelled out
    draft ids     the draft's own ids for a prefix of the row's stream, then the ids it drafted past
                  it; ``fed`` of them are in its KV cache
    window        what is re-encoded for the draft each round: from the last draft id that still
                  spells the stream, minus one (its bytes might merge with what follows), to the end
                  of the stream; never the whole history once the prompt is in

One round for a row: the stream catches up with the row's ids (only positions past the last
verification's cut), the draft's ids follow it (the window), the draft's cache is cut back to the ids
that still hold, the draft decodes a few of its tokens (its most likely ones, whatever the run's
temperature: ``_choose``), and their bytes, encoded by the target's tokenizer, are the proposal: all
but the last target token, which more bytes could still extend, unless the draft ended its text.

Exact as every proposal level is (``proposal_level``): the level above verifies point masses. The
draft's q is not transported: it lives on another vocabulary, and a point mass needs none.
"""

from __future__ import annotations

import bisect
import inspect
import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from hsd_fast.bridge import TokenBytes, complete_prefix
from hsd_fast.proposal_level import ProposalLevel
from hsd_fast.sampling_metadata import SamplingMetadata


@dataclass(frozen=True)
class OtherTokenizerDraft(ProposalLevel):
    """``model`` drafting in ``tokenizer``'s vocabulary for a level above that uses
    ``target_tokenizer``: the first (smallest) level of a hierarchy
    (``drafts=[OtherTokenizerDraft(d, tok_d, tok), ...]``, or ``draft_tokenizers=`` on ``generate``
    and ``wrap``). Both tokenizers must be HF fast tokenizers."""

    model: torch.nn.Module
    tokenizer: Any
    target_tokenizer: Any

    def __post_init__(self) -> None:
        if not isinstance(self.model, torch.nn.Module):
            kind = type(self.model).__name__
            raise TypeError(f"OtherTokenizerDraft: model must be a torch.nn.Module, got {kind}")
        for name in ("tokenizer", "target_tokenizer"):
            if not hasattr(getattr(self, name), "convert_ids_to_tokens"):
                raise TypeError(
                    f"OtherTokenizerDraft: {name} must be a Hugging Face tokenizer, got "
                    f"{type(getattr(self, name)).__name__}"
                )

    def proposer(self, num_rows: int, sampling: SamplingMetadata) -> BridgedProposer:
        return BridgedProposer(self, num_rows, sampling)


@dataclass
class _Row:
    """One row's two token domains (see the module's terms)."""

    stream: bytearray = field(default_factory=bytearray)
    target_ends: list[int] = field(default_factory=list)  # byte offset after each target id it spells
    draft_ids: list[int] = field(default_factory=list)
    draft_stream: bytearray = field(default_factory=bytearray)
    draft_ends: list[int] = field(default_factory=list)  # byte offset after each draft id
    fed: int = 0
    cache: Any = None


class BridgedProposer:
    """One run's state of an ``OtherTokenizerDraft``: per row its stream, its draft ids and a KV
    cache of the draft model; rows are served one at a time (each keeps its own cache)."""

    def __init__(self, spec: OtherTokenizerDraft, num_rows: int, sampling: SamplingMetadata) -> None:
        self.model = spec.model
        self.device = next(spec.model.parameters()).device
        self.draft = TokenBytes.of(spec.tokenizer)
        self.target = TokenBytes.of(spec.target_tokenizer)
        # ids the draft's tokenizer puts before a text (a BOS): the draft's context starts with them
        self.lead = list(spec.tokenizer("", add_special_tokens=True)["input_ids"])
        self.draft_eos = {int(e) for e in _eos_ids(spec.model, spec.tokenizer)}
        # transformers 5.24 names the forward's cache `cache`, 5.17 `past_key_values` (hf_runner)
        parameters = inspect.signature(spec.model.forward).parameters
        self.cache_keyword = "cache" if "cache" in parameters else "past_key_values"
        self.target_eos = int(sampling.eos_ids[0]) if sampling.eos_ids.numel() else None
        self.rows = [_Row() for _ in range(num_rows)]
        self.bridge_seconds = 0.0  # host time in the bridge itself (encoding, bookkeeping)
        self.model_seconds = 0.0  # the draft model's forwards and draws

    def invalidate(self, rows: np.ndarray, first_changed: np.ndarray) -> None:
        for r, n in zip(rows.tolist(), first_changed.tolist(), strict=True):
            _cut(self.rows[r], n)

    def propose(
        self, tokens: torch.Tensor, rows: np.ndarray, ends: np.ndarray, wanted: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # proposal_level.Proposer.propose (shapes there)
        started, model_before = time.perf_counter(), self.model_seconds
        proposals = np.zeros((len(rows), max(int(wanted.max()), 1)), dtype=np.int64)  # [R, W]
        counts = np.zeros(len(rows), dtype=np.int64)  # [R]
        last_is_eos = np.zeros(len(rows), dtype=bool)  # [R]
        for i, (r, end, want) in enumerate(zip(rows.tolist(), ends.tolist(), wanted.tolist(), strict=True)):
            if want <= 0:
                continue
            row = self.rows[r]
            self._catch_up_stream(row, tokens, r, end)
            ids, eos = self._draft(row, want)
            counts[i], last_is_eos[i] = len(ids), eos
            proposals[i, : len(ids)] = ids
        self.bridge_seconds += time.perf_counter() - started - (self.model_seconds - model_before)
        return proposals, counts, last_is_eos

    def _catch_up_stream(self, row: _Row, tokens: torch.Tensor, r: int, end: int) -> None:
        """The row's stream extended to its ids ``[0, end)`` (those past the last cut only)."""
        _cut(row, end)  # a row shorter than its stream: cut as a verification would have
        known = len(row.target_ends)
        if known == end:
            return
        new = tokens[r, known:end].tolist()
        offset = row.target_ends[-1] if row.target_ends else 0
        for n in self.target.lengths(new):
            offset += n
            row.target_ends.append(offset)
        row.stream += self.target.bytes_of(new)

    def _draft(self, row: _Row, want: int) -> tuple[list[int], bool]:
        """Up to ``want`` target ids drafted after the row's stream, and whether the last is an EOS."""
        tail = bytes(row.stream[-4:])  # a character the row has not finished ends within 3 bytes
        if complete_prefix(tail) < len(tail) or not self._follow_stream(row):
            return [], False  # a character is unfinished, or the draft cannot spell the stream
        ratio = len(row.draft_ids) / max(len(row.target_ends), 1)  # draft ids per target id so far
        steps = min(math.ceil((want + 1) * max(ratio, 0.5)) + 1, 4 * want + 4)
        drafted, eos = self._decode(row, steps)
        text = self.draft.bytes_of(drafted)
        ids = self.target.encode(text[: complete_prefix(text)])
        if ids is None:
            return [], False
        if eos and self.target_eos is not None and len(ids) < want:
            return [*ids, self.target_eos], True
        return ids[: min(want, max(len(ids) - 1, 0))], False  # the last id could still grow

    def _follow_stream(self, row: _Row) -> bool:
        """The draft's ids spell the row's stream again: the ids that still do are kept, minus the
        last (more bytes could merge into it), and the window after them is re-encoded; the KV cache
        keeps the ids that did not change. False where the draft's tokenizer cannot spell it."""
        stream, old = row.stream, row.draft_stream
        common = _common_prefix(old, stream)
        keep = bisect.bisect_right(row.draft_ends, common)  # ids wholly inside the common prefix
        if common < len(old) or common < len(stream):
            keep = max(keep - 1, 0)
        keep = max(keep, len(self.lead)) if row.draft_ids else 0
        start = row.draft_ends[keep - 1] if keep else 0
        window = self.draft.encode(bytes(stream[start:]))
        if window is None:
            return False
        lead = [] if keep else self.lead
        new_ids = row.draft_ids[:keep] + lead + window
        offsets = row.draft_ends[:keep] + [start] * len(lead)
        for n in self.draft.lengths(window):
            offsets.append(offsets[-1] + n if offsets else n)
        fed = min(row.fed, _common_prefix(row.draft_ids, new_ids))
        if row.cache is not None and fed < row.fed:
            _keep(row.cache, fed)
        del old[common:]  # the draft's stream becomes the row's: only what differs is copied
        old += stream[common:]
        row.draft_ids, row.draft_ends, row.fed = new_ids, offsets, fed
        return bool(new_ids)

    def _decode(self, row: _Row, steps: int) -> tuple[list[int], bool]:
        """``steps`` of the draft's ids after its context (fewer at its EOS), appended to the row's
        draft ids (their bytes too: the next round keeps those the verification accepted)."""
        drafted: list[int] = []
        for _ in range(steps):
            started = time.perf_counter()
            token = self._choose(self._forward(row))
            self.model_seconds += time.perf_counter() - started
            if token in self.draft_eos:
                return drafted, True
            drafted.append(token)
            row.draft_ids.append(token)
            piece = self.draft.bytes_of([token])
            row.draft_ends.append((row.draft_ends[-1] if row.draft_ends else 0) + len(piece))
            row.draft_stream += piece
        return drafted, False

    def _forward(self, row: _Row) -> torch.Tensor:
        """The draft's logits after its ids, feeding what its cache lacks."""
        if row.cache is None:
            from transformers import DynamicCache

            row.cache = DynamicCache()
        if row.fed >= len(row.draft_ids):  # every id is cached (the draft ended its text last
            row.fed = len(row.draft_ids) - 1  # round): the last is fed again for its logits
            _keep(row.cache, row.fed)
        ids = torch.tensor([row.draft_ids[row.fed :]], device=self.device)  # [1, n]
        out = self.model(input_ids=ids, use_cache=True, logits_to_keep=1, **{self.cache_keyword: row.cache})
        row.fed = len(row.draft_ids)
        return out.logits[0, -1]

    def _choose(self, logits: torch.Tensor) -> int:
        """The draft's most likely id, at any temperature: a point mass x passes with probability
        p(x), so a proposal should be the token the draft believes likeliest; one drawn from the
        draft's q passes less often (and needs no randomness of its own)."""
        vocab = len(self.draft.table)
        return int(logits[:vocab].argmax())  # a padded head's extra rows are never drafted


def _cut(row: _Row, n: int) -> None:
    """The row's stream cut back to its first ``n`` target ids (a verification may have replaced
    the rest)."""
    if n < len(row.target_ends):
        del row.target_ends[n:]
        del row.stream[row.target_ends[-1] if row.target_ends else 0 :]


def _keep(cache, length: int) -> None:
    """``cache`` cut back to its first ``length`` positions (a negative ``crop`` removes that many:
    the spelling transformers 5.17 through 5.24 all take)."""
    drop = cache.get_seq_length() - length
    if drop > 0:
        cache.crop(-drop)


def _common_prefix(a, b) -> int:
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


def _eos_ids(model: torch.nn.Module, tokenizer) -> list[int]:
    """The draft's end-of-text ids: its generation config's, else its tokenizer's."""
    config = getattr(model, "generation_config", None)
    eos = getattr(config, "eos_token_id", None)
    if eos is None:
        eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        return []
    return [eos] if isinstance(eos, int) else list(eos)
