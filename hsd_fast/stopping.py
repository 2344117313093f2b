"""Stopping criteria replayed on committed tokens, as HF's unassisted ``generate`` calls them.

HF's sampling loop appends one token to every row, then calls its ``StoppingCriteriaList`` with the
whole batch's ``input_ids`` (left padding, prompt and every token so far: ``[B, L + n]`` at step
``n``) and ``scores`` (None unless ``output_scores``), and marks the rows it returns True for as
finished; with an EOS criterion in the list, a finished row's next tokens are the pad id, else it
keeps its real tokens until every row is finished. The engine commits several tokens per row at once,
rows at their own pace, so a ``StopChecker`` replays them one step at a time: step ``n`` runs once
every row that still needs tokens has committed ``n`` (rows ahead wait for it, and what they decoded
past a stop is cut). Per row it says how much of the output is kept (``limits``), and which rows the
criteria stopped; the engine holds those rows and cuts them there, as it cuts a row at its EOS
(docs/design.md, "EOS, the length budget and flushing"). No checker is built when the criteria are
only the length budget and EOS, which the ledger applies itself.

The criteria get ``scores=None``, which is what HF's loop passes them without ``output_scores``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

Criteria = Callable[[torch.Tensor, None], torch.Tensor]
"""HF's ``StoppingCriteriaList`` (or any callable of that shape): ``(input_ids [B, L + n], scores)``
to a ``[B]`` bool tensor, True where the row stops."""


class StopChecker:
    """``criteria`` replayed over a run's committed tokens (``advance`` after each commit of the
    target), given the padded prompt ``input_ids`` ``[B, L]`` HF's loop starts from, each row's
    prompt length without padding, the pad id and the length budget. ``pads_finished``: a stopped
    row's later tokens are the pad id (HF does this when the criteria hold an EOS criterion: an
    object with ``eos_token_id``); otherwise every row runs, with its own tokens, until all stop."""

    def __init__(
        self,
        criteria: Criteria,
        input_ids: torch.Tensor,  # [B, L] left padded, as the caller gave it
        prompt_lens: Sequence[int],
        pad_id: int,
        max_new_tokens: int,
        pads_finished: bool,
    ) -> None:
        rows, width = input_ids.shape
        self.criteria, self.width, self.pads_finished = criteria, width, pads_finished
        self.max_new_tokens = int(max_new_tokens)
        self.prompt_lens = np.asarray(prompt_lens, dtype=np.int64)  # [B]
        self.ids = input_ids.new_full((rows, width + self.max_new_tokens), pad_id)  # [B, L + max_new]
        self.ids[:, :width] = input_ids
        self.pad = torch.tensor(pad_id, dtype=input_ids.dtype, device=input_ids.device)
        self._first = torch.as_tensor(self.prompt_lens, device=input_ids.device)  # [B]
        self.steps = 0  # steps replayed
        self.live = np.ones(rows, dtype=bool)  # [B] rows the criteria have not stopped
        self.stop_step = np.zeros(rows, dtype=np.int64)  # [B] the step a stopped row stopped at

    @property
    def stopped(self) -> np.ndarray:  # [B] bool
        """The rows whose output ends at their stop step: the engine finishes them there. Without
        ``pads_finished``, none until the criteria have stopped every row."""
        if self.pads_finished:
            return ~self.live
        return np.full_like(self.live, not self.live.any())

    @property
    def limits(self) -> np.ndarray:  # [B]
        """Per row, the output length (prompt included) known to be kept: a stopped row's, at its
        stop; a running row's tokens up to the last step replayed (more may follow)."""
        if not self.pads_finished:  # every row keeps its own tokens until the last one stops
            return self.prompt_lens + (self.steps if self.live.any() else int(self.stop_step.max()))
        return self.prompt_lens + np.where(self.stopped, self.stop_step, self.steps)

    def advance(self, tokens: torch.Tensor, output_lens: np.ndarray) -> None:
        """Replay every step that each row still needing tokens has committed: ``tokens`` ``[B, S]``
        holds row r's tokens by position (no padding), ``output_lens`` ``[B]`` how many are
        committed. One host sync per step replayed, as in HF's loop: it stops calling the criteria
        once every row has stopped."""
        committed = np.asarray(output_lens) - self.prompt_lens  # [B] new tokens per row
        live = torch.as_tensor(self.live, device=tokens.device)  # [B]
        last = tokens.shape[1] - 1
        while self.live.any() and self.steps < self.max_new_tokens:
            waiting = self.live if self.pads_finished else np.ones_like(self.live)
            if int(committed[waiting].min()) <= self.steps:
                return  # a row the next step needs has not committed it yet
            n = self.steps + 1
            position = (self._first + (n - 1)).clamp(max=last)[:, None]  # [B, 1]
            token = tokens.gather(1, position)[:, 0].to(self.ids.dtype)  # [B]
            if self.pads_finished:  # HF: a finished row's next token is the pad id
                token = torch.where(live, token, self.pad)
            self.ids[:, self.width + n - 1] = token
            view = self.ids[:, : self.width + n]
            done = self.criteria(view if view.is_contiguous() else view.contiguous(), None)  # [B]
            live = live & ~torch.as_tensor(done, device=tokens.device).reshape(-1).bool()
            now = live.cpu().numpy()  # the step's sync (HF's loop syncs here too)
            self.stop_step[self.live & ~now] = n
            self.live, self.steps = now, n
