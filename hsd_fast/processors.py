"""HF logits processors applied exactly at every level (DESIGN.md §2: one sampling transform for all).

HSD is exact when every level applies the *same* transform to its logits. HF's prepared processors
are applied as they are (FACTS.md: rebuilding them from kwargs misses the default top-k of 50), batched
over ``[rows * positions, V]``, which is only right for processors that ignore the token history and
the length. Those are allow-listed; anything else is refused with an error naming the supported ones.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers.generation import logits_process as lp

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
SUPPORTED_PROCESSORS = tuple(getattr(lp, n) for n in _POSITION_INDEPENDENT if hasattr(lp, n))


class LogitsTransform:
    """Applies HF processors to ``[N, V]`` logits. When the only processor is a temperature, the
    transform is the identity and ``temperature`` carries it to the verification op (its fast path:
    raw logits in, the temperature fused)."""

    def __init__(self, processors: Sequence[lp.LogitsProcessor] = ()) -> None:
        unsupported = [type(p).__name__ for p in processors if not isinstance(p, SUPPORTED_PROCESSORS)]
        if unsupported:
            names = ", ".join(t.__name__ for t in SUPPORTED_PROCESSORS)
            raise ValueError(
                f"hsd_fast cannot apply {unsupported} exactly at every level (they depend on the "
                f"token history or the length). Supported logits processors: {names}."
            )
        self.temperature = 1.0
        self.processors = list(processors)
        if len(self.processors) == 1 and isinstance(self.processors[0], lp.TemperatureLogitsWarper):
            self.temperature = float(self.processors.pop().temperature)

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:  # [N, V] -> [N, V]
        if not self.processors:
            return logits
        dummy_ids = torch.zeros(logits.shape[0], 1, dtype=torch.int64, device=logits.device)
        scores = logits.float()  # HF's warpers expect float scores; -inf marks removed tokens
        for processor in self.processors:
            scores = processor(dummy_ids, scores)
        return scores
