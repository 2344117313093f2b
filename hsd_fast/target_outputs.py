"""The target's scores and raw logits at every token it emits: HF's ``output_scores`` and
``output_logits`` (docs/design.md, "Scores and logits").

Every committed token is emitted by the target: drawn by it when nothing drafts, or accepted,
corrected or added as the bonus when it verifies. The step that emits it has the target's logits at
that position in hand, so keeping them costs one indexed write per step and no extra forward.
Buffers are ``[B, N + 1, V]`` fp32 indexed by new-token number (0 the first), slot N the trash slot
for everything not kept (a bonus past the length budget, columns of rows sitting out).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hsd_fast.buffer_pool import POOL


@dataclass(frozen=True)
class OutputRequest:
    """Which of the target's per-token distributions a run returns."""

    scores: bool = False  # processed, as HF's ``output_scores`` (temperature and processors applied)
    logits: bool = False  # raw, as HF's ``output_logits``

    def __bool__(self) -> bool:
        return self.scores or self.logits


NO_OUTPUTS = OutputRequest()


class TargetOutputs:
    """The kept scores and logits of one run."""

    def __init__(
        self,
        request: OutputRequest,
        prompt_lengths: torch.Tensor,
        max_new: int,
        vocab: int,
        temperature: float,
    ) -> None:
        shape = (len(prompt_lengths), max_new + 1, vocab)  # [B, N + 1, V]
        device = prompt_lengths.device
        self.scores = POOL.zeros(self, shape, torch.float32, device) if request.scores else None
        self.logits = POOL.zeros(self, shape, torch.float32, device) if request.logits else None
        self.prompt_lengths, self.max_new, self.temperature = prompt_lengths, max_new, temperature

    def keep(
        self,
        positions: torch.Tensor,  # [B, C] int64 the position of the token each column's logits are for
        kept: torch.Tensor,  # [B, C] bool: the target emitted that token
        processed: torch.Tensor,  # [B, C, V] the target's processed logits (temperature not applied)
        raw: torch.Tensor,  # [B, C, V] its raw logits
    ) -> None:
        new = positions - self.prompt_lengths[:, None]  # [B, C] new-token numbers
        index = torch.where(kept & (new >= 0) & (new < self.max_new), new, self.max_new)
        rows = torch.arange(len(positions), device=positions.device)[:, None]  # [B, 1]
        if self.scores is not None:  # HF's scores carry the temperature the verification fuses
            self.scores[rows, index] = processed.float() / self.temperature
        if self.logits is not None:
            self.logits[rows, index] = raw.float()

    def per_step(self, num_new: list[int], pad_id: int) -> tuple[tuple | None, tuple | None]:
        """HF's tuples: one ``[B, V]`` per generation step, as many as the longest row has tokens.
        A row that stopped earlier gets, at the steps past its end, a point mass on the pad id (the
        token HF appends there; HF's own values there are the target's scores after its pads, which
        this run never computed)."""
        steps = max(num_new, default=0)
        done = (
            torch.arange(steps, device=self.prompt_lengths.device)[None]
            >= torch.tensor(num_new, device=self.prompt_lengths.device)[:, None]
        )  # [B, steps]
        out = []
        for buffer in (self.scores, self.logits):
            if buffer is None:
                out.append(None)
                continue
            values = buffer[:, :steps].clone()  # [B, steps, V]
            pad = torch.full_like(values[0, 0], float("-inf"))
            pad[pad_id] = 0.0
            values[done] = pad
            out.append(tuple(values[:, j] for j in range(steps)))
        return out[0], out[1]
