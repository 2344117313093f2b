"""The text a run meets, for profiling acceptance (docs/design.md, "Acceptance on the run's own
text"): each calibration row's first half followed by the target's own continuation of it (greedy,
or sampled under the run's settings), as long as the run it profiles for.

Every context a decoding run scores is the prompt plus tokens the target emitted, so acceptance is
an average over the target's own text, not over held-out text. The two differ a lot on the zoo: a
small model's continuations are easier (often loops) than the text it was trained on, and rates
teacher-forced on held-out text put the zoo's ``xs > s`` at 0.70 (greedy) where the target's
continuations give 0.79. How easy depends on how far the run has gone: a greedy small model drifts
into loops after some tens of tokens, which a lookup level then proposes whole, so the continuation
is as long as the run (``new_tokens``), not a fixed half window: the zoo's lookup level offered
~1.5 tokens per target pass replayed on 64-token continuations, 2.5-3.3 in 128-token runs. A lookup
level is replayed on the same text (``proposal_replay``).
"""

from __future__ import annotations

import torch


def continuation_start(prompts: torch.Tensor) -> int:
    """Where the target's continuation begins in the rows ``continued(target, prompts)`` returns:
    after the first half of each calibration row (``prompts``: [N, L])."""
    return prompts.shape[1] // 2


def default_new_tokens(prompts: torch.Tensor) -> int:
    """The continuation's length when none is asked for: the calibration row's second half."""
    return prompts.shape[1] - continuation_start(prompts)


@torch.inference_mode()
def continued(
    target: torch.nn.Module, prompts: torch.Tensor, new_tokens: int | None = None, **generation_kwargs
) -> torch.Tensor:
    """[N, L // 2 + new_tokens]: the first L // 2 tokens of each row of ``prompts`` ([N, L]) and
    ``target``'s own continuation of them, ``new_tokens`` tokens (default L - L // 2; HF ``generate``
    with ``generation_kwargs``; EOS ignored; sampling seeded, without touching the global random
    state)."""
    half = continuation_start(prompts)
    head = prompts[:, :half]
    new_tokens = default_new_tokens(prompts) if new_tokens is None else new_tokens
    if new_tokens < 1:
        raise ValueError(f"continued: new_tokens must be >= 1, got {new_tokens}")
    devices = [head.device] if head.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(0)
        return target.generate(
            head, attention_mask=torch.ones_like(head), max_new_tokens=new_tokens,
            eos_token_id=None, pad_token_id=0, **generation_kwargs,
        )  # fmt: skip


def run_contexts(start: int, length: int) -> slice:
    """The positions of a ``continued`` text of ``length`` tokens whose continuation begins at
    ``start`` (``continuation_start``) whose contexts a run scores: the last prompt token's (the
    first decision) and every generated one's."""
    return slice(start - 1, length)
