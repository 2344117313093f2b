"""Greedy precision: how often hsd_fast's greedy output differs from HF's own, per dtype.

Greedy HSD is the target's greedy decoding token for token when every forward computes the same
logits as HF's. In fp32 they agree to the last bit that matters; in bf16 and fp16 a forward over a
different shape (a 4D mask over the whole slot cache, a verification over several tokens, a prompt
fed in chunks, a batch of rows) may round differently, and an argmax between two logits closer than
that rounding can flip. This script measures how often that happens and how close the two tokens
were in the reference's own logits, for:

- HF ``generate`` with its default dynamic cache: the reference;
- HF ``generate`` with ``cache_implementation="static"``: HF's own attention over a preallocated
  cache with a mask, the closest HF path to the engine's;
- the engine without drafts (K = 0) and with one and two zoo drafts (K = 1, 2).

Every sequence is compared up to its first differing token (after it, the contexts differ and so
do the outputs); the gap of a divergence is ``logit(reference token) - logit(other token)`` in the
reference's logits at that step, also in units of the dtype's spacing (ulp) at the larger logit.

    python bench/bench_precision.py [--prompts 32] [--new-tokens 64] [--dtypes float32 bfloat16 float16]

Writes bench/results/precision_<device>.{json,md}.
"""

from __future__ import annotations

import argparse
import math
import statistics
from pathlib import Path

import torch

import hsd_fast
from hsd_fast import zoo
from hsd_fast.report import markdown_table, run_metadata, write_report
from hsd_fast.zoo.calibration import read_calibration

RESULTS = Path(__file__).parent / "results"
TARGET, DRAFTS = "s", ("xxs", "xs")
VARIANTS = {  # name -> generate kwargs beyond the shared ones; those with drafts= run the engine
    "HF static cache": {"cache_implementation": "static"},
    "engine K=0": {"drafts": (), "T": ()},
    "engine K=1 (xxs, T=2)": {"drafts": ("xxs",), "T": (2,)},
    "engine K=2 (xxs, xs, T=2,2)": {"drafts": ("xxs", "xs"), "T": (2, 2)},
}


def prompts(count: int, length: int) -> torch.Tensor:
    """``count`` prompts of ``length`` tokens: the starts of the zoo's held-out windows, sources
    taken in turn."""
    windows = read_calibration(zoo.zoo_dir())
    rows = [w[i, :length] for i in range(8) for w in windows.values()]
    if count > len(rows):
        raise SystemExit(f"the zoo holds {len(rows)} calibration windows; asked for {count}")
    return torch.stack(rows[:count])


def spacing(value: float, dtype: torch.dtype) -> float:
    """The distance between adjacent values of ``dtype`` around ``value`` (one ulp)."""
    info = torch.finfo(dtype)
    return 2.0 ** math.floor(math.log2(max(abs(value), info.tiny))) * info.eps


def first_divergence(reference: list[int], other: list[int]) -> int | None:
    return next((i for i, (a, b) in enumerate(zip(reference, other, strict=True)) if a != b), None)


def measure(dtype: torch.dtype, ids: torch.Tensor, new_tokens: int) -> dict:
    models = {name: zoo.load(name, dtype=dtype) for name in (TARGET, *DRAFTS)}
    target = models[TARGET]
    shared = {"do_sample": False, "max_new_tokens": new_tokens, "eos_token_id": None, "pad_token_id": 0}
    rows = {name: [] for name in VARIANTS}
    for number, prompt in enumerate(ids):
        print(f"{dtype} prompt {number + 1}/{len(ids)}", flush=True)
        prompt = prompt[None]
        ref = target.generate(prompt, return_dict_in_generate=True, output_logits=True, **shared)
        ref_tokens = ref.sequences[0, prompt.shape[1] :].tolist()
        static_tokens = None
        for name, extra in VARIANTS.items():
            if "drafts" in extra:
                kwargs = {"drafts": [models[d] for d in extra["drafts"]], "T": list(extra["T"])}
                out = target.generate(
                    prompt, custom_generate=hsd_fast.generate, compile=False, **kwargs, **shared
                )
            else:
                out = target.generate(prompt, **extra, **shared)
            tokens = out[0, prompt.shape[1] :].tolist()
            static_tokens = static_tokens or tokens  # the first variant is HF's static cache
            at = first_divergence(ref_tokens, tokens)
            record = {"compared": new_tokens if at is None else at + 1, "diverged_at": at}
            record["same_as_static_cache"] = tokens == static_tokens
            if at is not None:
                logits = ref.logits[at][0].float()  # the reference's logits at that step, [V]
                gap = float(logits[ref_tokens[at]] - logits[tokens[at]])
                record |= {"gap": gap, "gap_ulps": gap / spacing(float(logits.max()), dtype)}
            rows[name].append(record)
    return rows


def summarise(records: list[dict]) -> dict:
    diverged = [r for r in records if r["diverged_at"] is not None]
    compared = sum(r["compared"] for r in records)
    gaps = [r["gap_ulps"] for r in diverged]
    return {
        "sequences": len(records),
        "sequences_differing": len(diverged),
        "tokens_compared": compared,
        "divergences_per_1000_tokens": 1000 * len(diverged) / compared,
        "median_gap_ulps": statistics.median(gaps) if gaps else None,
        "max_gap_ulps": max(gaps) if gaps else None,
        "max_gap": max((r["gap"] for r in diverged), default=None),
        "sequences_equal_to_hf_static_cache": sum(r["same_as_static_cache"] for r in records),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16", "float16"])
    args = parser.parse_args()
    torch.manual_seed(0)
    ids = prompts(args.prompts, args.prompt_len)
    results, table = {}, []
    for name in args.dtypes:
        dtype = getattr(torch, name)
        records = measure(dtype, ids, args.new_tokens)
        results[name] = {variant: {"summary": summarise(r), "records": r} for variant, r in records.items()}
        for variant, entry in results[name].items():
            s = entry["summary"]
            table.append(
                [name, variant, f"{s['sequences_differing']} / {s['sequences']}", s["tokens_compared"],
                 s["divergences_per_1000_tokens"], s["median_gap_ulps"], s["max_gap_ulps"],
                 f"{s['sequences_equal_to_hf_static_cache']} / {s['sequences']}"]
            )  # fmt: skip
            print(name, variant, s, flush=True)
    meta = run_metadata(
        "cpu",
        target=f"zoo {TARGET}",
        drafts=list(DRAFTS),
        prompts=f"{args.prompts} zoo calibration windows, first {args.prompt_len} tokens",
        new_tokens=args.new_tokens,
        batch=1,
        attention="sdpa",
    )
    columns = ["dtype", "path (vs HF generate, dynamic cache)", "sequences differing", "tokens compared",
               "divergences / 1000 tokens", "median gap (ulps)", "max gap (ulps)",
               "sequences equal to HF static cache"]  # fmt: skip
    notes = [
        "Tokens compared: per sequence, up to and including its first differing token (64 when none "
        "differs). Gap: the reference's logit of its own token minus that of the other path's token, at "
        "the first divergence, in ulps of the dtype at the step's largest logit.",
    ]
    write_report(
        RESULTS / "precision_cpu", "Greedy precision against HF generate", meta,
        [*markdown_table(columns, table), "", *notes], {"results": results},
    )  # fmt: skip


if __name__ == "__main__":
    main()
