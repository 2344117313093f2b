"""The adaptive engine against static hierarchies on a mixed stream of requests
(``hsd_fast.bench.mixed``), on the zoo and the varied-text sets this machine has
(``hsd_fast.bench.text_sets``: license prose, C headers, data tables, man pages): other text than
the zoo's own, which ``hsd-fast bench --mixed`` serves. The pick is ``select_hierarchy``'s on the
zoo's calibration (compiled or eager as the run).

    python bench/bench_adaptive.py                          # greedy, eager steps: adaptive_cpu
    python bench/bench_adaptive.py --sampled                # adaptive_cpu_sampled
    python bench/bench_adaptive.py --twin --max-new-tokens 128              # adaptive_twin_cpu
    python bench/bench_adaptive.py --batch 16 --max-new-tokens 64           # adaptive_b16_cpu
    python bench/bench_adaptive.py --twin --variant later_calls_apart=True  # one more controller row

Writes bench/results/<stem>.{json,md}: tokens/s over the whole sequence and per set, and the ratios
to the static pick and to the best static configuration. The stem names the options that change
what is measured (``default_stem``), so a run never overwrites another setting's file; ``--stem``
overrides it. The costs the pick and the controller start from are timed in the process (the cost
twin is in no committed profile) unless ``--cache PATH`` keeps them: runs to compare should share one.
"""

from __future__ import annotations

import argparse
import ast
import warnings
from pathlib import Path

import torch
from kernel_bench import RESULTS, run_meta

import hsd_fast
from hsd_fast import zoo
from hsd_fast.bench.mixed import measure_mixed, mixed_grid, mixed_requests, write_mixed
from hsd_fast.bench.text_sets import prompt_set
from hsd_fast.profile import ProfileCache
from hsd_fast.zoo.calibration import read_calibration

TWIN_NOTE = " as its cost twin (hidden 768, 12 layers, MLP 2048; the same logits)"
SETS = ("licenses", "c-headers", "tables", "man-pages")


def text_sets(tokenizer, prompt_len: int, batch: int) -> dict[str, torch.Tensor]:
    """Name -> ``[3 x batch, prompt_len]`` prompts of every varied-text set found here."""
    encode = lambda text: tokenizer(text)["input_ids"]  # noqa: E731
    found = {}
    for name in SETS:
        try:
            found[name] = prompt_set(name, encode, prompt_len=prompt_len, prompts=3 * batch).prompts
        except (FileNotFoundError, ValueError):
            continue
    return found


def controller_options(text: str) -> tuple[str, dict]:
    """``"later_calls_apart=True,margin=0.1"`` -> (that text, its options)."""
    options = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise argparse.ArgumentTypeError(f"{item!r} is not key=value")
        try:
            options[key.strip()] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError) as error:
            raise argparse.ArgumentTypeError(f"{value!r} is not a Python literal") from error
    return text, options


def default_stem(args: argparse.Namespace) -> str:
    """``adaptive[_twin][_bB]_cpu[_compiled][_sampled][_max_tT]``: the committed files' names."""
    twin = "_twin" if args.twin else ""
    batch = f"_b{args.batch}" if args.batch > 1 else ""
    compiled = "_compiled" if args.compile else ""
    sampled = "_sampled" if args.sampled else ""
    max_T = f"_max_t{args.max_T}" if args.max_T != 8 else ""
    return f"adaptive{twin}{batch}_cpu{compiled}{sampled}{max_T}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--sampled", action="store_true", help="temperature 0.8 (default: greedy)")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--batch", type=int, default=1, help="rows per request (prompts of one set)")
    parser.add_argument(
        "--max-T", type=int, default=8, help="the largest block size of the pick (the controller: 8)"
    )
    parser.add_argument(
        "--twin", action="store_true", help="s as its cost twin (hidden 768, 12 layers, MLP 2048)"
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        type=controller_options,
        help="a further latency controller row with these LatencyController options, "
        "as key=value[,key=value] (values as Python literals); may be repeated",
    )
    parser.add_argument("--stem", help="default: from the options (default_stem)")
    parser.add_argument(
        "--cache",
        type=Path,
        help="a profile cache to read and keep the costs in (default: none; the twin's costs are timed "
        "afresh in each process, and vary from one to the next by up to 25 %%)",
    )
    args = parser.parse_args()
    args.stem = args.stem or default_stem(args)
    warnings.simplefilter("ignore")
    torch.set_grad_enabled(False)
    target = zoo.load("s")
    if args.twin:  # the cost of a larger target, the same tokens and acceptance
        target = zoo.cost_twin(target, hidden_size=768, num_layers=12, intermediate_size=2048)
    candidates = {"lookup": "lookup", "xxs": zoo.load("xxs"), "xs": zoo.load("xs")}
    sampling = {"do_sample": True, "temperature": 0.8} if args.sampled else {"do_sample": False}
    calibration = torch.cat([w[:, :128] for w in read_calibration(zoo.zoo_dir()).values()])
    cache = ProfileCache(args.cache, fallbacks=[zoo.zoo_dir() / "profile_cpu.json"])
    pick = hsd_fast.select_hierarchy(
        target, list(candidates.values()), calibration, cache=cache, compile=args.compile,
        max_new_tokens=args.max_new_tokens, max_T=args.max_T, progress=False, batch=args.batch, **sampling,
    )  # fmt: skip
    work = mixed_requests(text_sets(zoo.load_tokenizer(), args.prompt_len, args.batch), args.batch)
    result = measure_mixed(
        target,
        candidates,
        pick,
        mixed_grid(["xxs", "xs"], "s"),
        work,
        sampling,
        args.max_new_tokens,
        args.passes,
        args.compile,
        target_name="s",
        variants=dict(args.variant),
    )
    meta = run_meta(
        "cpu", batch=args.batch, dtype="float32", sampling=sampling, compiled=args.compile,
        threads=torch.get_num_threads(),
        requests=f"{len(work)} x {args.prompt_len} prompt tokens: " + ", ".join(r.group for r in work),
        max_new_tokens=args.max_new_tokens, passes=args.passes, redone=result.redone,
    )  # fmt: skip
    notes = [
        f"Target s{TWIN_NOTE if args.twin else ''}, candidates lookup, xxs, xs (zoo), batch {args.batch}. "
        "One pass serves every request in turn; "
        "medians of interleaved passes after warm-up. The latency controller keeps its estimates "
        "across requests and passes (as a process serving a stream would).",
    ]
    write_mixed(
        RESULTS / args.stem, "Adaptive against static hierarchies, mixed requests", notes, result, meta
    )


if __name__ == "__main__":
    main()
