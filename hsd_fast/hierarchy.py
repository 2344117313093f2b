"""``select_hierarchy``: profile the candidates, pick the latency-optimal hierarchy, and bind its
draft models, so the result goes straight into ``generate(hierarchy=)`` or ``wrap(hierarchy=)``.

The selector (``hsd_fast.selector``) works on candidate indices only; this module is where indices
meet models (``Hierarchy.bind``; the result types live in ``hsd_fast.hierarchy_types``, which the
request path reads without loading any of this). ``measure=True`` times the pick through
``hsd_fast.generate``, handed to the profiler as a callable: the profiler does not import the HF glue.
"""

from __future__ import annotations

import operator
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

import torch
from tqdm.auto import tqdm

from hsd_fast.batch_latency import select_for_batch
from hsd_fast.early_exit import exit_of, recomputing_variant
from hsd_fast.engine import MAX_BLOCK_SIZE
from hsd_fast.hf_generate import generate
from hsd_fast.hierarchy_types import DEFAULT_MAX_T, Hierarchy, NoDraftWarning, Profile, Selection, TreeDraft
from hsd_fast.latency import Acceptance, Cost, LookupCost, RatesThrough, Through, reindexed
from hsd_fast.lookup import LookupDraft, as_lookup
from hsd_fast.other_tokenizer import OtherTokenizerDraft, same_tokenizer
from hsd_fast.processors import generation_sampling
from hsd_fast.profile import ProfileCache, ProfileNoiseWarning, measured_latency
from hsd_fast.profile.costs import crowd_bytes
from hsd_fast.proposal_level import ProposalLevel
from hsd_fast.row_spread import ProposalRows, Spread
from hsd_fast.selector import prefer_fewer_drafts, prefer_no_draft
from hsd_fast.tree import MAX_NODES, Tree
from hsd_fast.tree_latency import tree_acceptance, tree_cost

SAMPLING_KWARGS = ("do_sample", "temperature", "top_k", "top_p", "min_p", "typical_p")


def select_hierarchy(
    target: torch.nn.Module,
    candidates: Sequence[torch.nn.Module | LookupDraft | str],
    prompts: torch.Tensor,  # [N, L] calibration token ids (no padding)
    measure: bool = False,
    *,
    context: int | None = None,
    cache: ProfileCache | None = None,
    max_T: int = DEFAULT_MAX_T,
    max_new_tokens: int = 64,
    progress: bool = True,
    compile: bool = False,
    clock: Callable[[], float] = time.perf_counter,
    tree_sizes: Sequence[int] = (),
    batch: int = 1,
    min_gain: float | None = None,
    draft_tokenizers: Sequence | None = None,
    target_tokenizer=None,
    **generation_kwargs,
) -> Hierarchy:
    """Profile ``candidates`` and ``target`` (costs at ``context`` cached tokens, default the prompt
    length; acceptance teacher-forced on the target's own continuations of ``prompts``, each
    ``max_new_tokens`` long like the runs selected for, under exactly
    the sampling transform that ``target.generate(**generation_kwargs)`` applies: do_sample,
    temperature, top_k, ...; docs/design.md, "Acceptance on the run's own text"), pick the
    latency-optimal hierarchy, and with ``measure=True`` time it with the engine on ``prompts[:batch]``.
    ``compile``: select for compiled steps (``generate(compile=True)``, and ``"auto"`` once warm)
    rather than eager ones: each candidate's steps are then compiled to be timed. ``clock``: what
    every timing reads (tests inject a fake one). One candidate may be a lookup level
    (``"lookup"`` or a ``LookupDraft``): it is profiled by replaying the target's own continuations
    of ``prompts`` (how much it offers, how much each model accepts, its host seconds per call) and
    can only be level 0. ``tree_sizes``: also consider every model candidate drafting a token
    tree of each of these sizes, the best tree for its measured rank acceptance under each model
    that could verify it (docs/design.md, "Choosing a tree"); the pick's ``tree`` says which.
    ``batch``: select for runs of that many rows of ``max_new_tokens`` each (costs timed at that
    batch; the best candidates then ranked by replaying the engine's loop over that many rows,
    ``batch_latency``: a lookup level's blocks padded to the widest row, rows that fall out of step
    or finish apart; docs/design.md, "Selecting for a batch"): a draft that pays at batch 1 can
    lose to plain decoding at batch 16, where a forward over more tokens costs more.

    ``draft_tokenizers`` (one per candidate; None: the target's) with ``target_tokenizer``: a
    candidate model whose tokenizer is not the target's becomes a draft with another tokenizer
    (``OtherTokenizerDraft``, at most one), profiled as a lookup level is, with its own proposals
    through the byte bridge, and the seconds of its calls per block size (docs/design.md, "Drafts
    with another tokenizer"); like a lookup level it can only be level 0.

    An early exit (``EarlyExit``) whose verifier may start from its hidden states is offered both
    ways, as it is and recomputing (``EarlyExit(target, k, reuse=False)``, ``with_recomputing_exits``):
    the pick's drafts hold whichever the latency model predicts faster on this machine.

    ``min_gain`` (default ``MODEL_ERROR``, the model's measured error on text it was not built on):
    when the best hierarchy is predicted less than that much faster than no-draft decoding, no draft
    is chosen, with a ``NoDraftWarning`` and the reason in ``no_draft_reason`` (0 turns this off).

    A profile is only as good as the machine was quiet: the returned ``Hierarchy`` carries the
    costs' relative noise (``cost_noise``). Where the best hierarchy is predicted faster than one with
    fewer drafts (one at least) by less than ``NOISE_MARGIN`` standard errors of it, the one with
    fewer drafts is chosen (``prefer_fewer_drafts``: the two rank by chance, and fewer drafts hold
    fewer models, caches and compiled steps), with a ``ProfileNoiseWarning`` and the reason in
    ``fewer_drafts_reason``. When the pick's predicted speed-up over autoregressive decoding is within
    that margin, ``within_noise`` is set and a ``ProfileNoiseWarning`` says so."""
    unknown = set(generation_kwargs) - set(SAMPLING_KWARGS)
    _check_sizes(max_T, tree_sizes, batch)
    if unknown:
        raise ValueError(f"select_hierarchy: unsupported {sorted(unknown)}; supported: {SAMPLING_KWARGS}")
    cache = cache if cache is not None else ProfileCache()
    strings = [c for c in candidates if isinstance(c, str) and as_lookup(c) is None]
    if strings:
        raise ValueError(f"select_hierarchy: candidates are models, 'lookup' or a LookupDraft; got {strings}")
    candidates = [as_lookup(c) or c for c in candidates]
    if draft_tokenizers is not None:
        candidates = _bridged_candidates(candidates, draft_tokenizers, target_tokenizer)
    for kind, name in ((LookupDraft, "lookup"), (OtherTokenizerDraft, "other-tokenizer draft")):
        if (count := sum(isinstance(c, kind) for c in candidates)) > 1:
            raise ValueError(f"select_hierarchy: at most one {name} candidate, got {count}")
    everything = [*candidates, target]  # what the selection's indices refer to
    models = [m for m in everything if not isinstance(m, ProposalLevel)]
    context = context or prompts.shape[1]
    transform, greedy = generation_sampling(target, **generation_kwargs)
    crowds = crowd_bytes(models)
    costs = [
        cache.costs(m, context, compile, transform, greedy, batch, crowd_bytes=crowd, clock=clock)
        for m, crowd in zip(tqdm(models, desc="step costs", disable=not progress), crowds, strict=True)
    ]
    # an exit's verifier starts from its hidden states in a fixed hierarchy: priced as it runs
    timing = {"context": context, "compile": compile, "transform": transform, "greedy": greedy}
    costs = cache.with_exit_reuse(models, costs, crowds, **timing, batch=batch, clock=clock)
    run = {"new_tokens": max_new_tokens}  # rates on text as long as the run (profile.run_text)
    measuring = (models, prompts, transform, greedy, progress, generation_kwargs)
    if batch > 1:  # a batch waits for its slowest row: how far apart rows accept (docs/design.md §8.6)
        alpha, model_spread = cache.acceptance_and_spread(*measuring, **run)
    else:
        alpha, model_spread = cache.acceptance(*measuring, **run), None
    present = [i for i, c in enumerate(everything) if not isinstance(c, ProposalLevel)]  # in costs
    proposal_rows = {}  # at a batch: a proposal level's rows under each model (its slowest row)
    passed_through = {}  # (id(level), id(m), id(v)) -> v's rate on the level's proposals m passed
    for at in [i for i, c in enumerate(candidates) if isinstance(c, ProposalLevel)]:
        rates_through = cache.proposal_through(  # first: its replay also serves proposal_level
            candidates[at], models, prompts, transform, greedy, max_T, progress, generation_kwargs,
            new_tokens=max_new_tokens,
        )  # fmt: skip
        passed_through |= keyed_by_ids(candidates[at], models, rates_through)
        level_cost, rates = cache.proposal_level(
            candidates[at],
            models,
            prompts,
            transform,
            greedy,
            max_T,
            progress,
            generation_kwargs,
            batch,
            new_tokens=max_new_tokens,
            compile=compile,
            clock=clock,
        )
        model_indices = [i for i in present if not isinstance(everything[i], ProposalLevel)]
        towards = dict(zip(model_indices, rates, strict=True))  # its rates are per model, in order
        row = [towards.get(i, 0.0) for i in present]  # nothing passes between two proposal levels
        position = sum(i < at for i in present)
        costs, alpha = with_proposal_level(costs, alpha, position, level_cost, row)
        if batch > 1:
            proposal_rows[id(candidates[at])] = cache.proposal_rows(
                candidates[at], models, prompts, transform, greedy, max_T, progress, generation_kwargs,
                new_tokens=max_new_tokens,
            )  # fmt: skip
        present = sorted([*present, at])
    if tree_sizes:
        costs, alpha, everything = with_tree_candidates(
            costs, alpha, everything, tree_sizes, max_T, cache, prompts, transform, greedy, progress,
            generation_kwargs, max_new_tokens,
        )  # fmt: skip
    costs, alpha, everything = with_recomputing_exits(costs, alpha, everything)  # reuse, or not
    cache.save()
    spread = None if model_spread is None else spread_over(everything, models, model_spread, proposal_rows)
    through = through_over(everything, passed_through)
    selection = select_for_batch(costs, alpha, batch, max_T, max_new_tokens, spread, through)
    selection, no_draft_reason = prefer_no_draft(selection, MODEL_ERROR if min_gain is None else min_gain)
    noise = max(c.noise for c in costs)
    selection, fewer_drafts_reason = prefer_fewer_drafts(selection, NOISE_MARGIN * noise)
    pick = Hierarchy.bind(selection, everything, batch)
    pick = replace(pick, profile=Profile.of(everything, costs, alpha, spread, through, max_T))
    if no_draft_reason is not None:
        warnings.warn(f"select_hierarchy: {no_draft_reason}", NoDraftWarning, stacklevel=2)
        pick = replace(pick, no_draft_reason=no_draft_reason)
    if fewer_drafts_reason is not None:
        warnings.warn(f"select_hierarchy: {fewer_drafts_reason}", ProfileNoiseWarning, stacklevel=2)
        pick = replace(pick, fewer_drafts_reason=fewer_drafts_reason)
    doubt = _doubt(pick.selection, noise)
    if doubt is not None:
        warnings.warn(f"select_hierarchy: {doubt}", ProfileNoiseWarning, stacklevel=2)
    pick = replace(pick, cost_noise=noise, within_noise=doubt is not None)
    if measure:
        seconds = measured_latency(
            target, pick, prompts[:batch], max_new_tokens, compile=compile, clock=clock, batch=batch,
            generate=generate, **generation_kwargs,
        )  # fmt: skip
        pick = replace(pick, measured_latency=seconds)
    return pick


def _bridged_candidates(candidates: list, draft_tokenizers: Sequence, target_tokenizer) -> list:
    """``candidates`` with each model whose tokenizer in ``draft_tokenizers`` (one per candidate,
    None: the target's) is not the target's wrapped as an ``OtherTokenizerDraft``."""
    if isinstance(draft_tokenizers, (str, bytes)) or not isinstance(draft_tokenizers, Sequence):
        kind = type(draft_tokenizers).__name__
        raise TypeError(f"select_hierarchy: draft_tokenizers must be a list (one per candidate), got {kind}")
    if len(draft_tokenizers) != len(candidates):
        raise ValueError(
            f"select_hierarchy: draft_tokenizers needs one entry per candidate (None: the target's "
            f"tokenizer): {len(draft_tokenizers)} for {len(candidates)} candidates"
        )
    out = list(candidates)
    for i, tok in enumerate(draft_tokenizers):
        if tok is None or (target_tokenizer is not None and same_tokenizer(tok, target_tokenizer)):
            continue
        if target_tokenizer is None:
            raise ValueError("select_hierarchy: draft_tokenizers needs target_tokenizer= (the target's)")
        if not isinstance(out[i], torch.nn.Module):
            raise TypeError(
                f"select_hierarchy: draft_tokenizers[{i}] is given for a candidate that is not a model"
            )
        out[i] = OtherTokenizerDraft(out[i], tok, target_tokenizer)
    return out


def _check_sizes(max_T: int, tree_sizes: Sequence[int], batch: int) -> None:
    """The size arguments, before anything is profiled: a TypeError or ValueError naming the argument
    and its limit."""
    _check_int("max_T", max_T, MAX_BLOCK_SIZE, "MAX_BLOCK_SIZE")
    _check_int("batch", batch)
    if isinstance(tree_sizes, (str, bytes)) or not isinstance(tree_sizes, Sequence):
        raise TypeError(
            f"select_hierarchy: tree_sizes must be a list of sizes (tree_sizes=[8]), got {tree_sizes!r}"
        )
    for n in tree_sizes:
        _check_int("every tree size in tree_sizes", n, MAX_NODES, "MAX_NODES")


def _check_int(name: str, value: object, high: int | None = None, high_name: str = "") -> None:
    try:
        if isinstance(value, bool):
            raise TypeError
        number = operator.index(value)  # ints and numpy ints, not 2.0
    except TypeError:
        raise TypeError(f"select_hierarchy: {name} must be an int, got {value!r}") from None
    if number < 1 or (high is not None and number > high):
        limit = ">= 1" if high is None else f"in [1, {high}] ({high_name})"
        raise ValueError(f"select_hierarchy: {name} must be {limit}, got {number}")


def with_tree_candidates(
    costs: Sequence[Cost],
    alpha: Sequence[Sequence[Acceptance]],
    everything: Sequence[torch.nn.Module | LookupDraft],  # the candidates, the target last
    sizes: Sequence[int],
    max_T: int,
    cache: ProfileCache,
    prompts: torch.Tensor,
    transform,
    greedy: bool,
    progress: bool,
    generation_kwargs: dict | None = None,
    new_tokens: int | None = None,
) -> tuple[list[Cost], list[list[Acceptance]], list]:
    """Candidates extended by token trees (inserted before the target): for every model d and every
    model m costlier than it, and every size n, the best tree of n nodes (at most ``max_T`` deep)
    for d's rank acceptance under m, drafted by d (unless that tree is a chain: an ordinary block).
    A tree candidate can only be level 0 (its cost is a ``TreeCost``); its acceptance towards a
    model x is the tree's per-position acceptance under d's rank acceptance towards x (0 towards
    models no costlier than d, and towards the other candidates)."""
    models = [i for i, c in enumerate(everything) if not isinstance(c, ProposalLevel)]
    above = {d: [m for m in models if costs[m](1) > costs[d](1)] for d in models[:-1]}
    pairs = [(d, m) for d, ms in above.items() for m in ms]
    if not pairs:
        return list(costs), [list(row) for row in alpha], list(everything)
    ranks = cache.rank_acceptance(
        everything, pairs, prompts, transform, greedy, MAX_TREE_RANK, progress, generation_kwargs, new_tokens
    )
    found: dict[tuple[int, Tree], None] = {}
    for d, m in pairs:
        for n in sizes:
            if not any(ranks[(d, m)]):
                continue
            tree = Tree.optimal(n, ranks[(d, m)], max_depth=max_T)
            if not tree.is_chain:  # a chain is an ordinary block: already a candidate
                found[(d, tree)] = None
    top = len(everything) - 1  # new candidates go before the target
    out_costs = [*costs[:top], *(tree_cost(tree, costs[d]) for d, tree in found), costs[top]]
    out_everything = [
        *everything[:top],
        *(TreeDraft(everything[d], tree) for d, tree in found),
        everything[top],
    ]
    size = len(out_costs)
    out_alpha = [[1.0] * size for _ in range(size)]
    old = [*range(top), *([None] * len(found)), top]  # each new index's index in `alpha`
    for i, a in enumerate(old):
        for j, b in enumerate(old):
            if a is not None and b is not None:
                out_alpha[i][j] = alpha[a][b]
    for k, (d, tree) in enumerate(found):
        i = top + k
        for j, b in enumerate(old):
            rates = ranks.get((d, b)) if b is not None else None
            out_alpha[i][j] = out_alpha[j][i] = tree_acceptance(tree, rates) if rates else 0.0
    return out_costs, out_alpha, out_everything


def spread_over(
    everything: Sequence,
    models: Sequence[torch.nn.Module],
    model_spread: Sequence[Sequence[float]],
    proposal_rows: Mapping[int, Sequence[ProposalRows]] | None = None,
) -> list[list[Spread]]:
    """The spread matrix (``row_spread``) over the selection's candidates ``everything`` from the one
    measured over ``models``, and for a proposal level ``proposal_rows[id(level)]`` (its rows under
    each of ``models``, in order) towards them; 0.0 (rows alike) for a pair otherwise: a token tree,
    an exit's recomputing twin, two proposal levels, whose rows' rates were not measured apart."""
    at = {id(m): i for i, m in enumerate(models)}
    index = [at.get(id(c)) for c in everything]
    matrix: list[list[Spread]] = [
        [0.0 if i is None or j is None else model_spread[i][j] for j in index] for i in index
    ]
    for a, level in enumerate(everything):
        rows = (proposal_rows or {}).get(id(level))  # [model] the level's rows under each
        for b, m in enumerate(index):
            if rows is not None and m is not None:
                matrix[a][b] = matrix[b][a] = rows[m]
    return matrix


def keyed_by_ids(
    level: ProposalLevel,
    models: Sequence[torch.nn.Module],
    rates: Mapping[tuple[int, int], RatesThrough | None],
) -> dict[tuple[int, int, int], RatesThrough]:
    """``ProfileCache.proposal_through``'s ``rates`` for ``level`` (pairs of indices into ``models``)
    keyed by the three levels' ids, the pairs with none left out (``through_over`` places them)."""
    return {(id(level), id(models[i]), id(models[j])): r for (i, j), r in rates.items() if r is not None}


def through_over(
    everything: Sequence, passed_through: Mapping[tuple[int, int, int], RatesThrough]
) -> Through:
    """``latency.Through`` over the selection's candidates ``everything`` from rates keyed by the
    levels' ids (``keyed_by_ids``, per proposal level); a candidate made after the replay (a token
    tree, an exit's recomputing twin) has none: its pairs keep their alpha."""
    return reindexed(passed_through.items(), {id(c): i for i, c in enumerate(everything)})


def with_recomputing_exits(
    costs: Sequence[Cost],
    alpha: Sequence[Sequence[Acceptance]],
    everything: Sequence,  # the candidates, the target last
) -> tuple[list[Cost], list[list[Acceptance]], list]:
    """Candidates extended by a recomputing twin (``EarlyExit(target, k, reuse=False)``, inserted
    before the target) of every early exit whose verifier may start from its hidden states (its cost
    lists ``reused_by``): which is faster depends on the machine and the block (on an eager CPU the
    exit's catch-up forward costs more than the layers it saves), so the selector prices both and
    keeps the cheaper. A twin costs what its exit costs as a draft, with every verification of it
    in full; as a verifier it starts from a shallower exit's hidden states as its exit does (it is
    listed beside it in that exit's ``reused_by``); it accepts what its exit accepts, and nothing
    passes between the two (they are one level: acceptance 0, never stacked)."""
    top = len(everything) - 1
    index_of = {id(c): i for i, c in enumerate(costs)}
    offered = {id(level) for level in everything}
    variants = {
        i: variant
        for i in range(top)
        if getattr(costs[i], "reused_by", ())
        and (variant := recomputing_variant(everything[i])) is not None
        and id(variant) not in offered  # a candidate already
    }
    out = list(costs)
    twins: dict[int, Cost] = {}
    for i in sorted(variants, key=lambda i: -exit_of(everything[i])[1]):  # deeper first: verifiers final
        verifiers = []
        for upper, verify in costs[i].reused_by:
            j = index_of[id(upper)]
            verifiers += [(out[j], verify)] + ([(twins[j], verify)] if j in twins else [])
        out[i] = replace(costs[i], reused_by=tuple(verifiers))
        twins[i] = replace(out[i], reused_by=())
    old = [*range(top), *twins, top]  # each index's candidate in ``costs``: a twin's is its exit's
    out_alpha = [[alpha[a][b] for b in old] for a in old]
    for k, i in enumerate(twins):
        out_alpha[i][top + k] = out_alpha[top + k][i] = 0.0
    out_costs = [*out[:top], *twins.values(), out[top]]
    twin_levels = [variants[i] for i in twins]
    return out_costs, out_alpha, [*everything[:top], *twin_levels, everything[top]]


MAX_TREE_RANK = 4
"""Ranks measured for token trees: a context's fifth candidate is rarely worth a node."""


def with_proposal_level(
    costs: Sequence[Cost],
    alpha: Sequence[Sequence[Acceptance]],
    at: int,
    cost: LookupCost,
    rates: Sequence[Acceptance],
) -> tuple[list[Cost], list[list[Acceptance]]]:
    """The candidates' costs and acceptance matrix with a proposal level (a lookup level, a draft with
    another tokenizer) put in as candidate ``at``: its cost, and its ``rates`` towards every candidate
    already in (both ways, so the matrix stays symmetric)."""
    with_costs = [*costs[:at], cost, *costs[at:]]
    with_alpha = [[*row[:at], rates[i], *row[at:]] for i, row in enumerate(alpha)]
    with_alpha.insert(at, [*rates[:at], 1.0, *rates[at:]])
    return with_costs, with_alpha


MODEL_ERROR = 0.15
"""The latency model's error on text it was not built on: the median |measured / predicted - 1| of
the five best-predicted hierarchies on the varied-text sets, 0.145 over both committed tables
(greedy compiled 0.23, temperature 0.8 eager 0.14: ``bench/bench_select_text.py``,
bench/results/select_text_cpu*.md). A pick predicted to gain less than this over no-draft decoding
cannot be told apart from it, so no draft is chosen (``select_hierarchy(min_gain=)``)."""

NOISE_MARGIN = 3.0
"""How many standard errors of the costs a predicted advantage must exceed to count. Both latencies
of a ratio carry the costs' noise (their ratio about sqrt(2) times it): three standard errors keep a
choice made on noise rare."""


def _doubt(selection: Selection, noise: float) -> str | None:
    """Why the pick's predicted advantage over autoregressive decoding cannot be told from the costs'
    noise; None when it can. (Over a chain with fewer drafts it always can: ``prefer_fewer_drafts``
    chose that chain otherwise.)"""
    margin = NOISE_MARGIN * noise
    if len(selection.chain) >= 2 and selection.speedup_over_ar - 1 < margin:
        return (
            f"the pick's predicted speed-up over autoregressive decoding ({selection.speedup_over_ar:.3f}x) "
            f"is within the noise of the measured step costs (+-{margin:.1%} at {NOISE_MARGIN:g} standard "
            "errors): the choice may be noise; profile on a quieter machine or with more repeats"
        )
    return None
