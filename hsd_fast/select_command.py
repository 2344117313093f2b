"""``hsd-fast select``: profile a target and candidate drafts, print the best hierarchies, and with
``--measure`` time each with the engine next to its prediction.

Models are zoo names (``hsd_fast.zoo``) or local HF checkpoint directories; by default the largest
zoo model is the target and the others are the candidates. Acceptance is measured on the zoo's
held-out calibration windows; costs at ``--context`` cached tokens. Measurements are cached
(``--cache``); the zoo's committed CPU profile (``zoo/profile_cpu.json``) is read as a fallback.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from hsd_fast.report import markdown_table, run_metadata, write_report

DEFAULT_CACHE = Path.home() / ".cache" / "hsd_fast" / "profiles.json"


def add_parser(sub) -> None:
    p = sub.add_parser("select", help="pick the latency-optimal hierarchy (optionally measure it)")
    p.add_argument("--target", help="zoo name or checkpoint directory (default: the largest zoo model)")
    p.add_argument("--candidates", nargs="+", help="zoo names or checkpoint directories (default: the zoo)")
    p.add_argument("--do-sample", action="store_true", help="select for sampling (default: greedy)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-k", type=int)
    p.add_argument("--top-p", type=float)
    p.add_argument("--max-T", type=int, default=8)
    p.add_argument("--context", type=int, default=96, help="cached tokens when timing forwards")
    p.add_argument("--measure", action="store_true", help="run every listed hierarchy with the engine")
    p.add_argument("--prompt-len", type=int, default=64, help="prompt tokens per measured row")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="profile cache to read and update")
    p.add_argument("--no-cache", action="store_true", help="measure everything afresh, store nothing")
    p.add_argument("--json", type=Path, help="also write the report as JSON")


def _load(name: str, dtype: torch.dtype, device: str) -> torch.nn.Module:
    from hsd_fast import zoo

    if Path(name).is_dir():
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(name, dtype=dtype).to(device).eval()
    return zoo.load(name, dtype, device)


def run(args: argparse.Namespace) -> int:
    from hsd_fast import zoo
    from hsd_fast.hierarchy import select_hierarchy
    from hsd_fast.profile import ProfileCache, measured_latency
    from hsd_fast.zoo.build import read_calibration

    dtype = getattr(torch, args.dtype)
    names = zoo.names()
    target_name = args.target or names[-1]
    candidate_names = args.candidates or [n for n in names if n != target_name]
    models = {n: _load(n, dtype, args.device) for n in [*candidate_names, target_name]}
    windows = read_calibration(zoo.zoo_dir())
    calibration = torch.cat(list(windows.values())).to(args.device)  # [N, 128]
    prompts = torch.stack([w[0, : args.prompt_len] for w in windows.values()]).to(args.device)

    if args.no_cache:
        cache = ProfileCache()
    else:
        cache = ProfileCache(args.cache, fallbacks=[zoo.zoo_dir() / "profile_cpu.json"])
    sampling = {"do_sample": args.do_sample}
    if args.do_sample:
        chosen = {"temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p}
        sampling |= {k: v for k, v in chosen.items() if v is not None}  # unset: HF's defaults
    pick = select_hierarchy(
        models[target_name],
        [models[n] for n in candidate_names],
        calibration,
        context=args.context,
        cache=cache,
        max_T=args.max_T,
        **sampling,
    )
    labels = [*candidate_names, target_name]
    rows = []
    measured_ar = None
    if args.measure:
        measured_ar = measured_latency(models[target_name], None, prompts, args.max_new_tokens, **sampling)
    for rank, h in enumerate([pick, *pick.runner_ups]):
        row = {
            "rank": rank,
            "chain": [labels[i] for i in h.chain],
            "T": list(h.T),
            "predicted_tok_s": 1 / h.predicted_latency,
            "predicted_speedup_over_ar": h.speedup_over_ar,
            "predicted_speedup_over_best_single": h.speedup_over_best_single,
        }
        if args.measure:
            if len(h.chain) == 1:
                seconds = measured_ar
            else:
                seconds = measured_latency(models[target_name], h, prompts, args.max_new_tokens, **sampling)
            row |= {
                "measured_tok_s": 1 / seconds,
                "measured_speedup_over_ar": measured_ar / seconds,
                "measured_over_predicted_latency": seconds / h.predicted_latency,
            }
        rows.append(row)
    table = _table(rows, args.measure)
    print("\n".join(table))
    if args.json:
        meta = run_metadata(
            args.device,
            batch=1,
            dtype=args.dtype,
            sampling=sampling,
            context=args.context,
            prompts=f"{len(prompts)} rows x {args.prompt_len} tokens (zoo calibration, one per source)",
            max_new_tokens=args.max_new_tokens,
        )
        write_report(args.json.with_suffix(""), "hsd-fast select", meta, table, {"rows": rows})
    return 0


def _table(rows: list[dict], measured: bool) -> list[str]:
    columns = ["#", "chain", "T", "predicted tok/s", "pred. x AR", "pred. x best single"]
    keys = ["rank", "chain", "T", "predicted_tok_s", "predicted_speedup_over_ar"]
    keys += ["predicted_speedup_over_best_single"]
    if measured:
        columns += ["measured tok/s", "meas. x AR", "measured / predicted latency"]
        keys += ["measured_tok_s", "measured_speedup_over_ar", "measured_over_predicted_latency"]
    cells = [[" > ".join(r[k]) if k == "chain" else r[k] for k in keys] for r in rows]
    return markdown_table(columns, cells)
