"""HF's history- and length-dependent logits processors as tensor operations (docs/design.md,
"Sampling transforms"), and the per-position call for any other processor.

Each op takes ``[N, V]`` fp32 scores (N = rows x output columns) and what HF's processor would read
from ``input_ids`` at each of the N positions, in a form that keeps shapes static (so it compiles
with the step) and needs no host sync:

- ``history``: ``[N, K]`` int64, the ids HF's ``input_ids`` holds at that position, V where an entry
  holds none (``DecodeState.history_ids``; holes may stand between its parts: a tree's chain and its
  ancestors);
- ``width``: ``[N]`` int64, HF's ``input_ids.shape[-1]`` there (its padded prompt width plus the new
  tokens before), and ``new``: ``[N]`` int64, the new tokens before (``DecodeState.lengths``);
- a table built once per run from the processor's settings (``processors.LogitsTransform.tables``).

Every op reproduces HF's arithmetic in HF's order, so that greedy tokens and scores are HF's bit for
bit in fp32. ``per_position`` calls any other processor with the ``input_ids`` HF's unassisted
``generate`` would hand it (eager, host-driven).
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, NamedTuple

import torch

if TYPE_CHECKING:
    from transformers.generation.logits_process import LogitsProcessor


# ----------------------------------------------------------------------------- history processors
def repetition_penalty(scores: torch.Tensor, history: torch.Tensor, penalty: float) -> torch.Tensor:
    """HF's ``RepetitionPenaltyLogitsProcessor``: each id the history holds has its score divided by
    ``penalty`` where it is >= 0, multiplied where it is negative, once however often it occurs. HF's
    own gather and scatter (an id held twice writes the same value twice), on ``N * K`` entries
    rather than ``N * V`` (a masked pass over the vocabulary costs several times more)."""
    padded = torch.nn.functional.pad(scores, (0, 1))  # column V absorbs the entries that hold no id
    held = padded.gather(1, history)  # [N, K]
    penalized = torch.where(held < 0, held * penalty, held / penalty)
    return padded.scatter(1, history, penalized)[:, : scores.shape[1]]


def compact(history: torch.Tensor, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``history`` [N, K] with its holes (V entries) moved to the end, order kept (a stable sort), and
    each row's length [N]: what HF's ``input_ids`` row holds, left-aligned."""
    order = torch.sort((history == vocab).to(torch.int8), dim=1, stable=True).indices
    return history.gather(1, order), (history != vocab).sum(1)


def tail(ids: torch.Tensor, length: torch.Tensor, size: int) -> torch.Tensor:
    """[N, size]: the last ``size`` ids of each compacted row (``compact``); a row shorter than
    ``size`` gets some of its first ids instead (the caller masks such rows)."""
    at = (length[:, None] - size + torch.arange(size, device=ids.device)).clamp(min=0)
    return ids.gather(1, at)


def no_repeat_ngram(scores: torch.Tensor, ids: torch.Tensor, length: torch.Tensor, n: int) -> torch.Tensor:
    """HF's ``NoRepeatNGramLogitsProcessor``, given the compacted history (``compact``: ids [N, K],
    lengths [N]): every token that would complete an n-gram the history already holds gets -inf. The
    last n - 1 tokens are the tail; the last token of every window of n whose first n - 1 equal it is
    banned (an n-gram across a tree's chain and its ancestors is seen; a window holding a hole never
    matches)."""
    vocab = scores.shape[1]
    if n == 1:  # every token seen is banned
        return torch.nn.functional.pad(scores, (0, 1)).scatter(1, ids, float("-inf"))[:, :vocab]
    last = tail(ids, length, n - 1)  # [N, n - 1]
    windows = ids.unfold(1, n, 1)  # [N, K - n + 1, n]
    start = torch.arange(windows.shape[1], device=ids.device)
    match = (windows[..., :-1] == last[:, None]).all(-1) & (start + n <= length[:, None])  # [N, K - n + 1]
    match &= (length >= n - 1)[:, None]
    banned = torch.where(match, windows[..., -1], vocab)  # [N, K - n + 1]: V absorbs the rest
    return torch.nn.functional.pad(scores, (0, 1)).scatter(1, banned, float("-inf"))[:, :vocab]


class BiasGroup(NamedTuple):
    """Biased sequences of one length m + 1, matched at once: G sequences."""

    prefixes: torch.Tensor  # [G, m] int64 the first m ids of each
    last: torch.Tensor  # [G] int64 the id each biases
    bias: torch.Tensor  # [G] fp32 by how much
    context: int  # how many ids a history needs for them to count: m, or m + 1 (per_sequence)


class SequenceBiasTable(NamedTuple):
    """HF's ``SequenceBiasLogitsProcessor`` (and ``NoBadWordsLogitsProcessor``: a bias of -inf) as
    tensors over the vocabulary: the single-id biases and the longer sequences grouped by length."""

    single: torch.Tensor  # [V] fp32
    groups: tuple[BiasGroup, ...]


def sequence_bias_table(
    sequence_bias: dict[tuple[int, ...], float], vocab: int, device: torch.device, per_sequence: bool = False
) -> SequenceBiasTable:
    """The table of ``sequence_bias`` (HF's dict: id sequence -> bias), built as HF's processor builds
    its own on its first call: grouped by length in the order lengths first appear, each counted
    where the history holds its prefix. ``per_sequence``: as transformers 5.17's processor adds them,
    one sequence at a time in the dict's order, each counted only where the history holds as many ids
    as the whole sequence (the same sums in another order: fp32 may round them differently). An id
    past the vocabulary is refused as HF refuses it."""
    invalid = [i for sequence in sequence_bias for i in sequence if i >= vocab]
    if invalid:
        raise ValueError(
            f"The model vocabulary size is {vocab}, but the following tokens were being biased: {invalid}"
        )
    single = torch.zeros(vocab, dtype=torch.float32)
    grouped: dict[int, list[tuple[tuple[int, ...], float]]] = {}
    for n, (sequence, bias) in enumerate(sequence_bias.items()):
        if len(sequence) == 1:
            single[sequence[0]] = bias
        else:
            grouped.setdefault(n if per_sequence else len(sequence), []).append((sequence, bias))
    groups = tuple(
        BiasGroup(
            torch.tensor([s[:-1] for s, _ in group], dtype=torch.int64, device=device),
            torch.tensor([s[-1] for s, _ in group], dtype=torch.int64, device=device),
            torch.tensor([b for _, b in group], dtype=torch.float32, device=device),
            len(group[0][0]) - (0 if per_sequence else 1),
        )
        for group in grouped.values()
    )
    return SequenceBiasTable(single.to(device), groups)


def sequence_bias(
    scores: torch.Tensor, ids: torch.Tensor, length: torch.Tensor, table: SequenceBiasTable
) -> torch.Tensor:
    """HF's ``SequenceBiasLogitsProcessor``, given the compacted history (``compact``: ids [N, K],
    lengths [N]): the single-id biases, plus each longer sequence's bias on
    its last id where the history ends in its prefix (not where the history is shorter than the
    group's ``context``), summed in HF's order into one bias added to the scores."""
    bias = torch.zeros_like(scores) + table.single  # [N, V]
    for group in table.groups:
        size = group.prefixes.shape[1]
        ends_in = (tail(ids, length, size)[:, None] == group.prefixes).all(-1)  # [N, G]
        ends_in &= (length >= group.context)[:, None]
        bias = bias.index_add(1, group.last, torch.where(ends_in, group.bias, 0.0))
    return scores + bias


# ----------------------------------------------------------------------------- length processors
def id_mask(ids: torch.Tensor | int | list[int], vocab: int, device: torch.device) -> torch.Tensor:
    """[V] bool: True at ``ids`` (ids past the vocabulary dropped)."""
    ids = torch.as_tensor(ids, device=device).reshape(-1)
    mask = torch.zeros(vocab + 1, dtype=torch.bool, device=device)
    return mask.index_fill(0, ids.clamp(0, vocab), True)[:vocab]


def ban(scores: torch.Tensor, rows: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The scores of ``ids`` ([V] bool) -inf in ``rows`` ([N] bool): HF's ``min_length`` and
    ``min_new_tokens`` (the EOS ids, too early), ``begin_suppress_tokens`` (at the first new token)."""
    return scores.masked_fill(rows[:, None] & ids[None, :], float("-inf"))


def force(scores: torch.Tensor, rows: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """In ``rows`` ([N] bool), every score -inf but those of ``ids`` ([V] bool), which are 0: HF's
    ``forced_eos_token_id`` (at the last token of ``max_length``) and ``forced_bos_token_id``."""
    forced = torch.where(ids, 0.0, float("-inf")).to(scores.dtype)  # [V]
    return torch.where(rows[:, None], forced, scores)


def decay_factors(factor: float, size: int) -> torch.Tensor:
    """[size] fp32, at ``i``: ``factor ** i - 1``, computed as HF computes it (a Python float, which
    the multiplication rounds to fp32), inf where it overflows (HF's own call raises there)."""

    def one(i: int) -> float:
        try:
            return pow(factor, i) - 1
        except OverflowError:
            return float("inf")

    return torch.tensor([one(i) for i in range(size)], dtype=torch.float32)


def length_decay(
    scores: torch.Tensor, width: torch.Tensor, start: torch.Tensor, factors: torch.Tensor, eos: torch.Tensor
) -> torch.Tensor:
    """HF's ``ExponentialDecayLengthPenalty``: past ``start`` (its ``regulation_start``, in HF's
    ``input_ids`` width), each finite EOS score grows by ``|score| * (factor ** (width - start) - 1)``
    (``factors``, from ``decay_factors``; ``eos``: [V] bool). A removed EOS (-inf) stays removed, as
    in transformers 5.24 (5.17's turns it into NaN)."""
    past = width - start  # [N]
    step = factors[past.clamp(0, factors.shape[0] - 1)]  # [N]
    grown = scores + torch.where(scores.isfinite(), scores.abs() * step[:, None], 0.0)
    return torch.where((past > 0)[:, None] & eos[None, :], grown, scores)


# ----------------------------------------------------------------------------- any other processor
class Prefixes(NamedTuple):
    """What HF's unassisted ``generate`` would hand a processor for each of N rows of scores: the
    request row it belongs to (``prefix_allowed_tokens_fn``'s batch id) and its ``input_ids`` up to the
    token it follows (the padded prompt, then the row's tokens; a tree node's ancestors); None for a
    row whose scores are never read (padding, a row sitting out)."""

    rows: list[int]
    ids: list[torch.Tensor | None]


def per_position(processor: LogitsProcessor, scores: torch.Tensor, prefixes: Prefixes) -> torch.Tensor:
    """``processor`` on ``[N, V]`` scores, each row with its own prefix: one call per group of rows
    whose prefixes have one length (a processor reads ``input_ids`` as ``[rows, length]``); one call
    per row for ``prefix_allowed_tokens_fn``, which is handed the row's batch id. Eager, host-driven:
    a run with such a processor is not compiled (``engine.run_hsd``)."""
    from transformers.generation.logits_process import PrefixConstrainedLogitsProcessor

    by_row = isinstance(processor, PrefixConstrainedLogitsProcessor)
    groups: dict[tuple[int, int], list[int]] = {}
    for n, ids in enumerate(prefixes.ids):
        if ids is not None:
            groups.setdefault((len(ids), prefixes.rows[n] if by_row else -1), []).append(n)
    out = scores.clone()
    for (_, row), members in groups.items():
        ids = torch.stack([prefixes.ids[n] for n in members]).to(scores.device)
        call = _bound_to_row(processor, row) if by_row else processor
        out[members] = call(ids, scores[members].clone())
    return out


def _bound_to_row(processor: LogitsProcessor, row: int) -> LogitsProcessor:
    """A copy of a ``PrefixConstrainedLogitsProcessor`` that hands its function ``row`` as the batch
    id of the one row it is called on (HF would number the row so in the whole batch)."""
    fn = processor._prefix_allowed_tokens_fn
    bound = copy.copy(processor)
    bound._prefix_allowed_tokens_fn = lambda _batch_id, sent: fn(row, sent)
    return bound
