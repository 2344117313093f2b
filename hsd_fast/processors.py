"""HF logits processors applied exactly at every level (docs/design.md, "Sampling transforms").

HSD is exact when every level applies the *same* transform to its logits. HF's prepared processors
are applied as they are (rebuilding them from kwargs would miss HF's default top-k of 50 under
``do_sample=True``), batched over ``[rows * positions, V]``, which is only right for processors that
ignore the token history and the length. Those are allow-listed; anything else is refused with an
error naming the supported ones. ``generation_sampling`` asks HF itself for the processors a
``generate`` call would apply, so that profiling measures under exactly what decoding will use.
transformers is imported on first use: the engine holds a transform, and ``import hsd_fast`` loads
no transformers.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

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
)


@functools.cache
def supported_processors() -> tuple[type, ...]:
    """The processor classes applied at every level (those of the installed transformers)."""
    from transformers.generation import logits_process as lp

    return tuple(getattr(lp, n) for n in _POSITION_INDEPENDENT if hasattr(lp, n))


class LogitsTransform:
    """Applies HF processors to ``[N, V]`` logits. When the only processor is a temperature, the
    transform is the identity and ``temperature`` carries it to the verification op (its fast path:
    raw logits in, the temperature fused)."""

    def __init__(self, processors: Sequence[LogitsProcessor] = ()) -> None:
        self.temperature = 1.0
        self.processors = list(processors)
        if not self.processors:
            return
        from transformers.generation.logits_process import TemperatureLogitsWarper

        supported = supported_processors()
        unsupported = [type(p).__name__ for p in processors if not isinstance(p, supported)]
        if unsupported:
            names = ", ".join(t.__name__ for t in supported)
            raise ValueError(
                f"hsd_fast cannot apply {unsupported} exactly at every level (they depend on the "
                f"token history or the length). Supported logits processors: {names}."
            )
        if len(self.processors) == 1 and isinstance(self.processors[0], TemperatureLogitsWarper):
            self.temperature = float(self.processors.pop().temperature)

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:  # [N, V] -> [N, V]
        if not self.processors:
            return logits
        dummy_ids = torch.zeros(logits.shape[0], 1, dtype=torch.int64, device=logits.device)
        scores = logits.float()  # HF's warpers expect float scores; -inf marks removed tokens
        for processor in self.processors:
            scores = processor(dummy_ids, scores)
        return scores

    @property
    def key(self) -> str:
        """Names the transform (processor classes and settings): a cache key for profiles measured
        under it (``"identity"`` for no transform)."""
        parts = [f"temperature={self.temperature:g}"] if self.temperature != 1.0 else []
        parts += [_describe(p) for p in self.processors]
        return " ".join(parts) or "identity"


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
