"""The text a run meets, for profiling acceptance (docs/design.md, "Acceptance on the run's own
text"): each calibration row's first half followed by the target's own continuation of it (greedy,
or sampled under the run's settings).

Every context a decoding run scores is the prompt plus tokens the target emitted, so acceptance is
an average over the target's own text, not over held-out text. The two differ a lot on the zoo: a
small model's continuations are easier (often loops) than the text it was trained on, and rates
teacher-forced on held-out text put the zoo's ``xs > s`` at 0.70 (greedy) where the target's
continuations give 0.79. A lookup level is replayed on the same text (``lookup_replay``).
"""

from __future__ import annotations

import torch


def continuation_start(ids: torch.Tensor) -> int:
    """Where the target's continuation begins in a row of ``continued(target, ids)``: its first
    half is the calibration text."""
    return ids.shape[1] // 2


@torch.inference_mode()
def continued(target: torch.nn.Module, prompts: torch.Tensor, **generation_kwargs) -> torch.Tensor:
    """[N, L]: the first L // 2 tokens of each row of ``prompts`` ([N, L]) and ``target``'s own
    continuation of them, L - L // 2 tokens (HF ``generate`` with ``generation_kwargs``; EOS
    ignored; sampling seeded, without touching the global random state)."""
    half = continuation_start(prompts)
    head = prompts[:, :half]
    devices = [head.device] if head.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(0)
        return target.generate(
            head, attention_mask=torch.ones_like(head), max_new_tokens=prompts.shape[1] - half,
            eos_token_id=None, pad_token_id=0, **generation_kwargs,
        )  # fmt: skip


def run_contexts(text: torch.Tensor) -> slice:
    """The positions of ``text`` ([N, L], from ``continued``) whose contexts a run scores: the last
    prompt token's (the first decision) and every generated one's."""
    return slice(continuation_start(text) - 1, text.shape[1])
