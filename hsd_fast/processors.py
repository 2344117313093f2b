"""HF logits processors applied exactly at every level (docs/design.md, "Sampling transforms").

HSD is exact when every level applies the *same* transform to its logits. HF's prepared processors
are applied as they are (rebuilding them from kwargs would miss HF's default top-k of 50 under
``do_sample=True``), in HF's order, each by its kind:

- ``BATCHED``: processors that ignore the token history and the length, on ``[rows * positions, V]``;
- ``HISTORY``: the repetition penalty, the n-gram ban, bad words and sequence bias, as tensor
  operations over what each position's ``input_ids`` holds (``DecodeState.history_ids``);
- ``LENGTH``: ``min_new_tokens``, ``min_length``, ``begin_suppress_tokens``, ``forced_eos_token_id``,
  ``forced_bos_token_id`` and the exponential length decay, as tensor operations over each position's
  ``input_ids`` width (``DecodeState.lengths``);
- ``GENERAL``: any other (a user's own, ``prefix_allowed_tokens_fn``, top-h, the watermark, ...),
  called *per position* with the ``input_ids`` HF's unassisted ``generate`` would hand it there
  (``DecodeState.prefixes``): eager and host-driven, so such a run is not compiled.

The first three run inside the compiled steps (the ops: ``processor_ops.py``). Processors that keep a
model or a batch layout of their own (classifier-free guidance) are refused. ``generation_sampling``
asks HF itself for the processors a ``generate`` call would apply, so that profiling measures under
exactly what decoding will use. transformers is imported on first use: the engine holds a transform,
and ``import hsd_fast`` loads no transformers.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from hsd_fast import processor_ops as ops
from hsd_fast.layout import capacity_buffer
from hsd_fast.processor_ops import Prefixes

if TYPE_CHECKING:
    from transformers.generation.logits_process import LogitsProcessor

BATCHED, HISTORY, LENGTH, GENERAL = "batched", "history", "length", "general"
_KINDS = {
    BATCHED: (
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
    ),
    HISTORY: (
        "RepetitionPenaltyLogitsProcessor",
        "NoRepeatNGramLogitsProcessor",
        "SequenceBiasLogitsProcessor",
        "NoBadWordsLogitsProcessor",
    ),
    LENGTH: (
        "MinLengthLogitsProcessor",
        "MinNewTokensLengthLogitsProcessor",
        "SuppressTokensAtBeginLogitsProcessor",
        "ForcedEOSTokenLogitsProcessor",
        "ForcedBOSTokenLogitsProcessor",
        "ExponentialDecayLengthPenalty",
    ),
}
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
def _classes(kind: str) -> tuple[type, ...]:
    from transformers.generation import logits_process as lp

    return tuple(getattr(lp, n) for n in _KINDS[kind] if hasattr(lp, n))


def kind_of(processor: LogitsProcessor) -> str:
    """How the transform applies ``processor``: ``BATCHED``, ``HISTORY``, ``LENGTH`` (tensor operations
    inside the compiled steps) or ``GENERAL`` (per position, eager). By exact class: a subclass (a
    user's processor built on HF's) may read ``input_ids`` its own way, so it is called per position."""
    for kind in (BATCHED, HISTORY, LENGTH):
        if type(processor) in _classes(kind):
            return kind
    return GENERAL


class Lengths(NamedTuple):
    """What HF's length processors read at each of N positions."""

    width: torch.Tensor  # [N] int64 HF's input_ids.shape[-1] there: its padded prompt width + `new`
    new: torch.Tensor  # [N] int64 the row's new tokens before the one predicted there


class LengthTable(NamedTuple):
    """What a LENGTH processor's op reads besides the scores and the lengths, built once per run
    (``LogitsTransform.tables``). Its threshold is a tensor, an input of a compiled step rather than a
    constant of its graph: the thresholds follow the request (HF sets ``begin_index``, ``max_length``
    and ``regulation_start`` from its prompt width and length), so requests of other prompt widths and
    lengths share the step's graphs (``LENGTH_THRESHOLDS``)."""

    threshold: torch.Tensor  # [] int64: the width or count the processor compares against
    ids: torch.Tensor  # [V] bool: the ids it bans, forces or decays
    factors: torch.Tensor | None = None  # [size] fp32, the length decay's (``processor_ops.decay_factors``)


LENGTH_THRESHOLDS: dict[str, tuple[Callable[[Any], int], tuple[str, ...]]] = {
    "MinLengthLogitsProcessor": (lambda p: p.min_length, ("min_length",)),
    "MinNewTokensLengthLogitsProcessor": (
        lambda p: p.min_new_tokens,
        ("min_new_tokens", "prompt_length_to_skip"),
    ),
    "SuppressTokensAtBeginLogitsProcessor": (lambda p: p.begin_index, ("begin_index",)),
    "ForcedEOSTokenLogitsProcessor": (lambda p: p.max_length - 1, ("max_length",)),
    "ForcedBOSTokenLogitsProcessor": (lambda p: 1, ()),
    "ExponentialDecayLengthPenalty": (
        lambda p: p.regulation_start,
        ("regulation_start", "regulation_factor"),
    ),
}
"""Per LENGTH processor: the threshold its op compares each position's width (or new-token count)
against (``LengthTable.threshold``), and the settings that its ``LengthTable`` carries (or that its op
never reads: it counts new tokens from the run's own prompt lengths), left out of
``LogitsTransform.key``."""


class ProcessorInputs(NamedTuple):
    """What the transform's processors read besides the scores, for N positions; an entry is None
    when no processor of the transform needs it (``DecodeState.processor_inputs``)."""

    history: list[torch.Tensor] | None  # per history source: [N, K] int64 (processor_ops)
    lengths: Lengths | None
    prefixes: Prefixes | None  # for GENERAL processors
    tables: list[Any]  # per processor: what ``LogitsTransform.tables`` built for it, or None


class LogitsTransform:
    """Applies HF processors to ``[N, V]`` logits. When the only processor is a temperature, the
    transform is the identity and ``temperature`` carries it to the verification op (its fast path:
    raw logits in, the temperature fused).

    History processors read, at every call, the token ids each of the N positions' ``input_ids``
    holds (``ProcessorInputs.history``); ``input_ids`` and ``attention_mask`` are the request's
    left-padded prompt, from which ``prompt_history`` tells which padding ids HF's processor counts
    (it sees the padded ``input_ids``, the repetition penalty less the first ``prompt_ignore_length``
    columns of each row). Length processors read each position's ``input_ids`` width
    (``ProcessorInputs.lengths``), from ``prompt_widths``."""

    def __init__(
        self,
        processors: Sequence[LogitsProcessor] = (),
        *,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> None:
        self.temperature = 1.0
        self.processors = list(processors)
        self.prompt = None if input_ids is None else (input_ids, attention_mask)
        for processor in self.processors:
            why = _REFUSED.get(type(processor).__name__)
            if why:
                raise ValueError(f"hsd_fast cannot apply {type(processor).__name__} at every level: {why}")
        if len(self.processors) == 1 and type(self.processors[0]).__name__ == "TemperatureLogitsWarper":
            self.temperature = float(self.processors.pop().temperature)
        self.kinds = [kind_of(p) for p in self.processors]
        # a temperature among other processors stays in the chain (the logits come out processed)
        temperatures = [p for p in self.processors if type(p).__name__ == "TemperatureLogitsWarper"]
        self.inner_temperature = float(temperatures[0].temperature) if temperatures else 1.0
        # indices into ``processors`` of each kind, in HF's order
        self.history = tuple(i for i, k in enumerate(self.kinds) if k == HISTORY)
        self.length = tuple(i for i, k in enumerate(self.kinds) if k == LENGTH)
        self.general = tuple(i for i, k in enumerate(self.kinds) if k == GENERAL)
        for i in self.history:
            _check_history_processor(self.processors[i])
        # Which history each history processor reads (an index into ``prompt_history``): every one
        # that counts all the pads (the n-gram ban, bad words, sequence bias) reads the same ids,
        # built and compacted once per step; a penalty with its own prompt_ignore_length, its own
        ignores = [getattr(self.processors[i], "prompt_ignore_length", None) for i in self.history]
        keys = [-1 if ignore is None else i for i, ignore in zip(self.history, ignores, strict=True)]
        distinct = list(dict.fromkeys(keys))
        self.history_sources = tuple(distinct.index(k) for k in keys)
        self.source_readers = tuple(self.history[keys.index(k)] for k in distinct)  # one per source

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
        """Whether a call needs ``lengths`` (a processor reads the ``input_ids`` width)."""
        return bool(self.length)

    def prompt_padding(self, prompts: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Per row, ``[P_r]`` int64 on the host: the ids of the padding HF's ``input_ids`` put before
        the row's prompt (none without a padded prompt: a direct ``run_hsd`` call)."""
        if self.prompt is None:
            return [torch.zeros(0, dtype=torch.int64) for _ in prompts]
        ids = self.prompt[0].cpu().long()
        return [ids[r, : ids.shape[1] - p.numel()] for r, p in enumerate(prompts)]

    def prompt_widths(self, prompt_lengths: torch.Tensor) -> torch.Tensor:
        """[B] int64: the width of HF's ``input_ids`` before the first new token: the request's padded
        prompt width, or, with no padded prompt (a direct ``run_hsd`` call), each row's own prompt
        length (as if generated alone). ``prompt_lengths``: [B] int64."""
        if self.prompt is None:
            return prompt_lengths.clone()
        return torch.full_like(prompt_lengths, self.prompt[0].shape[1])

    def tables(self, vocab: int, size: int, device: torch.device) -> list[Any]:
        """Per processor, what its op needs built once per run (None for most): a sequence bias's
        ``SequenceBiasTable``, a length processor's ``LengthTable`` (its threshold, the ids it bans or
        forces, and for the length decay ``decay_factors`` for ``size`` widths past its start)."""
        out: list[Any] = []
        for processor, kind in zip(self.processors, self.kinds, strict=True):
            name = type(processor).__name__
            if name in ("SequenceBiasLogitsProcessor", "NoBadWordsLogitsProcessor"):
                # transformers 5.17's processor matches one sequence at a time (no grouped tables)
                per_sequence = not hasattr(processor, "multi_token_biases")
                out.append(ops.sequence_bias_table(processor.sequence_bias, vocab, device, per_sequence))
            elif kind != LENGTH:
                out.append(None)
            else:
                threshold = LENGTH_THRESHOLDS[name][0](processor)
                threshold = torch.tensor(threshold, dtype=torch.int64, device=device)
                ids, factors = self._length_ids_and_factors(processor, vocab, size, device)
                out.append(LengthTable(threshold, ids, factors))
        return out

    @staticmethod
    def _length_ids_and_factors(
        processor: LogitsProcessor, vocab: int, size: int, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        name = type(processor).__name__
        if name == "SuppressTokensAtBeginLogitsProcessor":
            return ops.id_mask(processor.begin_suppress_tokens, vocab, device), None
        if name == "ForcedBOSTokenLogitsProcessor":
            return ops.id_mask(processor.bos_token_id, vocab, device), None
        eos = ops.id_mask(processor.eos_token_id, vocab, device)
        if name != "ExponentialDecayLengthPenalty":  # min length, min new tokens, forced EOS
            return eos, None
        factors = ops.decay_factors(processor.regulation_factor, size)
        return eos, capacity_buffer(factors.to(device), 0)  # [size]: as long as the token buffer

    def __call__(self, logits: torch.Tensor, inputs: ProcessorInputs | None = None) -> torch.Tensor:
        """[N, V] -> [N, V]. ``inputs``: what the history, length and per-position processors read at
        each of the N positions (``DecodeState.processor_inputs``). None skips those processors: only
        for teacher-forced profiling scores, which have no run's history (an approximation there)."""
        if not self.processors:
            return logits
        dummy_ids = torch.zeros(logits.shape[0], 1, dtype=torch.int64, device=logits.device)
        scores = logits.float()  # HF's warpers expect float scores; -inf marks removed tokens
        compacted: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # per history source, once
        for i, (processor, kind) in enumerate(zip(self.processors, self.kinds, strict=True)):
            if kind == BATCHED:
                scores = processor(dummy_ids, scores)
            elif inputs is None:
                continue
            elif kind == HISTORY:
                source = self.history_sources[self.history.index(i)]
                history = inputs.history[source]
                if type(processor).__name__ == "RepetitionPenaltyLogitsProcessor":
                    scores = ops.repetition_penalty(scores, history, processor.penalty)
                    continue
                if source not in compacted:
                    compacted[source] = ops.compact(history, scores.shape[1])
                scores = _ordered_history_op(processor, scores, *compacted[source], inputs.tables[i])
            elif kind == LENGTH:
                scores = _length_op(processor, scores, inputs.lengths, inputs.tables[i])
            else:
                scores = ops.per_position(processor, scores, inputs.prefixes)
        return scores

    def prompt_history(
        self, num_rows: int, vocab: int, device: torch.device
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per history source (``history_sources``): ``[B, P]`` int64, the ids of each row's left
        padding that HF's processor counts (``vocab`` where it counts none), and ``[B]`` int64, the
        first position of the row's unpadded tokens it counts. HF's processor sees the padded
        ``input_ids`` and drops the first ``prompt_ignore_length`` columns of each row: transformers
        5.24 sets that to the row's padding (so no pad counts); a processor without it counts every
        pad, and then a row's output depends on the padding its batch gives it. One host pass per
        request."""
        out = []
        for i in self.source_readers:
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
            out.append(
                (_static_width(padding, counted, vocab).to(device), (ignore - pads).clamp(min=0).to(device))
            )
        return out

    @property
    def key(self) -> str:
        """Names the transform (processor classes and settings): a cache key for profiles measured
        under it (``"identity"`` for no transform)."""
        parts = [f"temperature={self.temperature:g}"] if self.temperature != 1.0 else []
        parts += [_describe(p) for p in self.processors]
        return " ".join(parts) or "identity"


def _static_width(padding: torch.Tensor, counted: torch.Tensor, vocab: int) -> torch.Tensor:
    """``padding`` [B, P] cut to the columns up to the last counted pad and widened with holes (V) to
    a power of two (0 where no pad counts: unpadded batches, transformers 5.24's penalty). Compiled
    steps are built for this width (``DecodeState.structure``), so requests of other prompt widths
    share their graphs: a new width would make dynamo recompile inside a step, silently."""
    used = int(counted.any(0).nonzero().max()) + 1 if counted.any() else 0
    width = 0 if used == 0 else 1 << (used - 1).bit_length()
    padding = padding[:, :used]
    return torch.nn.functional.pad(padding, (0, width - used), value=vocab)


def _ordered_history_op(
    processor: LogitsProcessor, scores: torch.Tensor, ids: torch.Tensor, length: torch.Tensor, table: Any
) -> torch.Tensor:
    """A HISTORY processor that reads the history in order (the n-gram ban, bad words, sequence bias)
    on ``[N, V]`` scores, given each position's compacted ids ``[N, K]`` and lengths ``[N]``."""
    if type(processor).__name__ == "NoRepeatNGramLogitsProcessor":
        return ops.no_repeat_ngram(scores, ids, length, processor.ngram_size)
    return ops.sequence_bias(scores, ids, length, table)  # bad words: a bias of -inf


def _length_op(
    processor: LogitsProcessor, scores: torch.Tensor, lengths: Lengths, table: LengthTable
) -> torch.Tensor:
    """A LENGTH processor on ``[N, V]`` scores given each position's ``input_ids`` width, as HF's
    compares it with its threshold (``table``, from ``LogitsTransform.tables``)."""
    name, width, threshold = type(processor).__name__, lengths.width, table.threshold
    if name == "MinLengthLogitsProcessor":
        return ops.ban(scores, width < threshold, table.ids)
    if name == "MinNewTokensLengthLogitsProcessor":  # HF counts past its prompt_length_to_skip, which
        return ops.ban(scores, lengths.new < threshold, table.ids)  # is the padded width
    if name == "SuppressTokensAtBeginLogitsProcessor":
        return ops.ban(scores, width == threshold, table.ids)
    if name in ("ForcedEOSTokenLogitsProcessor", "ForcedBOSTokenLogitsProcessor"):
        return ops.force(scores, width == threshold, table.ids)
    return ops.length_decay(scores, width, threshold, table.factors, table.ids)  # the length decay


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
    """The processor's class and scalar settings; for a sequence bias, how many sequences of each
    length (its table's shapes: a compiled step is built for them, its ids and biases are inputs)."""
    # HF's lazy state, and the length thresholds, which are the steps' inputs (LengthTable)
    out_of_key = ("prepared_bias_variables", *LENGTH_THRESHOLDS.get(type(processor).__name__, (0, ()))[1])
    settings = {
        k: v
        for k, v in sorted(vars(processor).items())
        if isinstance(v, (int, float, str, bool)) and k not in out_of_key
    }
    biased = getattr(processor, "sequence_bias", None)
    if isinstance(biased, dict):
        lengths = sorted(len(sequence) for sequence in biased)
        settings["sequences"] = "+".join(f"{lengths.count(n)}x{n}" for n in sorted(set(lengths)))
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
