"""HF logits processors applied exactly at every level (docs/design.md, "Sampling transforms").

HSD is exact when every level applies the *same* transform to its logits. HF's prepared processors
are applied as they are (rebuilding them from kwargs would miss HF's default top-k of 50 under
``do_sample=True``), in HF's order, three ways:

- processors that ignore the token history and the length, batched over ``[rows * positions, V]``;
- the repetition penalty and the n-gram ban (*history* processors) and the length processors
  (``min_new_tokens``, ``min_length``) as tensor operations over what each position's history holds
  or how many new tokens precede it (``DecodeState.history_ids``, ``DecodeState.length_bans``);
- any other (bad words, sequence bias, a user's own, ``prefix_allowed_tokens_fn``, ...),
  called *per position* with the ``input_ids`` HF's unassisted ``generate`` would hand it there
  (``DecodeState.prefixes``): eager and host-driven, so such a run is not compiled.

The first two run inside the compiled steps. Processors that keep a model or a batch layout of their
own (classifier-free guidance) are refused. ``generation_sampling`` asks HF itself for the processors
a ``generate`` call would apply, so that profiling measures under exactly what decoding will use.
transformers is imported on first use: the engine holds a transform, and ``import hsd_fast`` loads
no transformers.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

if TYPE_CHECKING:
    from transformers.generation.logits_process import LogitsProcessor

_POSITION_INDEPENDENT = (
    "TemperatureLogitsWarper",
    "TopKLogitsWarper",
    "TopPLogitsWarper",
    "MinPLogitsWarper",
    "TypicalLogitsWarper",
    "EpsilonLogitsWarper",
    "EtaLogitsWarper",
    "SuppressTokensLogitsProcessor",
    "LogitNormalization",
    "InfNanRemoveLogitsProcessor",
)
_HISTORY = (  # read the token history: ``history`` at every call
    "RepetitionPenaltyLogitsProcessor",
    "NoRepeatNGramLogitsProcessor",
)
_LENGTH = ("MinLengthLogitsProcessor", "MinNewTokensLengthLogitsProcessor")  # ban EOS until a length
_REFUSED = {  # processors that keep a model or a batch layout of their own
    "ClassifierFreeGuidanceLogitsProcessor": "classifier-free guidance needs a doubled batch",
    "UnbatchedClassifierFreeGuidanceLogitsProcessor": "classifier-free guidance runs its own K/V cache",
    "DiaClassifierFreeGuidanceLogitsProcessor": "classifier-free guidance needs a doubled batch",
    "EncoderRepetitionPenaltyLogitsProcessor": "it holds the prompt per batch row as an encoder input "
    "(hsd_fast serves decoder-only models: use repetition_penalty)",
    "EncoderNoRepeatNGramLogitsProcessor": "it holds the prompt's n-grams per batch row as an encoder "
    "input (hsd_fast serves decoder-only models: use no_repeat_ngram_size)",
    "SynthIDTextWatermarkLogitsProcessor": "it keeps per-row state from one call to the next",
}


@functools.cache
def supported_processors() -> tuple[type, ...]:
    """The processor classes applied at every level as tensor operations inside the (compiled) steps
    (those of the installed transformers); any other is called per position (``per_position``)."""
    from transformers.generation import logits_process as lp

    return tuple(getattr(lp, n) for n in (*_POSITION_INDEPENDENT, *_HISTORY, *_LENGTH) if hasattr(lp, n))


@functools.cache
def history_processors() -> tuple[type, ...]:
    """The supported processor classes that read the token history (``DecodeState.history_ids``)."""
    from transformers.generation import logits_process as lp

    return tuple(getattr(lp, n) for n in _HISTORY if hasattr(lp, n))


@functools.cache
def length_processors() -> tuple[type, ...]:
    """The supported processor classes that ban EOS before a length (``DecodeState.length_bans``)."""
    from transformers.generation import logits_process as lp

    return tuple(getattr(lp, n) for n in _LENGTH if hasattr(lp, n))


class LogitsTransform:
    """Applies HF processors to ``[N, V]`` logits. When the only processor is a temperature, the
    transform is the identity and ``temperature`` carries it to the verification op (its fast path:
    raw logits in, the temperature fused).

    A history processor (the repetition penalty) needs, at every call, the token ids each of the N
    rows' history holds (``history``); ``input_ids`` and ``attention_mask`` are the request's
    left-padded prompt, from which ``prompt_history`` tells which padding ids HF's processor counts
    (it sees the padded ``input_ids``, less the first ``prompt_ignore_length`` columns of each row).

    A length processor (``min_length``, ``min_new_tokens``) bans the EOS ids where the token a row
    predicts would come too early: the caller hands it, per such processor, ``[N]`` bool ``bans``
    (``DecodeState.length_bans``, from each column's position and ``length_floors``)."""

    def __init__(
        self,
        processors: Sequence[LogitsProcessor] = (),
        *,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> None:
        self.temperature = 1.0
        self.processors = list(processors)
        self.history: tuple[int, ...] = ()  # indices of the history processors in ``processors``
        self.length: tuple[int, ...] = ()  # ...and of the length processors
        self.general: tuple[int, ...] = ()  # ...and of any other: called per position (eager)
        self.prompt = None if input_ids is None else (input_ids, attention_mask)
        if not self.processors:
            return
        from transformers.generation.logits_process import TemperatureLogitsWarper

        refused = [
            (type(p).__name__, _REFUSED[type(p).__name__]) for p in processors if type(p).__name__ in _REFUSED
        ]
        if refused:
            raise ValueError(f"hsd_fast cannot apply {refused[0][0]} at every level: {refused[0][1]}")
        self.general = tuple(
            i for i, p in enumerate(self.processors) if not isinstance(p, supported_processors())
        )
        self.history = tuple(i for i, p in enumerate(self.processors) if isinstance(p, history_processors()))
        for i in self.history:
            _check_history_processor(self.processors[i])
        self.length = tuple(i for i, p in enumerate(self.processors) if isinstance(p, length_processors()))
        if len(self.processors) == 1 and isinstance(self.processors[0], TemperatureLogitsWarper):
            self.temperature = float(self.processors.pop().temperature)

    @property
    def needs_history(self) -> bool:
        """Whether a call needs ``history`` (a processor reads the token history)."""
        return bool(self.history)

    @property
    def needs_prefixes(self) -> bool:
        """Whether a call needs ``prefixes`` (a processor is called per position: the run is eager)."""
        return bool(self.general)

    @property
    def needs_lengths(self) -> bool:
        """Whether a call needs ``bans`` (a processor bans EOS before a length)."""
        return bool(self.length)

    def prompt_padding(self, prompts: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Per row, ``[P_r]`` int64 on the host: the ids of the padding HF's ``input_ids`` put before
        the row's prompt (none without a padded prompt: a direct ``run_hsd`` call)."""
        if self.prompt is None:
            return [torch.zeros(0, dtype=torch.int64) for _ in prompts]
        ids = self.prompt[0].cpu().long()
        return [ids[r, : ids.shape[1] - p.numel()] for r, p in enumerate(prompts)]

    def length_floors(self, prompt_lengths: torch.Tensor) -> list[torch.Tensor]:
        """Per length processor, ``[B]`` int64: how many new tokens a row has before EOS may come.
        HF's ``min_new_tokens`` counts new tokens; its ``min_length`` counts the columns of the padded
        ``input_ids`` (the request's prompt width plus the new tokens; with no padded prompt, each
        row's own prompt length: as if it were generated alone). ``prompt_lengths``: [B] int64."""
        from transformers.generation.logits_process import MinNewTokensLengthLogitsProcessor

        width = (
            prompt_lengths
            if self.prompt is None
            else torch.full_like(prompt_lengths, self.prompt[0].shape[1])
        )
        floors = []
        for i in self.length:
            processor = self.processors[i]
            if isinstance(processor, MinNewTokensLengthLogitsProcessor):
                floors.append(torch.full_like(prompt_lengths, processor.min_new_tokens))
            else:
                floors.append(processor.min_length - width)
        return floors

    def __call__(
        self,
        logits: torch.Tensor,
        history: Sequence[torch.Tensor] | None = None,
        bans: Sequence[torch.Tensor] | None = None,
        prefixes: Prefixes | None = None,
    ) -> torch.Tensor:
        """[N, V] -> [N, V]. ``history``: per history processor (in ``self.history`` order),
        ``[N, K]`` int64, the ids row n's history holds, V where an entry holds none
        (``DecodeState.history_ids``). ``bans``: per length processor, ``[N]`` bool, the rows whose
        EOS ids it bans (``DecodeState.length_bans``). ``prefixes``: each row's ``input_ids`` as HF's
        unassisted ``generate`` would hand a processor there (``DecodeState.prefixes``), for the
        processors called per position. None skips those processors: only for teacher-forced
        profiling scores, which have no run's history (an approximation there)."""
        if not self.processors:
            return logits
        dummy_ids = torch.zeros(logits.shape[0], 1, dtype=torch.int64, device=logits.device)
        scores = logits.float()  # HF's warpers expect float scores; -inf marks removed tokens
        for i, processor in enumerate(self.processors):  # in HF's order, each the way it needs
            if i in self.general:
                if prefixes is not None:
                    scores = per_position(processor, scores, prefixes)
            elif i in self.history:
                if history is not None:
                    ids = history[self.history.index(i)]
                    if hasattr(processor, "ngram_size"):
                        scores = no_repeat_ngram(scores, ids, processor.ngram_size)
                    else:
                        scores = repetition_penalty(scores, ids, processor.penalty)
            elif i in self.length:
                if bans is not None:
                    scores = ban_eos(scores, bans[self.length.index(i)], processor.eos_token_id)
            else:
                scores = processor(dummy_ids, scores)
        return scores

    def prompt_history(
        self, num_rows: int, vocab: int, device: torch.device
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per history processor: ``[B, P]`` int64, the ids of each row's left padding that HF's
        processor counts (``vocab`` where it counts none), and ``[B]`` int64, the first position of
        the row's unpadded tokens it counts. HF's processor sees the padded ``input_ids`` and drops
        the first ``prompt_ignore_length`` columns of each row: transformers 5.24 sets that to the
        row's padding (so no pad counts); a processor without it counts every pad, and then a row's
        output depends on the padding its batch gives it. One host pass per request."""
        out = []
        for i in self.history:
            ignore = getattr(self.processors[i], "prompt_ignore_length", None)  # the n-gram ban: none
            if self.prompt is None:  # no padded prompt: rows start at column 0, nothing padded
                ids = torch.zeros(num_rows, 0, dtype=torch.int64)
                pads = torch.zeros(num_rows, dtype=torch.int64)
            else:
                ids = self.prompt[0].cpu().long()
                mask = self.prompt[1]
                pads = torch.zeros(len(ids), dtype=torch.int64) if mask is None else (mask.cpu() == 0).sum(1)
            if len(ids) != num_rows:
                raise ValueError(f"the prompt has {len(ids)} rows, the run {num_rows}")
            if ignore is None or (self.prompt is None and isinstance(ignore, torch.Tensor)):
                # no prompt given (profiling runs, unpadded): HF's per-row padding of the prompt it
                # was prepared for (``generation_sampling``'s dummy) says nothing about the run's
                ignore = torch.zeros(num_rows, dtype=torch.int64)
            elif isinstance(ignore, int):
                ignore = torch.full((num_rows,), ignore, dtype=torch.int64)
            else:
                ignore = ignore.cpu().long()
                if ignore.shape != (num_rows,):
                    raise ValueError(
                        f"RepetitionPenaltyLogitsProcessor.prompt_ignore_length has {tuple(ignore.shape)} "
                        f"entries, the batch {num_rows} rows"
                    )
            columns = torch.arange(ids.shape[1])  # [P] padded columns
            counted = (columns < pads[:, None]) & (columns >= ignore[:, None])  # [B, P] pads HF counts
            padding = torch.where(counted, ids.clamp(0, vocab), vocab)  # HF drops ids past the vocabulary
            out.append((padding.to(device), (ignore - pads).clamp(min=0).to(device)))
        return out

    @property
    def key(self) -> str:
        """Names the transform (processor classes and settings): a cache key for profiles measured
        under it (``"identity"`` for no transform)."""
        parts = [f"temperature={self.temperature:g}"] if self.temperature != 1.0 else []
        parts += [_describe(p) for p in self.processors]
        return " ".join(parts) or "identity"


def repetition_penalty(scores: torch.Tensor, ids: torch.Tensor, penalty: float) -> torch.Tensor:
    """HF's ``RepetitionPenaltyLogitsProcessor`` on ``[N, V]`` fp32 scores, given ``ids`` ``[N, K]``
    (the ids each row's history holds, V for none): each such id's score divided by ``penalty`` where
    it is >= 0, multiplied where it is negative, once however often it occurs. HF's own gather and
    scatter (an id held twice writes the same value twice), on ``N * K`` entries rather than
    ``N * V`` (a masked pass over the vocabulary costs several times more)."""
    padded = torch.nn.functional.pad(scores, (0, 1))  # column V absorbs the entries that hold no id
    held = padded.gather(1, ids)  # [N, K]
    penalized = torch.where(held < 0, held * penalty, held / penalty)
    return padded.scatter(1, ids, penalized)[:, : scores.shape[1]]


def no_repeat_ngram(scores: torch.Tensor, ids: torch.Tensor, n: int) -> torch.Tensor:
    """HF's ``NoRepeatNGramLogitsProcessor`` on ``[N, V]`` scores, given ``ids`` ``[N, K]`` (each
    row's history in order, V where an entry holds none; holes can stand between its parts): every
    token that would complete an n-gram the history already holds gets -inf. The holes are moved
    to the end first (a stable sort keeps the order), so an n-gram across two parts (a tree's chain
    and its ancestors) is seen; a window holding a hole never matches the tail. Static shapes: it
    compiles with the step."""
    vocab = scores.shape[1]
    order = torch.sort((ids == vocab).to(torch.int8), dim=1, stable=True).indices
    history = ids.gather(1, order)  # [N, K] the history, then the holes
    length = (history != vocab).sum(1)  # [N]
    if n == 1:  # every token seen is banned
        return torch.nn.functional.pad(scores, (0, 1)).scatter(1, history, float("-inf"))[:, :vocab]
    at = (length[:, None] - (n - 1) + torch.arange(n - 1, device=ids.device)).clamp(min=0)  # [N, n - 1]
    tail = history.gather(1, at)  # [N, n - 1] the last n - 1 tokens
    windows = history.unfold(1, n, 1)  # [N, K - n + 1, n]
    start = torch.arange(windows.shape[1], device=ids.device)
    match = (windows[..., :-1] == tail[:, None]).all(-1) & (start + n <= length[:, None])  # [N, K - n + 1]
    match &= (length >= n - 1)[:, None]
    banned = torch.where(match, windows[..., -1], vocab)  # [N, K - n + 1]: V absorbs the rest
    return torch.nn.functional.pad(scores, (0, 1)).scatter(1, banned, float("-inf"))[:, :vocab]


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


def ban_eos(scores: torch.Tensor, banned: torch.Tensor, eos_token_id: torch.Tensor | int) -> torch.Tensor:
    """HF's length processors on ``[N, V]`` scores: the EOS ids' scores -inf in the ``banned`` rows
    (``[N]`` bool), the rest as it is."""
    eos = torch.as_tensor(eos_token_id, device=scores.device).reshape(-1)
    is_eos = torch.zeros(scores.shape[1] + 1, dtype=torch.bool, device=scores.device)
    is_eos = is_eos.index_fill(0, eos.clamp(0, scores.shape[1]), True)[: scores.shape[1]]  # [V]
    return scores.masked_fill(banned[:, None] & is_eos[None, :], float("-inf"))


def _check_history_processor(processor: LogitsProcessor) -> None:
    """A repetition penalty hsd_fast applies as HF would: no continuous-batching state set."""
    if (
        getattr(processor, "logits_indices", None) is not None
        or getattr(processor, "cu_seq_lens_q", None) is not None
    ):
        raise ValueError(
            "hsd_fast cannot apply a RepetitionPenaltyLogitsProcessor set up for continuous batching "
            "(logits_indices / cu_seq_lens_q)"
        )


def _describe(processor: LogitsProcessor) -> str:
    settings = {k: v for k, v in sorted(vars(processor).items()) if isinstance(v, (int, float, str, bool))}
    return type(processor).__name__ + "(" + ",".join(f"{k}={v}" for k, v in settings.items()) + ")"


class _Captured(Exception):
    def __init__(self, processors: Sequence[LogitsProcessor] | None, do_sample: bool) -> None:
        self.processors, self.do_sample = processors, do_sample


def _capture(model, input_ids, logits_processor=None, generation_config=None, **kwargs):
    """A ``custom_generate`` that only looks at what HF prepared, then stops the call."""
    raise _Captured(logits_processor, bool(getattr(generation_config, "do_sample", False)))


def generation_sampling(model: torch.nn.Module, **generation_kwargs: Any) -> tuple[LogitsTransform, bool]:
    """(the transform, greedy?) that ``model.generate(..., **generation_kwargs)`` would apply at every
    level, from what HF itself prepares (the model's generation-config defaults included), so that
    profiles are measured under what decoding will use."""
    ids = torch.zeros(1, 1, dtype=torch.int64, device=next(model.parameters()).device)
    try:
        model.generate(ids, custom_generate=_capture, max_new_tokens=1, **generation_kwargs)
    except _Captured as captured:
        return LogitsTransform(list(captured.processors or [])), not captured.do_sample
    raise RuntimeError("transformers did not call the custom generate function")  # pragma: no cover
