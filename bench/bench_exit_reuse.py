"""What a verification costs after an early exit: recomputed (the target's full forward over the
block) against reused (the exit caught up on the one token it never fed, then the target's layers
>= k from the exit's hidden states: ``hsd_fast/exit_reuse.py``), at the runner level, eager.

The bound the reuse should meet: the share of layers >= k plus the head of a full verification,
+ 10 %: ``full x ((L - k) / L x (1 - head) + head) x 1.1``, where ``head`` is the share of the full
verification spent in the final norm and LM head over the block (measured here too). Medians of
``torch.utils.benchmark`` (0.5 s each), after a prompt of 64 tokens is cached; block widths 2, 4, 6;
batch 1 and 16 (every row the same block: at 16 rows a CPU forward is compute-bound).

    python bench/bench_exit_reuse.py            # zoo se and its cost twin (hidden 768, MLP 2048)

Writes bench/results/exit_reuse_cpu.{json,md}.
"""

from __future__ import annotations

import warnings

import torch
from kernel_bench import median_us, run_meta, write_results

import hsd_fast
from hsd_fast import zoo
from hsd_fast.hf_runner import HFRunner
from hsd_fast.layout import fed_block

PROMPT, WIDTHS, EXITS, BATCHES = 64, (2, 4, 6), (1, 2, 3), (1, 16)


def _forward(runner, tokens: torch.Tensor, start: int, end: int, width: int, outputs: int):
    rows = len(tokens)
    spans = torch.full((rows,), start), torch.full((rows,), end), torch.ones(rows, dtype=torch.bool)
    block = fed_block(tokens, *spans, width)
    return lambda: runner.forward(block, outputs)


def measure(name: str, target: torch.nn.Module, batch: int) -> list[dict]:
    layers = target.config.num_hidden_layers
    vocab = target.config.vocab_size
    tokens = torch.randint(3, vocab, (batch, 256), generator=torch.Generator().manual_seed(0))
    full = HFRunner(target, vocab)
    full.prepare(batch, 200)
    _forward(full, tokens, 0, PROMPT, PROMPT, 1)()
    rows = []
    for k in EXITS:
        exit_runner = HFRunner(hsd_fast.EarlyExit(target, k), vocab)
        exit_runner.prepare(batch, 200)
        _forward(exit_runner, tokens, 0, PROMPT + max(WIDTHS), PROMPT + max(WIDTHS), 1)()  # hidden states
        reuse = full.reuse_of(exit_runner)
        assert reuse is not None, "the zoo target takes hidden states"
        for width in WIDTHS:
            end = PROMPT + width
            whole = median_us(_forward(full, tokens, PROMPT, end, width, width), False)
            catch_up = median_us(_forward(exit_runner, tokens, end - 1, end, 1, 0), False)  # no head
            top = median_us(_forward(reuse, tokens, PROMPT, end, width, width), False)
            hidden = torch.randn(batch, width, target.config.hidden_size)
            head = median_us(lambda h=hidden: target.lm_head(target.model.norm(h)), False)
            share = head / whole
            bound = whole * ((layers - k) / layers * (1 - share) + share) * 1.1
            reused = catch_up + top
            rows.append({
                "target": name, "batch": batch, "k": k, "width": width, "full_us": round(whole),
                "catch_up_us": round(catch_up), "top_us": round(top), "reused_us": round(reused),
                "head_share": round(share, 3), "bound_us": round(bound),
                "reused / full": round(reused / whole, 3), "within bound": reused <= bound,
            })  # fmt: skip
            print(rows[-1], flush=True)
    return rows


def main() -> None:
    warnings.simplefilter("ignore")
    torch.set_grad_enabled(False)
    se = zoo.load("se")
    twin = zoo.cost_twin(se, hidden_size=768, num_layers=6, intermediate_size=2048)
    models = {"se": se, "se twin": twin}
    rows = [row for batch in BATCHES for name, model in models.items() for row in measure(name, model, batch)]
    within = sum(r["within bound"] for r in rows)
    notes = [
        "Batch 1 and 16, fp32, eager runner forwards (no engine), a 64-token prompt cached, medians of "
        "torch.utils.benchmark. full: the target's forward over a block of `width` tokens (logits at every "
        "column, as a verification). reused: the exit's forward over the one token it never fed "
        "(catch_up) + the target's layers >= k from the exit's hidden states (top). bound: the share of "
        "layers >= k of a full verification plus its head, + 10 %.",
        f"Within the bound: {within} of {len(rows)} rows.",
    ]
    threads = torch.get_num_threads()
    meta = run_meta("cpu", batch=list(BATCHES), dtype="float32", threads=threads, prompt=PROMPT)
    write_results(
        "exit_reuse_cpu", "Verification after an early exit, recomputed vs reused", notes,
        ["target", "batch", "k", "width"], rows, meta,
    )  # fmt: skip


if __name__ == "__main__":
    main()
