"""The mixed scenario (docs/design.md, "The adaptive controller"): one process serves a stream of
requests taken in turn from several prompt sets, then prompts that switch register half-way (the
first half of one set's prompt, the second half of another's). Static configurations keep one
hierarchy for the whole stream: no draft, the selector's pick and a small grid; adaptive ones
choose per round: the built-in policy (``adapt=True``) and the latency controller started from the
pick's profile (``adapt=True, hierarchy=pick``), which keeps what it learns across the requests (in
greedy runs also without its probes of idle candidates; ``variants`` add rows with other
controller options). Side by side after warm-up, interleaved per request (``timing.interleaved``:
every configuration serves a request, in a rotated order, before any serves the next); greedy
outputs are checked equal to no draft's.

``hsd-fast bench --mixed`` runs it on a scenario's prompt sets, ``bench/bench_adaptive.py`` on the
varied-text sets of ``text_sets``.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from tqdm.auto import tqdm

from hsd_fast.bench.timing import CpuMeter, interleaved
from hsd_fast.controller import LatencyController
from hsd_fast.hf_generate import generate
from hsd_fast.hierarchy_types import Hierarchy
from hsd_fast.lookup import LookupDraft
from hsd_fast.report import markdown_table, write_report
from hsd_fast.switching_types import Choice

REGISTER_SWITCHES = "register switches"
"""The group of the requests whose prompt switches set half-way."""


@dataclass(frozen=True)
class Request:
    group: str  # the prompt set, or "a > b" for a register switch
    ids: torch.Tensor  # [batch, prompt_len]


def mixed_requests(prompt_sets: dict[str, torch.Tensor], batch: int) -> list[Request]:
    """Requests of ``batch`` rows from ``prompt_sets`` (name -> ``[N, L]`` prompts): each set's first
    two batches, the sets in turn, then for each set a register switch into the next set (the halves
    of their third batches). Every prompt is cut to the shortest set's length; a set of fewer than
    3 x ``batch`` prompts repeats them."""
    names = list(prompt_sets)
    length = min(p.shape[1] for p in prompt_sets.values())

    def take(name: str, i: int) -> torch.Tensor:  # [batch, length]: the i-th batch of a set
        prompts = prompt_sets[name]
        return prompts[torch.arange(i * batch, (i + 1) * batch) % len(prompts), :length]

    out = [Request(n, take(n, i)) for i in range(2) for n in names]
    half = length // 2
    for a, b in zip(names, names[1:] + names[:1], strict=True):
        out.append(Request(f"{a} > {b}", torch.cat([take(a, 2)[:, :half], take(b, 2)[:, half:]], 1)))
    return out


def mixed_grid(drafts: Sequence[str], target_name: str = "target") -> dict[str, tuple[list[str], list[int]]]:
    """The static grid beside the pick: the lookup level alone (T=6), each draft alone (T=4), the
    lookup level over the smallest draft (T=6, 3). ``drafts``: smallest first."""
    grid = {f"lookup > {target_name} T=6": (["lookup"], [6])}
    grid |= {f"{d} > {target_name} T=4": ([d], [4]) for d in drafts}
    if drafts:
        grid[f"lookup > {drafts[0]} > {target_name} T=6,3"] = (["lookup", drafts[0]], [6, 3])
    return grid


@dataclass
class MixedResult:
    rows: list[dict]  # one per configuration
    best_static: str  # the static configuration fastest over the whole stream
    redone: int  # rounds (one request, every configuration) redone for another process's load


def measure_mixed(
    target: torch.nn.Module,
    candidates: dict[str, torch.nn.Module | str],
    pick: Hierarchy,
    grid: dict[str, tuple[list[str], list[int]]],
    work: Sequence[Request],
    sampling: dict,
    max_new_tokens: int,
    passes: int,
    compile: bool = False,
    meter: CpuMeter | None = None,
    target_name: str = "target",
    variants: Mapping[str, dict] | None = None,
) -> MixedResult:
    """Time every configuration over the stream ``work`` (module doc). ``candidates``: name ->
    draft model, or ``"lookup"``; ``grid``: label -> (candidate names, T); ``variants``: label ->
    ``LatencyController`` options, each a further latency controller row (started from the pick)."""
    greedy = not sampling.get("do_sample", False)
    common = {**sampling, "max_new_tokens": max_new_tokens, "eos_token_id": None, "compile": compile}
    names = {id(m): n for n, m in candidates.items()}
    candidate_names = list(candidates)
    levels = list(candidates.values())
    at = {"request": 0}  # the request every configuration serves next
    outputs: dict[str, list] = {}  # name -> each request's output (the last pass's)
    spent: dict[str, np.ndarray] = {}  # name -> [3]: an adaptive run's looks, probes, and wall seconds
    used: dict[str, Counter] = {}  # an adaptive run's hierarchies: label -> tokens committed under it

    def run_of(name: str, **kwargs) -> Callable[[], None]:
        outputs[name], spent[name], used[name] = [None] * len(work), np.zeros(3), Counter()

        def run() -> None:  # one request
            i = at["request"]
            start = time.perf_counter()
            out = target.generate(
                work[i].ids, custom_generate=generate, seed=i, output_hsd_stats=True, **common, **kwargs
            )
            stats = out.hsd_stats
            spent[name] += (stats.look_seconds, stats.probe_seconds, time.perf_counter() - start)
            outputs[name][i] = out.sequences
            for stretch in stats.hierarchies:
                used[name][choice_label(stretch.choice, candidate_names, target_name)] += stretch.committed

        return run

    chain = [names.get(id(d), "lookup") for d in pick.drafts]
    pick_label = f"static pick: {' > '.join([*chain, target_name])} T={list(pick.T)}"
    runs = {"no draft": run_of("no draft"), pick_label: run_of(pick_label, hierarchy=pick)}
    for label, (chosen, T) in grid.items():
        runs[label] = run_of(label, drafts=[candidates[n] for n in chosen], T=T)
    runs["adaptive, built-in policy"] = run_of("adaptive, built-in policy", drafts=levels, adapt=True)
    runs["adaptive, latency controller"] = run_of(
        "adaptive, latency controller", drafts=levels, adapt=True, hierarchy=pick
    )
    resolved = [LookupDraft() if c == "lookup" else c for c in levels]
    options_by_label = {"no probes": {"probe_share": 0.0}} if greedy else {}  # probes: greedy runs only
    for label, options in {**options_by_label, **(variants or {})}.items():
        name = f"adaptive, latency controller, {label}"
        controller = LatencyController.from_hierarchy(pick, resolved, **options)
        runs[name] = run_of(name, drafts=levels, adapt=controller, hierarchy=pick)
    # Interleaved per request, not per stream: a pass of the stream is len(work) rounds of
    # ``interleaved``, each serving one request with every configuration in a rotated order. On this
    # VM one configuration's whole stream varied by +-12 % from run to run (no other load), and two
    # configurations doing the same work came out up to 18 % apart when each ran its whole stream
    # in turn; a slow spell now falls on every configuration's share of the same request.
    bar = tqdm(total=passes * len(work), desc=f"mixed stream, {len(runs)} ways (requests)", unit=" request")

    def next_request(counted: int) -> None:
        at["request"] = (counted + 1) % len(work)
        bar.update()

    timings = interleaved(list(runs.values()), passes * len(work), meter or CpuMeter(), on_pass=next_request)
    bar.close()
    # [configuration][pass][request] seconds
    per_pass = {
        name: [t[k * len(work) : (k + 1) * len(work)] for k in range(passes)]
        for name, t in zip(runs, timings.seconds, strict=True)
    }
    shares = {name: (s[0] / s[2], s[1] / s[2]) for name, s in spent.items()}
    total = {name: statistics.median(sum(p) for p in per_pass[name]) for name in runs}
    rows_per_request = work[0].ids.shape[0]
    static = [n for n in runs if not n.startswith("adaptive")]
    best_static = min(static, key=total.get)
    groups = sorted({_group(r.group) for r in work})
    rows = []
    for name in runs:
        row = {
            "config": name,
            "tok_s": round(len(work) * max_new_tokens * rows_per_request / total[name], 1),
            "x_static_pick": round(total[pick_label] / total[name], 3),
            "x_best_static": round(total[best_static] / total[name], 3),
            "x_no_draft": round(total["no draft"] / total[name], 3),
            "look_share": round(shares[name][0], 4) if name.startswith("adaptive") else None,
            "probe_share": round(shares[name][1], 4) if name.startswith("adaptive") else None,
            "hierarchies": most_used(used[name]) if name.startswith("adaptive") else None,
        }
        for group in groups:
            index = [i for i, r in enumerate(work) if _group(r.group) == group]
            secs = statistics.median(sum(p[i] for i in index) for p in per_pass[name])
            row[f"{group} tok_s"] = round(len(index) * max_new_tokens * rows_per_request / secs, 1)
        if greedy:
            row["same_output"] = all(
                torch.equal(a, b) for a, b in zip(outputs[name], outputs["no draft"], strict=True)
            )
        rows.append(row)
    return MixedResult(rows, best_static, timings.redone)


def write_mixed(stem, title: str, notes: list[str], result: MixedResult, meta: dict) -> None:
    """``stem``.json (meta + rows) and .md (notes, then the table)."""
    columns = list(result.rows[0])
    table = markdown_table(columns, [[r.get(c) for c in columns] for r in result.rows])
    notes = [*notes, f"Best static configuration over the whole stream: {result.best_static}."]
    write_report(stem, f"{title}: {meta['device']}", meta, [*notes, "", *table], {"rows": result.rows})


def choice_label(choice: Choice, names: list[str], target_name: str) -> str:
    """``choice`` in the candidates' ``names``: ``lookup > xs > s T=7,4``."""
    levels = [names[m] for m in choice.drafts] + [target_name]
    T = f" T={','.join(map(str, choice.T))}" if choice.drafts else ""
    return " > ".join(levels) + T + (" tree" if choice.tree else "")


def most_used(tokens: Counter, top: int = 3) -> str:
    """The hierarchies that committed the most tokens over the measurement, with their shares."""
    total = sum(tokens.values()) or 1
    return "; ".join(f"{label} {n / total:.0%}" for label, n in tokens.most_common(top))


def _group(name: str) -> str:
    return REGISTER_SWITCHES if ">" in name else name
