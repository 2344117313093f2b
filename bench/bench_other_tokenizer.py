"""A draft with another tokenizer under zoo ``s``: ``xs4k`` (the ``xs`` shape, trained on the same
corpus with a 4,096-entry BPE) through our byte bridge (``hsd_fast.OtherTokenizerDraft``), beside HF's
own path for such a pair (``assistant_model=`` with ``tokenizer=`` / ``assistant_tokenizer=``,
"universal assisted generation") and beside ``xs``, the same shape with the target's tokenizer.
``xxs4k`` (the ``xxs`` shape on the same 4,096-entry tokenizer) drafts alone through the bridge, and
under ``xs4k`` in their own tokenizer (``draft_tokenizers=[None, tok4k]``: a hierarchy inside the
bridged level, ``other_tokenizer_chain``), as does the lookup level over ``xs4k``'s ids.

The comparison the issue asks is of algorithms: ours over our no-draft decoding against HF's over its
own ``generate``. One process, interleaved passes after a warm-up (``bench.timing.interleaved``), batch
1, prompts from held-out zoo text (code, prose) and text the zoo never saw (licenses, man pages).
``--select`` adds the selector's pick with ``xs4k`` as its candidate (``select_hierarchy(...,
draft_tokenizers=)``: the bridged draft profiled by replay, its calls timed per block size), chosen on
the zoo's calibration windows, not on the prompts measured.
Columns: ``agreement`` (of the drafts level 1 verified, the share it accepted),
``tokens_per_target_forward`` (new tokens per forward of the target), ``bridge_share`` (the byte
bridge's host time over the run's wall time, ``HSDStats.bridge_seconds``), ``chain_kept`` (of the ids
``xxs4k`` or the lookup level drafted under ``xs4k``, the share ``xs4k`` kept). A row that raises (HF's
sampled path for such a pair does, on transformers 5.24) is reported, not timed. Greedy outputs
are checked equal to HF ``generate``. Sampled, the bridged draft draws from the vocabulary it shares
with the target (all of ``xs4k``'s), and one more row verifies its most likely ids as point masses
(``shared_sampling=False``), the other exact mode.

    python bench/bench_other_tokenizer.py                      # greedy, eager steps
    python bench/bench_other_tokenizer.py --sampled                 # temperature 0.8
    python bench/bench_other_tokenizer.py --twin [--sampled]        # the target's cost twin
    python bench/bench_other_tokenizer.py --twin --compile --select --T 2 3   # compiled, with the pick
    python bench/bench_other_tokenizer.py --twin --draft-twin --compile --T 3    # xs4k costs a middle draft

Writes bench/results/<stem>.{json,md}.
"""

from __future__ import annotations

import argparse
import statistics
import warnings
from pathlib import Path

import torch
from bench_early_exit import prompts
from kernel_bench import run_meta, write_results

import hsd_fast
from hsd_fast import zoo
from hsd_fast.bench.timing import CpuMeter, interleaved
from hsd_fast.profile import ProfileCache
from hsd_fast.zoo.calibration import read_calibration

TITLE = "A draft with another tokenizer"
COLUMNS = [
    "config", "tok_s", "x_hf", "x_ours_no_draft", "agreement", "tokens_per_target_forward", "bridge_share",
    "chain_kept",
]  # fmt: skip
TWIN_NOTE = " as its cost twin (hidden 768, 12 layers, MLP 2048; the same logits)"
DRAFT_TWIN_NOTE = (
    " as its cost twin (hidden 384, 8 layers, MLP 1024: the twin scenario's sm; the same logits)"
)


def _pick(target, xs4k, tok, tok4k, args, sampling: dict) -> hsd_fast.Hierarchy:
    """The selector's hierarchy for ``xs4k`` under the target (or no draft), chosen on two calibration
    windows per zoo source, for runs of ``--max-new-tokens`` tokens (step costs at 128 cached
    tokens: the context the committed zoo profiles were timed at)."""
    windows = read_calibration(zoo.zoo_dir())
    calibration = torch.cat([w[:2, : args.prompt_len] for w in windows.values()])  # [8, prompt_len]
    # the zoo's committed step costs (timed on another day: scaled by the anchor's ratio) spare
    # compiling and timing the target's steps at every width here
    fallback = zoo.zoo_dir() / ("profile_twin_cpu.json" if args.twin else "profile_cpu.json")
    cache = ProfileCache(args.cache, fallbacks=[fallback])
    return hsd_fast.select_hierarchy(
        target, [xs4k], calibration, compile=args.compile, cache=cache, max_T=6, context=128,
        max_new_tokens=args.max_new_tokens, draft_tokenizers=[tok4k], target_tokenizer=tok,
        **{k: v for k, v in sampling.items() if k != "top_k"},
    )  # fmt: skip


def _describe(pick: hsd_fast.Hierarchy) -> str:
    if not pick.drafts:
        return "no draft"
    return f"xs4k (bridged) > s T={list(pick.T)}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--sampled", action="store_true", help="temperature 0.8 (default: greedy)")
    parser.add_argument("--compile", action="store_true", help="our steps compiled (default: eager)")
    parser.add_argument("--T", type=int, nargs="+", default=[3, 5], help="block sizes of the bridged draft")
    parser.add_argument(
        "--chain-T", type=int, default=3, help="block size of xxs4k under xs4k (the chained rows)"
    )
    parser.add_argument(
        "--twin",
        action="store_true",
        help="s as its cost twin (hidden 768, 12 layers, MLP 2048: same logits)",
    )
    parser.add_argument(
        "--draft-twin",
        action="store_true",
        help="xs4k as a cost twin of a middle draft's size (hidden 384, 8 layers, MLP 1024: same logits)",
    )
    parser.add_argument("--select", action="store_true", help="add the selector's pick (xs4k a candidate)")
    parser.add_argument("--cache", type=Path, default=None, help="profile cache for --select (default: none)")
    parser.add_argument("--stem", default=None)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    torch.manual_seed(0)

    tok, tok4k = zoo.load_tokenizer(), zoo.load_tokenizer("xs4k")
    target, xs, xs4k, xxs4k = zoo.load("s"), zoo.load("xs"), zoo.load("xs4k"), zoo.load("xxs4k")
    if args.twin:  # the cost of a larger target, the same tokens and acceptance
        target = zoo.cost_twin(target, hidden_size=768, num_layers=12, intermediate_size=2048)
    if args.draft_twin:  # a bridged draft that costs what a middle draft does: where a chain may pay
        xs4k = zoo.cost_twin(xs4k, hidden_size=384, num_layers=8, intermediate_size=1024)
    sets = prompts(tok, args.prompt_len)
    n = args.max_new_tokens
    sampling = (
        {"do_sample": True, "temperature": 0.8, "top_k": None} if args.sampled else {"do_sample": False}
    )
    common = {"max_new_tokens": n, "min_new_tokens": n, "eos_token_id": None, **sampling}
    ours = {
        "custom_generate": hsd_fast.generate,
        "compile": args.compile,
        "output_hsd_stats": True,
        "seed": 0,
    }
    bridged = {"target_tokenizer": tok, "draft_tokenizers": [tok4k]}

    def chained(t: int, below=xxs4k, below_t: int = args.chain_T) -> dict:
        """``below`` drafting for xs4k in their tokenizer, xs4k crossing to the target's."""
        return {"target_tokenizer": tok, "draft_tokenizers": [None, tok4k], "drafts": [below, xs4k],
                "T": [below_t, t]}  # fmt: skip

    rows: dict[str, dict] = {
        "HF generate": {},
        "HF assisted, xs4k (assistant_tokenizer=, default schedule)": {
            "assistant_model": xs4k, "tokenizer": tok, "assistant_tokenizer": tok4k,
        },
        "HF assisted, xs (the target's tokenizer, default schedule)": {"assistant_model": xs},
        "ours, no draft": ours,
        **{f"ours, xs4k (bridged) > s T=[{t}]": ours | bridged | {"drafts": [xs4k], "T": [t]}
           for t in args.T},
        **{f"ours, xxs4k (bridged) > s T=[{t}]": ours | bridged | {"drafts": [xxs4k], "T": [t]}
           for t in args.T},
        **{f"ours, xxs4k > xs4k (bridged) > s T=[{args.chain_T}, {t}]": ours | chained(t) for t in args.T},
        **{f"ours, lookup > xs4k (bridged) > s T=[4, {t}]": ours | chained(t, "lookup", 4) for t in args.T},
        "ours, xs > s T=[4] (the target's tokenizer)": ours | {"drafts": [xs], "T": [4]},
    }  # fmt: skip
    if args.sampled:  # the other sampled mode: the draft's most likely ids verified as point masses
        point = hsd_fast.OtherTokenizerDraft(xs4k, tok4k, tok, shared_sampling=False)
        t = args.T[0]
        rows[f"ours, xs4k (bridged, point masses) > s T=[{t}]"] = ours | {"drafts": [point], "T": [t]}
    if args.select:
        pick = _pick(target, xs4k, tok, tok4k, args, sampling)
        rows[f"ours, the selector's pick: {_describe(pick)}"] = ours | {"hierarchy": pick}
    outputs: dict[str, list] = {name: [] for name in rows}

    def runner(name: str, kwargs: dict):
        def run() -> None:
            outputs[name] = []
            for _, ids in sets:
                out = target.generate(ids, attention_mask=torch.ones_like(ids), **common, **kwargs)
                outputs[name].append(out)

        return run

    failed = {}  # a row that raises (HF's own path may) is reported, not timed
    for name, kwargs in list(rows.items()):
        try:
            runner(name, kwargs)()  # every prompt once (the warm-up repeats it)
        except Exception as err:  # whatever it raised is the row's result
            failed[name] = f"{type(err).__name__}: {err}"
            del rows[name]
    timings = interleaved([runner(k, v) for k, v in rows.items()], args.passes, CpuMeter())
    tokens = n * len(sets)
    base = {name: tokens / statistics.median(s) for name, s in zip(rows, timings.seconds, strict=True)}
    reference = [o.tolist() for o in outputs["HF generate"]]
    table = []
    for name in rows:
        row = {"config": name, "tok_s": base[name], "x_hf": base[name] / base["HF generate"]}
        row["x_ours_no_draft"] = base[name] / base["ours, no draft"]
        stats = [o.hsd_stats for o in outputs[name] if hasattr(o, "hsd_stats")]
        if stats:
            top = stats[0].num_levels - 1
            if top >= 1:
                verified, accepted = sum(s.verified[1] for s in stats), sum(s.accepted[1] for s in stats)
                row["agreement"] = accepted / verified if verified else None
            row["tokens_per_target_forward"] = tokens / sum(s.row_forwards[top] for s in stats)
            wall = sum(sum(s.wall_time) for s in stats)
            row["bridge_share"] = sum(s.bridge_seconds for s in stats) / wall if wall else None
            drafted = sum(s.chain_drafted for s in stats)
            row["chain_kept"] = sum(s.chain_accepted for s in stats) / drafted if drafted else None
        sequences = [o.sequences if hasattr(o, "sequences") else o for o in outputs[name]]
        if not args.sampled:
            row["equal_to_hf"] = [s.tolist() for s in sequences] == reference
        table.append(row)
        print({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()})
    twins = ("_twin" if args.twin else "") + ("_draft_twin" if args.draft_twin else "")
    stem = args.stem or "other_tokenizer" + twins + "_cpu" + ("_sampled" * args.sampled)
    mode = "temperature 0.8" if args.sampled else "greedy"
    notes = [
        f"Target zoo s{TWIN_NOTE if args.twin else ''}, batch 1, {mode}, {n} new tokens after each of "
        f"{len(sets)} prompts "
        f"({', '.join(name for name, _ in sets)}; {args.prompt_len} tokens), our steps "
        f"{'compiled' if args.compile else 'eager'}, {args.passes} interleaved passes after a warm-up "
        f"(redone when another process took > 10 % of the CPU: {timings.redone} redone).",
        "xs4k: the xs shape with the zoo's 4,096-entry tokenizer (whose ids are the first 4,096 of the "
        "target's 8,192: nested vocabularies, different splits); our bridge re-encodes bytes either way.",
    ]
    if args.draft_twin:
        notes.append(f"xs4k{DRAFT_TWIN_NOTE} in every row that uses it (HF's included).")
    notes += [f"{name}: not measured, it raised {error}" for name, error in failed.items()]
    meta = run_meta("cpu", passes=args.passes, max_new_tokens=n, sampled=args.sampled)
    write_results(stem, TITLE, notes, COLUMNS, table, meta)


if __name__ == "__main__":
    main()
