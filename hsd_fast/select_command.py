"""``hsd-fast select``: profile a target and candidate drafts, print the best hierarchies, and with
``--measure`` time each with the engine next to its prediction.

Levels are named as ``select_levels`` says: zoo names (``hsd_fast.zoo``, variants included), local HF
checkpoint directories, ``lookup`` (the model-free lookup level) and ``exitK`` (the target's first K
layers, ``hsd_fast.EarlyExit``); by default the largest zoo model is the target and the lookup level
and the smaller zoo models are the candidates (and a target trained for early exits offers its
shallower half); a model on another tokenizer (``xs4k``) drafts through the byte bridge. Acceptance
is measured on the target's own continuations of the zoo's calibration windows (or ``--text``), put in
the target's tokenizer (``zoo.calibration.calibration_in``); costs at
``--context`` cached tokens for ``--batch`` rows, eager or
(``--compile``) compiled, and ``--measure`` runs that batch. Measurements are cached
(``--cache``); the zoo's committed CPU profile (``zoo/profile_cpu.json``) is read as a fallback.

Arguments that cannot work (``--max-T 0``, ``--trees 300``, ``--measure`` with ``--max-new-tokens 1``,
a context or a measured run longer than the models' positions, ``--json x.md`` or a ``--json`` that
cannot be written) are usage errors before anything is loaded.
"""

from __future__ import annotations

import argparse
import inspect
import time
from pathlib import Path

import torch

from hsd_fast.bench.text_sets import TEXT_SETS
from hsd_fast.cli_args import (
    device,
    non_negative_int,
    positive_float,
    positive_int,
    probability,
    report_stem,
    tree_size,
)
from hsd_fast.hierarchy_types import DEFAULT_MAX_T, TreeDraft
from hsd_fast.lookup import LOOKUP
from hsd_fast.other_tokenizer import same_tokenizer
from hsd_fast.positions import COMMAND_FORM, check_positions, fewest_positions
from hsd_fast.report import markdown_table, run_metadata, write_report
from hsd_fast.select_levels import (
    RECOMPUTED,
    bridging_errors,
    candidate_levels,
    config_of,
    default_candidates,
    default_target,
    level_name,
    load_model,
    name_errors,
    named_models,
    text_tokenizer_of,
    tokenizer_of,
)

DEFAULT_CACHE = Path.home() / ".cache" / "hsd_fast" / "profiles.json"


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("select", help="pick the latency-optimal hierarchy (optionally measure it)")
    p.add_argument("--target", help="zoo name or checkpoint directory (default: the largest zoo model)")
    p.add_argument(
        "--candidates",
        nargs="+",
        help="zoo names, checkpoint directories, 'lookup' (the lookup level) or 'exitK' (the target's "
        "first K layers as a level); one model may have another tokenizer (xs4k) (default: lookup, the "
        "smaller zoo models and, for a target trained for early exits (sx, se), exit1..exit3)",
    )
    p.add_argument("--do-sample", action="store_true", help="select for sampling (default: greedy)")
    p.add_argument("--temperature", type=positive_float, default=1.0, help="with --do-sample (default 1.0)")
    p.add_argument("--top-k", type=non_negative_int, help="0: no top-k")
    p.add_argument("--top-p", type=probability, help="with --do-sample: nucleus mass, in (0, 1]")
    p.add_argument(
        "--max-T",
        type=positive_int,
        default=DEFAULT_MAX_T,
        help=f"largest block size considered (default {DEFAULT_MAX_T})",
    )
    p.add_argument(
        "--trees",
        type=tree_size,
        nargs="+",
        default=[],
        metavar="N",
        help="also consider each draft drafting a token tree of N nodes (the best for its rank acceptance)",
    )
    p.add_argument("--context", type=positive_int, default=96, help="cached tokens when timing forwards")
    p.add_argument(
        "--batch", type=positive_int, default=1, help="select for runs of this many rows (costs timed at it)"
    )
    p.add_argument(
        "--compile",
        action="store_true",
        help="select for compiled steps (what generate runs once warm; each step is compiled to be timed)",
    )
    p.add_argument("--measure", action="store_true", help="run every listed hierarchy with the engine")
    p.add_argument(
        "--adapt",
        action="store_true",
        help="also run the prompts adaptively from the pick and print the latency controller's view "
        "(the hierarchies it used, its estimates against the profile's, its decisions)",
    )
    p.add_argument(
        "--text",
        choices=list(TEXT_SETS),
        help="calibrate and measure on this text found on the machine, outside the zoo's corpus "
        "(default: the zoo's calibration windows)",
    )
    p.add_argument("--prompt-len", type=positive_int, default=64, help="prompt tokens per measured row")
    p.add_argument(
        "--max-new-tokens",
        type=positive_int,
        default=64,
        help="tokens per row: what a batch is selected for, and --measure generates (at least 2)",
    )
    p.add_argument(
        "--dtype", default="float32", choices=["float32", "bfloat16", "float16"], help="default: float32"
    )
    p.add_argument(
        "--device", type=device, default="cuda" if torch.cuda.is_available() else "cpu",
        help="default: cuda where there is one, else cpu",
    )  # fmt: skip
    store = p.add_mutually_exclusive_group()
    store.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="profile cache to read and update")
    store.add_argument("--no-cache", action="store_true", help="measure everything afresh, store nothing")
    p.add_argument(
        "--json",
        type=report_stem,
        metavar="STEM",
        help="also write the report as STEM.json and STEM.md (STEM.json is taken as STEM too)",
    )
    return p


def _position_limit(names: list[str]) -> int | None:
    """The fewest positions any of the named models takes (``max_position_embeddings`` of its
    config.json, read without loading it), None where no config says. Unknown names are left to
    ``run``, which names them."""
    return fewest_positions(config_of(name) for name in names)


def check(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Usage errors (``parser.error``) for arguments that cannot work together, before any model or
    measurement is loaded."""
    if args.target == LOOKUP:
        parser.error(
            "--target lookup: the lookup level proposes for a model above it; it cannot be the target"
        )
    if args.candidates and args.candidates.count(LOOKUP) > 1:
        parser.error("--candidates: name the lookup level once")
    from hsd_fast.engine import MAX_BLOCK_SIZE

    if args.max_T > MAX_BLOCK_SIZE:
        parser.error(f"--max-T {args.max_T}: block sizes are at most {MAX_BLOCK_SIZE} (MAX_BLOCK_SIZE)")
    _check_names(args, parser)
    if args.text:
        from hsd_fast.bench.text_sets import available

        if args.text not in available():
            parser.error(f"--text {args.text}: no file of it on this machine ({TEXT_SETS[args.text].kind})")
    if args.measure:
        _check_measured_run(args, parser)
    _check_positions(args, parser)


def _check_names(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Every level named can be made (``select_levels.name_errors``)."""
    errors = name_errors(args.target, args.candidates, args.adapt)
    if errors:
        parser.error(errors[0])


def _check_measured_run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    from hsd_fast import zoo
    from hsd_fast.zoo.calibration import read_calibration

    if args.max_new_tokens < 2:
        parser.error(
            "--measure times the tokens after the first (the prefill excluded): --max-new-tokens must be >= 2"
        )
    if args.text:  # its prompts are cut to --prompt-len from the text
        return
    try:
        window = min(w.shape[1] for w in read_calibration(zoo.zoo_dir()).values())
    except (OSError, ValueError):  # no zoo: run() says so
        return
    if args.prompt_len > window:
        parser.error(
            f"--prompt-len {args.prompt_len}: the measured prompts are calibration windows of {window} tokens"
        )


def _check_positions(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    from hsd_fast.profile.costs import forward_costs

    limit = _position_limit(named_models(args.target, args.candidates))
    if limit is None:
        return
    defaults = inspect.signature(forward_costs).parameters
    longest = max(*defaults["spans"].default, *defaults["drafts"].default)
    room = limit - args.prompt_len
    models = [("models'", limit)]
    try:
        check_positions(
            args.context + longest + 1,
            models,
            asked=f"--context {args.context} + the {longest + 1} tokens a timed step feeds after it",
            remedy=f"use --context <= {limit - longest - 1}",
            form=COMMAND_FORM,
        )
        if args.measure:
            check_positions(
                args.prompt_len + args.max_new_tokens,
                models,
                asked=f"--prompt-len {args.prompt_len} + --max-new-tokens {args.max_new_tokens}",
                remedy=f"use --max-new-tokens <= {room}" if room > 0 else "shorten --prompt-len",
                form=COMMAND_FORM,
            )
    except ValueError as err:
        parser.error(str(err))


def run(args: argparse.Namespace) -> int:
    from hsd_fast import zoo
    from hsd_fast.hf_generate import generate
    from hsd_fast.hierarchy import select_hierarchy
    from hsd_fast.profile import ProfileCache, measured_latency

    try:  # the calibration, the prompts and the default levels are the zoo's
        zoo.manifest()
    except (OSError, ValueError) as err:
        raise SystemExit(f"hsd-fast select: {err}") from None
    dtype = getattr(torch, args.dtype)
    target_name = args.target or default_target()
    candidate_names = args.candidates or default_candidates(target_name)
    models = {n: load_model(n, dtype, args.device) for n in named_models(target_name, candidate_names)}
    candidates = candidate_levels(candidate_names, models, target_name)
    tokenizers = {n: tokenizer_of(n) for n in models}
    try:
        text_tokenizer = text_tokenizer_of(target_name, models[target_name], tokenizers[target_name])
    except ValueError as err:
        raise SystemExit(f"hsd-fast select: {err}") from None
    calibration, prompts, described = _calibration_and_prompts(args, text_tokenizer)
    calibration, prompts = calibration.to(args.device), prompts.to(args.device)

    if args.no_cache:
        cache = ProfileCache()
    else:
        cache = ProfileCache(args.cache, fallbacks=[zoo.zoo_dir() / "profile_cpu.json"])
    sampling = {"do_sample": args.do_sample}
    if args.do_sample:
        chosen = {"temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p}
        sampling |= {k: v for k, v in chosen.items() if v is not None}  # unset: HF's defaults
    bridging = {}
    if (own := tokenizers[target_name]) is not None:  # a model on another tokenizer drafts through the bridge
        # (the zoo's were checked before loading; a directory's tokenizer is known only now)
        others = {n: t for n, t in tokenizers.items() if t is not None and not same_tokenizer(t, own)}
        bridged = [n for n in candidate_names if n in others]
        errors = bridging_errors(bridged, target_name, args.adapt)
        if errors:
            raise SystemExit(f"hsd-fast select: {errors[0]}")
        bridging = {"draft_tokenizers": [tokenizers.get(n) for n in candidate_names], "target_tokenizer": own}
    pick = select_hierarchy(
        models[target_name],
        candidates,
        calibration,
        context=args.context,
        cache=cache,
        max_T=args.max_T,
        tree_sizes=args.trees,
        batch=args.batch,
        compile=args.compile,
        max_new_tokens=args.max_new_tokens,
        **bridging,
        **sampling,
    )
    rows = []
    measured_ar = None
    measured_run = {"max_new_tokens": args.max_new_tokens, "batch": args.batch, "compile": args.compile}
    measured_run |= sampling
    if args.measure:
        measured_ar = measured_latency(models[target_name], None, prompts, generate=generate, **measured_run)
    for rank, h in enumerate([pick, *pick.runner_ups]):
        row = {
            "rank": rank,
            "chain": [*(level_name(d, models) for d in h.drafts), target_name],
            "T": list(h.T),
            "tree": "" if h.tree is None else repr(h.tree),
            "predicted_tok_s": h.predicted_tokens_per_second,
            "predicted_speedup_over_ar": h.speedup_over_ar,
            "predicted_speedup_over_best_single": h.speedup_over_best_single,
        }
        if args.measure:
            if len(h.chain) == 1:
                seconds = measured_ar
            else:
                seconds = measured_latency(models[target_name], h, prompts, generate=generate, **measured_run)
            row |= {
                "measured_tok_s": args.batch / seconds,
                "measured_speedup_over_ar": measured_ar / seconds,
                "measured_over_predicted_latency": seconds / h.predicted_latency,
            }
        rows.append(row)
    table = _table(rows, args.measure)
    if pick.no_draft_reason:
        table.append(f"\nThe pick is no draft: {pick.no_draft_reason}.")
    if pick.fewer_drafts_reason:
        table.append(f"\nThe pick has fewer drafts than the best predicted: {pick.fewer_drafts_reason}.")
    table += _never_drafts(pick, models)
    if args.measure:
        rank = sorted(r["measured_tok_s"] for r in rows)[::-1].index(rows[0]["measured_tok_s"]) + 1
        best = max(r["measured_tok_s"] for r in rows)
        table.append(
            f"\nThe pick (#0) measured #{rank} of {len(rows)}, {rows[0]['measured_tok_s'] / best:.2f}x the "
            "fastest measured."
        )
    print("\n".join(table))
    if args.adapt:
        names = [*candidate_names, target_name]
        print("\n".join(_adaptive_view(models[target_name], candidates, names, pick, prompts, measured_run)))
    if args.json:
        meta = run_metadata(
            args.device,
            batch=args.batch,
            dtype=args.dtype,
            sampling=sampling,
            compiled=args.compile,
            context=args.context,
            prompts=f"{len(prompts)} rows x {args.prompt_len} tokens ({described})",
            max_new_tokens=args.max_new_tokens,
            no_draft_reason=pick.no_draft_reason,
            fewer_drafts_reason=pick.fewer_drafts_reason,
            cost_noise=pick.cost_noise,
        )
        write_report(args.json, "hsd-fast select", meta, table, {"rows": rows})  # a stem: run.v2 stays
    return 0


def _never_drafts(pick, models: dict[str, torch.nn.Module]) -> list[str]:
    """A line naming the candidates the selector could not use as drafts: one step of theirs (a call
    for one token) costs at least the target's, and a draft must cost less than its verifier. An
    exit's recomputing twin costs what its exit does: named once."""
    profile = getattr(pick, "profile", None)
    if profile is None:
        return []
    step = profile.costs[-1](1)
    dropped = []
    for level, cost in zip(profile.candidates[:-1], profile.costs[:-1], strict=True):
        if isinstance(level, TreeDraft) or cost(1) < step:
            continue
        name = level_name(level, models)
        if not name.endswith(RECOMPUTED):
            dropped.append(f"{name} ({cost(1) * 1e3:.2f} ms)")
    if not dropped:
        return []
    costly = ", ".join(dropped)
    return [
        f"\nNever a draft: {costly}: a one-token step (or call) costs at least the target's "
        f"({step * 1e3:.2f} ms), and a draft must cost less than its verifier."
    ]


def _adaptive_view(
    target: torch.nn.Module, candidates: list, names: list[str], pick, prompts: torch.Tensor, run: dict
) -> list[str]:
    """Run ``prompts`` adaptively from ``pick`` over every candidate and describe what the latency
    controller did (docs/design.md §8.9); ``names``: the candidates', then the target's."""
    from hsd_fast.controller import LatencyController
    from hsd_fast.hf_generate import generate

    batch = run["batch"]  # the rows the pick was selected for (the measured prompts, cycled)
    prompts = prompts.repeat((batch + len(prompts) - 1) // len(prompts), 1)[:batch]
    run = {k: v for k, v in run.items() if k != "batch"}
    start = time.perf_counter()
    out = target.generate(
        prompts, custom_generate=generate, drafts=candidates, hierarchy=pick, adapt=True,
        output_hsd_stats=True, eos_token_id=None, **run,
    )  # fmt: skip
    seconds = time.perf_counter() - start
    new = (out.sequences.shape[1] - prompts.shape[1]) * len(prompts)
    # the run's: ``adapt=True`` from a pick chooses up to the max_T it was selected at
    controller = LatencyController.kept_for(pick, candidates, max_T=pick.profile.max_T)
    lines = [f"\nAdaptive from the pick, every candidate: {new / seconds:.1f} tok/s over {len(prompts)} rows"]
    used = ("hierarchies used", "  from round")
    lines += [line for line in out.hsd_stats.summary().splitlines() if line.startswith(used)]
    return lines + controller.describe(names)


def _calibration_and_prompts(args: argparse.Namespace, tokenizer) -> tuple[torch.Tensor, torch.Tensor, str]:
    """Calibration windows [N, L] and measured prompts [M, prompt_len] in ``tokenizer``'s ids (the
    target's): from ``--text`` (a text set found on the machine, cut into disjoint windows) or the
    zoo's calibration text (every window, and the first of each source's as a prompt); and a phrase
    saying which."""
    from hsd_fast import zoo

    if args.text:
        from hsd_fast.bench.text_sets import prompt_set

        try:
            found = prompt_set(
                args.text, lambda text: tokenizer(text)["input_ids"], prompt_len=args.prompt_len
            )
        except ValueError as err:
            raise SystemExit(f"hsd-fast select: {err}") from None
        return found.calibration, found.prompts, f"{found.kind}, {args.text}"
    from hsd_fast.zoo.calibration import calibration_in

    windows = calibration_in(zoo.zoo_dir(), tokenizer)
    width = min(w.shape[1] for w in windows.values())
    if (args.measure or args.adapt) and args.prompt_len > width:  # the target's tokenizer took fewer ids
        raise SystemExit(
            f"hsd-fast select: --prompt-len {args.prompt_len}: the zoo's calibration windows are "
            f"{width} tokens in the target's tokenizer (or use --text)"
        )
    calibration = torch.cat([w[:, :width] for w in windows.values()])  # [N, width]
    prompts = torch.stack([w[0, : args.prompt_len] for w in windows.values()])
    return calibration, prompts, "zoo calibration, one per source"


def _table(rows: list[dict], measured: bool) -> list[str]:
    columns = ["#", "chain", "T", "tree", "predicted tok/s", "pred. x AR", "pred. x best single"]
    keys = ["rank", "chain", "T", "tree", "predicted_tok_s", "predicted_speedup_over_ar"]
    keys += ["predicted_speedup_over_best_single"]
    if measured:
        columns += ["measured tok/s", "meas. x AR", "measured / predicted latency"]
        keys += ["measured_tok_s", "measured_speedup_over_ar", "measured_over_predicted_latency"]
    cells = [[" > ".join(r[k]) if k == "chain" else r[k] for k in keys] for r in rows]
    return markdown_table(columns, cells)
