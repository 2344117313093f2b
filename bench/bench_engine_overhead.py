"""Engine overhead: HSD with K = 0 (plain autoregressive decoding through the engine) vs HF's own
greedy `generate` on the same model, side by side in one run, plus the engine's per-round overhead
(wall time of a round minus the time spent inside the model's forward).

    python bench/bench_engine_overhead.py [--device cpu] [--new-tokens 128] [--repeats 5]

Writes bench/results/engine_overhead_<device>.{json,md}.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import hsd_fast
from hsd_fast.hf_runner import HFRunner
from hsd_fast.report import markdown_table, run_metadata, write_report

RESULTS = Path(__file__).parent / "results"


def small_llama(device: str) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=8192,
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=1024,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval().to(device)


class TimedForward:
    """Wraps HFRunner.forward to add up the seconds spent inside the model."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = 0
        self._orig = HFRunner.forward

    def __enter__(self) -> TimedForward:
        outer = self

        def forward(runner, feed):
            _sync()
            t0 = time.perf_counter()
            out = outer._orig(runner, feed)
            _sync()
            outer.seconds += time.perf_counter() - t0
            outer.calls += 1
            return out

        HFRunner.forward = forward
        return self

    def __exit__(self, *exc) -> None:
        HFRunner.forward = self._orig


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _time(fn, repeats: int) -> list[float]:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        _sync()
        t0 = time.perf_counter()
        fn()
        _sync()
        times.append(time.perf_counter() - t0)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    model = small_llama(args.device)
    ids = torch.randint(3, 8192, (1, args.prompt_len), generator=torch.Generator().manual_seed(1))
    ids = ids.to(args.device)
    kwargs = {"do_sample": False, "max_new_tokens": args.new_tokens, "eos_token_id": None}
    hf_out = model.generate(ids, **kwargs)
    hsd_out = model.generate(ids, custom_generate=hsd_fast.generate, **kwargs)
    assert torch.equal(hf_out, hsd_out), "K = 0 must reproduce HF's greedy output"

    hf_times = _time(lambda: model.generate(ids, **kwargs), args.repeats)
    hsd_times = _time(lambda: model.generate(ids, custom_generate=hsd_fast.generate, **kwargs), args.repeats)
    with TimedForward() as timer:
        model.generate(ids, custom_generate=hsd_fast.generate, **kwargs)
    hsd_median = statistics.median(hsd_times)
    rounds = timer.calls
    overhead_us = (hsd_median - timer.seconds) / rounds * 1e6

    meta = run_metadata(
        args.device,
        dtype="float32",
        batch=1,
        model="Llama 4 layers, hidden 256, vocab 8192 (random init), SDPA",
        prompt_len=args.prompt_len,
        new_tokens=args.new_tokens,
    )
    result = {
        "hf_generate_tok_s": args.new_tokens / statistics.median(hf_times),
        "hsd_k0_tok_s": args.new_tokens / hsd_median,
        "ratio_hsd_over_hf": statistics.median(hf_times) / hsd_median,
        "engine_rounds": rounds,
        "model_forward_s": timer.seconds,
        "engine_overhead_us_per_round": overhead_us,
        "raw_times_s": {"hf": hf_times, "hsd_k0": hsd_times},
    }
    table = markdown_table(
        ["path", "tokens/s"],
        [
            ["HF `generate` (greedy)", result["hf_generate_tok_s"]],
            ["hsd_fast, K = 0", result["hsd_k0_tok_s"]],
        ],
    )
    notes = [
        f"Ratio hsd_fast / HF: {result['ratio_hsd_over_hf']:.2f}. Engine overhead per round (wall time minus "
        f"model forward): {overhead_us:.0f} us over {rounds} rounds.",
    ]
    write_report(
        RESULTS / f"engine_overhead_{args.device}", "Engine overhead", meta, [*table, "", *notes], result
    )
    print("\n".join([*table, *notes]))


if __name__ == "__main__":
    main()
