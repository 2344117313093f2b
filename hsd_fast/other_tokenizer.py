"""A draft with another tokenizer: a level 0 whose model reads and writes its own tokens, joined to
the level above by the byte bridge (docs/design.md, "Drafts with another tokenizer").

Terms:
    stream        a row's text as bytes (``bridge``): the target-domain ids the row holds, spelled out
    draft ids     the draft's own ids for a prefix of the row's stream, then the ids it drafted past
                  it; ``fed`` of them are in the draft model's KV cache
    window        what is re-encoded for the draft each round: from the last draft id that still
                  spells the stream, minus one (its bytes might merge with what follows), to the end
                  of the stream; never the whole history once the prompt is in

One round: each row's stream catches up with its ids (only positions past the last verification's
cut) and its draft ids follow the stream (the window; the draft's cache keeps the ids that did not
change), then the draft model decodes a few of its ids for every drafting row at once
(``other_tokenizer_steps``), and each row's drafted bytes, encoded by the target's tokenizer, are its
proposal: all but the last target id, which more bytes could still extend, unless the draft ended
its text.

Two ways to be exact:
    point masses    the draft decodes its most likely ids (greedy runs, and sampled ones where the
                    draft shares little of its vocabulary with the target); the level above
                    verifies each proposed target id as a point mass (``proposal_level``): x passes
                    with probability p(x), whatever the draft's q
    shared sampling a sampled run where the draft shares at least ``SHARED_SAMPLING_MIN`` of its
                    ids with the target (same bytes, one id each: ``bridge.shared_ids``): the draft
                    draws only shared ids, from its q restricted to them, each id one target id,
                    proposed as drawn (not re-encoded), and hands that q up in the target's
                    vocabulary; the level above verifies it as a model draft's (x passes with
                    min(1, p(x) / q(x))). Exact because every proposed id was drawn from exactly
                    the q handed up; a draft id that spells two target ids, or part of one, is
                    never drawn (its bytes would not be one draw of that q).
"""

from __future__ import annotations

import bisect
import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from hsd_fast.bridge import TokenBytes, common_prefix, complete_prefix, shared_ids
from hsd_fast.engine import MAX_BLOCK_SIZE
from hsd_fast.lookup import LookupDraft, as_lookup
from hsd_fast.other_tokenizer_chain import ChainSteps, chain_steps
from hsd_fast.other_tokenizer_steps import SharedSampling
from hsd_fast.processors import LogitsTransform
from hsd_fast.proposal_level import ProposalLevel, Proposals
from hsd_fast.sampling_metadata import SamplingMetadata

SHARED_SAMPLING_MIN = 0.5
"""The share of the draft's ids (those that spell text) that must each be one target id for a
sampled run to draw from the shared vocabulary rather than propose point masses."""


@dataclass(frozen=True)
class OtherTokenizerDraft(ProposalLevel):
    """``model`` drafting in ``tokenizer``'s vocabulary for a level above that uses
    ``target_tokenizer``: the first (smallest) level of a hierarchy
    (``drafts=[OtherTokenizerDraft(d, tok_d, tok), ...]``, or ``draft_tokenizers=`` on ``generate``
    and ``wrap``). Both tokenizers must be HF fast tokenizers. ``shared_sampling``: how a sampled run
    verifies it (module doc): None (the default) draws from the shared vocabulary where the draft
    shares at least ``SHARED_SAMPLING_MIN`` of its ids with the target, else proposes point masses;
    True / False force either. ``below``: smaller models in ``tokenizer``'s ids, smallest first (the
    first may be the lookup level, ``"lookup"`` or a ``LookupDraft``), that draft ``model``'s greedy
    ids for it (``other_tokenizer_chain``; ``block_sizes``: one per level, the ids it drafts per
    verification by the next); the proposals stay the same, point masses."""

    model: torch.nn.Module
    tokenizer: Any
    target_tokenizer: Any
    shared_sampling: bool | None = None  # sampled runs: True / False force the mode (module doc)
    below: tuple[torch.nn.Module | LookupDraft, ...] = ()  # drafting for ``model`` in ``tokenizer``'s ids
    block_sizes: tuple[int, ...] = ()  # ids each of ``below`` drafts per verification by the next

    def __post_init__(self) -> None:
        if not isinstance(self.model, torch.nn.Module):
            kind = type(self.model).__name__
            raise TypeError(f"OtherTokenizerDraft: model must be a torch.nn.Module, got {kind}")
        object.__setattr__(self, "below", tuple(as_lookup(b) or b for b in self.below))
        object.__setattr__(self, "block_sizes", tuple(self.block_sizes))
        _check_below(self.below, self.block_sizes, self.model)
        if self.below and self.shared_sampling:
            raise ValueError(
                "OtherTokenizerDraft: a draft with models below it proposes its greedy ids (point "
                "masses): shared_sampling=True needs it alone"
            )
        for name in ("tokenizer", "target_tokenizer"):
            if not hasattr(getattr(self, name), "convert_ids_to_tokens"):
                raise TypeError(
                    f"OtherTokenizerDraft: {name} must be a Hugging Face tokenizer, got "
                    f"{type(getattr(self, name)).__name__}"
                )

    def proposer(
        self,
        num_rows: int,
        sampling: SamplingMetadata,
        compile: bool = False,
        transform: LogitsTransform | None = None,
    ) -> BridgedProposer:
        temperature = 1.0 if transform is None else transform.inner_temperature
        return BridgedProposer(self, num_rows, sampling, compile, temperature)

    def draws_q(self, greedy: bool) -> bool:
        """Whether a run samples from the shared vocabulary (module doc): where it samples, unless
        ``shared_sampling`` says otherwise, when the draft shares at least ``SHARED_SAMPLING_MIN``
        of its ids that spell text."""
        if greedy or self.shared_sampling is False or self.below:
            return False
        sources, _ = shared_ids(TokenBytes.of(self.tokenizer), TokenBytes.of(self.target_tokenizer))
        spelled = sum(piece is not None for piece in TokenBytes.of(self.tokenizer).table)
        return bool(sources) and (self.shared_sampling or len(sources) >= SHARED_SAMPLING_MIN * spelled)

    @property
    def models(self) -> tuple[torch.nn.Module, ...]:
        return (*(m for m in self.below if not isinstance(m, LookupDraft)), self.model)


def _check_below(below: tuple, block_sizes: tuple, model: torch.nn.Module) -> None:
    """``below``: models (the first may be the lookup level), one block size each in [1,
    ``MAX_BLOCK_SIZE``], no model twice (a model holds one cache per run)."""
    for i, m in enumerate(below):
        if not isinstance(m, torch.nn.Module) and not (i == 0 and isinstance(m, LookupDraft)):
            raise TypeError(
                f"OtherTokenizerDraft: below[{i}] must be a torch.nn.Module (below[0] may be the lookup "
                f"level), got {m!r}"
            )
    if len(block_sizes) != len(below) or not all(
        isinstance(t, int) and not isinstance(t, bool) and 1 <= t <= MAX_BLOCK_SIZE for t in block_sizes
    ):
        raise ValueError(
            f"OtherTokenizerDraft: block_sizes needs one int in [1, {MAX_BLOCK_SIZE}] per model in below "
            f"({len(below)}), got {list(block_sizes)}"
        )
    models = [m for m in (*below, model) if isinstance(m, torch.nn.Module)]
    if len({id(m) for m in models}) != len(models):
        raise ValueError("OtherTokenizerDraft: a model appears twice among model and below")


@dataclass
class _Row:
    """One row's two token domains (see the module's terms)."""

    stream: bytearray = field(default_factory=bytearray)
    target_ends: list[int] = field(default_factory=list)  # byte offset after each target id it spells
    draft_ids: list[int] = field(default_factory=list)
    draft_stream: bytearray = field(default_factory=bytearray)
    draft_ends: list[int] = field(default_factory=list)  # byte offset after each draft id
    fed: int = 0  # draft ids in the draft model's cache (other_tokenizer_steps)


class BridgedProposer:
    """One run's state of an ``OtherTokenizerDraft``: per row its stream and draft ids; the draft
    model's steps (``DraftSteps``) serve all rows that draft in a round at once."""

    def __init__(
        self,
        spec: OtherTokenizerDraft,
        num_rows: int,
        sampling: SamplingMetadata,
        compile: bool = False,
        temperature: float = 1.0,  # beyond sampling.temperature: LogitsTransform.inner_temperature
    ) -> None:
        self.draft = TokenBytes.of(spec.tokenizer)
        self.target = TokenBytes.of(spec.target_tokenizer)
        # ids the draft's tokenizer puts before a text (a BOS): the draft's context starts with them
        self.lead = list(spec.tokenizer("", add_special_tokens=True)["input_ids"])
        self.draft_eos = {int(e) for e in _eos_ids(spec.model, spec.tokenizer)}
        levels, vocab = (*spec.below, spec.model), len(self.draft.table)
        self.steps = chain_steps(levels, spec.block_sizes, vocab, num_rows, compile, sorted(self.draft_eos))
        self.target_eos = int(sampling.eos_ids[0]) if sampling.eos_ids.numel() else None
        self.rows = [_Row() for _ in range(num_rows)]
        self.shared = self._shared_sampling(sampling, temperature) if spec.draws_q(sampling.greedy) else None
        self.target_positions = 0  # the run's token buffer, in target ids (propose)
        self.bridge_seconds = 0.0  # host time in the bridge itself (encoding, bookkeeping)

    @property
    def chain_counts(self) -> tuple[int, int]:
        """Ids the models under the draft drafted for it, and how many it kept (0, 0: none under it)."""
        return (self.steps.drafted, self.steps.accepted) if isinstance(self.steps, ChainSteps) else (0, 0)

    @property
    def model_seconds(self) -> float:
        """Time in the draft model's forwards (each one's host sync included)."""
        return self.steps.seconds

    def invalidate(self, rows: np.ndarray, first_changed: np.ndarray) -> None:
        for r, n in zip(rows.tolist(), first_changed.tolist(), strict=True):
            _cut(self.rows[r], n)

    def propose(
        self, tokens: torch.Tensor, rows: np.ndarray, ends: np.ndarray, wanted: np.ndarray
    ) -> Proposals:  # proposal_level.Proposer.propose (shapes there)
        started, model_before = time.perf_counter(), self.model_seconds
        self.target_positions = tokens.shape[1]
        proposals = np.zeros((len(rows), max(int(wanted.max()), 1)), dtype=np.int64)  # [R, W]
        counts = np.zeros(len(rows), dtype=np.int64)  # [R]
        last_is_eos = np.zeros(len(rows), dtype=bool)  # [R]
        steps: dict[int, int] = {}  # row -> draft ids to decode this round
        firsts = np.zeros(len(self.rows), dtype=np.int64)  # [B] the target position of each row's first
        for r, end, want in zip(rows.tolist(), ends.tolist(), wanted.tolist(), strict=True):
            if want > 0:
                self._catch_up_stream(self.rows[r], tokens, r, end)
                steps[r], firsts[r] = self._steps_for(self.rows[r], want), end
        drafted, q = self._decode({r: n for r, n in steps.items() if n > 0}, firsts)
        for i, (r, want) in enumerate(zip(rows.tolist(), wanted.tolist(), strict=True)):
            if r in drafted:
                drawn, ended, targets = drafted[r]
                ids, eos = self._proposal(drawn, ended, want, targets)
                counts[i], last_is_eos[i] = len(ids), eos
                proposals[i, : len(ids)] = ids
        q_logits = q_lse = None
        if q is not None:  # shared sampling: each proposed id's q, the rows in the order of `rows`
            at = torch.from_numpy(rows).to(q[0].device)
            width = min(proposals.shape[1], q[0].shape[1])
            q_logits, q_lse = q[0][at, :width], q[1][at, :width]  # [R, W', V_target], [R, W']
        self.bridge_seconds += time.perf_counter() - started - (self.model_seconds - model_before)
        return Proposals(proposals, counts, last_is_eos, q_logits, q_lse)

    def _shared_sampling(self, sampling: SamplingMetadata, temperature: float) -> SharedSampling:
        """The shared vocabulary as the draft's sampled steps read it (the draft's EOS shared with
        the target's, where both have one), and the run's temperature: the draft draws at it as a
        model draft does (its logits scaled by ``1 / temperature`` where a temperature stands among
        the run's processors, whose logits reach the ops already processed)."""
        sources, targets = shared_ids(self.draft, self.target)
        eos = sorted(self.draft_eos)
        if eos and self.target_eos is not None and self.target_eos not in targets:
            sources, targets = [*sources, eos[0]], [*targets, self.target_eos]
        device = self.steps.device
        vocab = max(len(self.target.table), (self.target_eos or 0) + 1)  # the engine pads to the model's
        to_draft = torch.zeros(vocab, dtype=torch.int64)
        to_draft[targets] = torch.tensor(sources)
        ids = (torch.tensor(sources), torch.tensor(targets), to_draft)
        seeds = sampling.seeds_at(below_target=True)
        scale = torch.tensor(1.0 / temperature, dtype=torch.float32, device=device)
        return SharedSampling(*(t.to(device) for t in ids), scale, sampling.temperature, seeds)

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

    def _steps_for(self, row: _Row, want: int) -> int:
        """How many draft ids the row decodes for ``want`` target ids after its stream (as many,
        sampling from the shared vocabulary); 0 where it drafts nothing this round (a character is
        unfinished, or the draft's tokenizer cannot spell the stream)."""
        tail = bytes(row.stream[-4:])  # a character the row has not finished ends within 3 bytes
        if complete_prefix(tail) < len(tail) or not self._follow_stream(row):
            return 0
        if self.shared is not None:
            return want
        ratio = len(row.draft_ids) / max(len(row.target_ends), 1)  # draft ids per target id so far
        return min(math.ceil((want + 1) * max(ratio, 0.5)) + 1, 4 * want + 4)

    def _proposal(
        self, drafted: list[int], eos: bool, want: int, targets: list[int] | None = None
    ) -> tuple[list[int], bool]:
        """Up to ``want`` target ids for the draft ids a row drafted, and whether the last is an EOS:
        drawn from the shared vocabulary, their ``targets`` as drawn; else their bytes in the
        target's ids, all but the last (more bytes could still extend it) unless the draft ended
        its text."""
        if targets is not None:
            return targets[: min(len(drafted) + eos, want)], eos and len(drafted) < want
        text = self.draft.bytes_of(drafted)
        ids = self.target.encode(text[: complete_prefix(text)])
        if ids is None:
            return [], False
        if eos and self.target_eos is not None and len(ids) < want:
            return [*ids, self.target_eos], True
        return ids[: min(want, max(len(ids) - 1, 0))], False  # the last id could still grow

    def _follow_stream(self, row: _Row) -> bool:
        """The draft's ids spell the row's stream again: the ids that still do are kept, minus the
        last (more bytes could merge into it), and the window after them is re-encoded; the draft's
        cache keeps the ids that did not change. False where the draft's tokenizer cannot spell it."""
        stream, old = row.stream, row.draft_stream
        common = common_prefix(old, stream)
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
        row.fed = min(row.fed, common_prefix(row.draft_ids, new_ids))
        del old[common:]  # the draft's stream becomes the row's: only what differs is copied
        old += stream[common:]
        row.draft_ids, row.draft_ends = new_ids, offsets
        return bool(new_ids)

    def _decode(
        self, steps: dict[int, int], firsts: np.ndarray
    ) -> tuple[dict[int, tuple[list[int], bool, list[int] | None]], tuple[torch.Tensor, torch.Tensor] | None]:
        """``steps[r]`` of the draft's ids after each row's context (fewer at its EOS), all rows in
        each forward, appended to the rows' draft ids (their bytes too: the next round keeps those
        the verification accepted). Returns row -> (the ids drafted, whether the draft ended its
        text, their target ids where drawn from the shared vocabulary), and then the q they were
        drawn from (``Drafted.q_logits``, ``q_lse``)."""
        count = self.steps.count_for(max(steps.values(), default=1))
        steps = {r: n for r, n in steps.items() if self.steps.fits(len(self.rows[r].draft_ids) + count)}
        if not steps:
            return {}, None
        needed = max(len(self.rows[r].draft_ids) + count for r in steps)
        if needed > self.steps.capacity and self.steps.reserve(needed, self._expected_ids()):
            for row in self.rows:  # a new, larger cache holds nothing yet (sized once: not per round)
                row.fed = 0
        spans = {}
        for r in steps:
            row = self.rows[r]
            row.fed = min(row.fed, len(row.draft_ids) - 1)  # all cached (the draft ended its text
            spans[r] = (row.fed, row.draft_ids[row.fed :])  # last round): the last is fed again
        drafted = {}
        result = self.steps.advance(spans, count, self.shared, firsts)
        for r, ids in result.ids.items():
            row, n = self.rows[r], steps[r]
            ends = [i for i, token in enumerate(ids[:n]) if token in self.draft_eos]
            ids = ids[: ends[0] if ends else n]
            row.fed = len(row.draft_ids) + min(len(ids), count - 1)  # the last id drafted was not fed
            row.draft_ids += ids
            for piece in (self.draft.table[i] or b"" for i in ids):
                row.draft_ends.append((row.draft_ends[-1] if row.draft_ends else 0) + len(piece))
                row.draft_stream += piece
            drafted[r] = (ids, bool(ends), None if result.target_ids is None else result.target_ids[r])
        return drafted, None if result.q_logits is None else (result.q_logits, result.q_lse)

    def _expected_ids(self) -> int:
        """Draft ids a row may reach in this run: the run's positions in target ids, times the most
        draft ids per target id any row has so far, with a margin (the cache is sized for it at
        once rather than grown mid-run, which would re-feed every row and compile anew)."""
        ratio = max(len(row.draft_ids) / max(len(row.target_ends), 1) for row in self.rows)
        return math.ceil(1.25 * max(ratio, 1.0) * self.target_positions)


def same_tokenizer(a, b) -> bool:
    """One object, or two with the same vocabulary (token strings to ids): no boundary between them."""
    return a is b or a.get_vocab() == b.get_vocab()


def _cut(row: _Row, n: int) -> None:
    """The row's stream cut back to its first ``n`` target ids (a verification may have replaced
    the rest)."""
    if n < len(row.target_ends):
        del row.target_ends[n:]
        del row.stream[row.target_ends[-1] if row.target_ends else 0 :]


def _eos_ids(model: torch.nn.Module, tokenizer) -> list[int]:
    """The draft's end-of-text ids: its generation config's, else its tokenizer's."""
    config = getattr(model, "generation_config", None)
    eos = getattr(config, "eos_token_id", None)
    if eos is None:
        eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        return []
    return [eos] if isinstance(eos, int) else list(eos)
