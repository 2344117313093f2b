"""The HSD loop (docs/design.md, "The algorithm") over a stack of per-level runners, driven by the C++ ledger.

    while some row is unfinished:
        level = ledger.next_level()                  # lockstep: one level's forward at a time
        logits = runners[level].forward(its rows' spans of uncached tokens)
        level 0:  draw one token per row            -> ledger.commit_draft
        else:     verify the block of tag level-1   -> ledger.commit_verify (rollback, flush, end)

The ledger (integers only) decides what to feed and what to keep; this module moves the tensors:
the token buffer, and for every speculative token the distribution ``p`` of the level that tagged it
(processed logits + fp32 log-sum-exp), kept in a ring buffer over the speculative window. That
distribution is the ``q`` the next level up verifies against.
"""

from __future__ import annotations

import functools
import operator
import time
import warnings
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from hsd_fast._C import Ledger
from hsd_fast.decode_state import DecodeState
from hsd_fast.layout import capacity_bucket
from hsd_fast.level_step import LevelStep
from hsd_fast.lookup import LookupDraft, LookupProposer
from hsd_fast.processors import LogitsTransform
from hsd_fast.sampling_metadata import SamplingMetadata
from hsd_fast.schedule import draft_count, drafts_wanted
from hsd_fast.stats import HSDStats
from hsd_fast.steps import Runner
from hsd_fast.tree import Tree
from hsd_fast.tree_plan import TreeBuffers, TreePlan
from hsd_fast.triton_kernels.tree_torch import COLUMN_SHIFT


@dataclass
class HSDResult:
    sequences: list[torch.Tensor]  # per row: prompt + generated tokens, [len] int64
    num_new_tokens: list[int]
    stats: HSDStats


MAX_BLOCK_SIZE = 64
"""The largest block size T_i accepted. A verification gains at most 1 / (1 - alpha) tokens on
average (20 at alpha = 0.95), so a longer block only adds drafting that is thrown away, while the
ring of draft distributions grows with the block sizes (``speculative_window``)."""


def check_block_sizes(block_sizes: Sequence[int], num_drafts: int, name: str = "block_sizes") -> list[int]:
    """``block_sizes`` as a list of ints, one per draft level, each in [1, MAX_BLOCK_SIZE]; otherwise
    a TypeError or ValueError naming the argument (``name``: ``T`` on the Hugging Face API)."""
    if isinstance(block_sizes, (str, bytes)):
        raise TypeError(f"{name} must be a list of ints (one block size per draft), got a string")
    try:
        values = list(block_sizes)
    except TypeError:
        raise TypeError(f"{name} must be a list of ints (one block size per draft), got "
                        f"{type(block_sizes).__name__}") from None  # fmt: skip
    sizes = []
    for value in values:
        try:
            if isinstance(value, bool):
                raise TypeError
            sizes.append(operator.index(value))  # ints, numpy ints, integer 0-d tensors; not 2.0
        except TypeError:
            raise TypeError(f"{name} must hold ints, got {value!r} in {values}") from None
    if len(sizes) != num_drafts:
        raise ValueError(f"{name} needs one block size per draft ({num_drafts}), got {len(sizes)}: {sizes}")
    if any(not 1 <= t <= MAX_BLOCK_SIZE for t in sizes):
        raise ValueError(f"every block size in {name} must be >= 1 and <= {MAX_BLOCK_SIZE}, got {sizes}")
    return sizes


def speculative_window(block_sizes: Sequence[int], max_new_tokens: int | None = None) -> int:
    """Ring size for per-position draft distributions. Level 0 holds at most T_0 pending tokens;
    a verification by level i adds at most (pending of level i-1) + 1 to a level that held fewer
    than T_i, so level i holds at most T_0 + ... + T_i. +2 covers the bonus slot and one beyond.
    The live positions of a row lie in [prompt, prompt + max_new_tokens] (docs/design.md, "Caches
    and slots"), so ``max_new_tokens + 1`` slots always suffice. Both bounds are rounded up to a power
    of two: the ring's size is in every compiled step of a sampled run, and rounding lets hierarchies
    with nearby block sizes and requests of similar lengths share their graphs."""
    window = 1 << (int(np.cumsum(block_sizes).sum()) + 1).bit_length()
    if max_new_tokens is not None:
        window = min(window, 1 << int(max_new_tokens + 1).bit_length())
    return window


def run_hsd(
    runners: Sequence[Runner | LookupDraft],
    prompts: Sequence[torch.Tensor],
    *,
    block_sizes: Sequence[int],
    max_new_tokens: int | Sequence[int],
    eos_token_id: int | Sequence[int] | None = None,
    seeds: torch.Tensor | int = 0,
    temperature: float | torch.Tensor = 1.0,
    greedy: bool = False,
    policy: str = "most_rows",
    on_commit: Callable[[int, torch.Tensor], None] | None = None,
    use_kernel: bool | None = None,
    transform: LogitsTransform | None = None,
    compile: bool | str = "auto",
    tree: Tree | None = None,
) -> HSDResult:
    """Generate with the hierarchy ``runners`` (level 0 drafts, the last is the target). The first
    may be a ``LookupDraft``: a model-free level 0 that proposes from each row's own context.

    ``block_sizes[i]`` is T_i: level i+1 verifies once level i has emitted at least T_i tokens.
    ``seeds``: one int (row seeds derived from it) or one int64 per row. ``temperature``: one float
    or one per row, applied to the runners' logits. ``on_commit(row, tokens)`` is called with every
    row's newly committed tokens, in order, as the target commits them (streaming): a view of the
    run's buffer, valid during the call (a later run may reuse the buffer: copy what you keep).
    ``use_kernel``: draft and verify with the Triton kernels (default: on CUDA tensors) or the torch
    references.
    ``transform``: the sampling transform (HF logits processors) every level applies to its logits.
    ``compile``: run the level steps through ``torch.compile`` (``True``), eagerly (``False``), or
    ``"auto"``: eagerly until this hierarchy has spent ``AUTO_COMPILE_AFTER_SECONDS`` decoding, then
    compiled (docs/design.md, "Compiled steps": why). ``tree``: level 0 drafts this token tree and
    level 1 verifies it in one forward (docs/design.md, "Token trees in the engine");
    ``block_sizes[0]`` is then ignored (level 1 verifies once the tree is drafted).
    """
    num_levels, num_rows = len(runners), len(prompts)
    if num_levels < 1:
        raise ValueError("need at least one runner (the target)")
    lookup_spec = runners[0] if isinstance(runners[0], LookupDraft) else None
    models = runners[1:] if lookup_spec is not None else runners  # the levels that run a model
    if not models or any(isinstance(r, LookupDraft) for r in models):
        raise ValueError("a LookupDraft can only be the first level, under at least one model")
    vocab = runners[-1].vocab_size
    if any(r.vocab_size != vocab for r in models):
        raise ValueError(f"runners disagree on vocab_size: {[r.vocab_size for r in models]}")
    block_sizes = check_block_sizes(block_sizes, num_levels - 1)
    if tree is not None:
        if not isinstance(tree, Tree):
            raise TypeError(f"tree must be a hsd_fast.Tree, got {type(tree).__name__}")
        if lookup_spec is not None or num_levels < 2:
            raise ValueError("a token tree is drafted by a model at level 0: give at least one draft model")
        if tree.depth > MAX_BLOCK_SIZE:
            raise ValueError(f"a token tree may be at most {MAX_BLOCK_SIZE} deep, got {tree.depth}")
        block_sizes[0] = tree.depth  # the ledger takes the tree as a proposal of `depth` tokens
    if not prompts:
        raise ValueError("the batch needs at least one row (prompts is empty)")
    budget = np.broadcast_to(_token_counts(max_new_tokens, "max_new_tokens"), (num_rows,))
    prompt_lens = np.array([p.numel() for p in prompts], dtype=np.int64)
    budget_end = prompt_lens + budget  # [B] where each row's length budget ends
    if tree is not None and int(budget_end.max()) + tree.depth >= 1 << COLUMN_SHIFT:  # the keys' field
        raise ValueError(f"token trees need positions below 2**{COLUMN_SHIFT}")
    ledger = Ledger(num_levels, block_sizes, prompt_lens.tolist(), budget.tolist(), policy)
    sampling = SamplingMetadata.build(
        num_rows, prompts[0].device, seeds, temperature, eos_token_id, greedy, use_kernel
    )
    # Every check is done and the runners have refused what their models cannot hold before the
    # run's buffers are allocated. A level feeds positions up to budget_end - 1 (the last draft of a
    # full budget, for the bonus after it): budget_end positions per row in each cache.
    for level, runner in enumerate(runners):  # levels 0 and 1 keep a pending tree after the prefix
        if runner is not lookup_spec:
            runner.prepare(num_rows, int(budget_end.max()), tree.num_nodes if tree and level <= 1 else 0)
    # +1: a bonus drawn past the length budget is written to the token buffer before the ledger drops it
    capacity = int(budget_end.max()) + 1
    positions = capacity_bucket(capacity)  # in every compiled step's shapes: a few sizes only
    transform = transform or LogitsTransform()
    # The ring keeps a model level's p for the level above; a lookup level's q is implicit (point masses)
    keep_q = len(models) > (1 if tree is None else 2) and not greedy  # a tree keeps its own q
    ring_dtype = torch.float32 if transform.processors else _widest(r.dtype for r in models)
    window = speculative_window(block_sizes, int(budget.max()))
    state = DecodeState(prompts, positions, window, vocab, ring_dtype, sampling, transform, keep_q)
    if tree is not None:
        plan = TreePlan.of(tree, state.tokens.device)
        state.set_tree(TreeBuffers(plan, num_rows, vocab, ring_dtype, greedy))
    compiled = _decide_compile(compile, runners, block_sizes)
    above_lookup = 1 if lookup_spec is not None else None  # the level that verifies point masses
    tree_below = runners[0] if tree is not None else None  # level 1 moves level 0's cache too
    steps = [
        None
        if runner is lookup_spec
        else LevelStep.of(
            runner, level, num_levels - 1, compiled, level == above_lookup, tree_below if level == 1 else None
        )
        for level, runner in enumerate(runners)
    ]
    most_drawn = draft_count(block_sizes)  # per draft step
    lookup = None
    if lookup_spec is not None:
        lookup = LookupProposer(lookup_spec, num_rows, sampling.eos_ids.tolist())

    log = _RoundLog(num_levels)
    emitted = prompt_lens.copy()  # per row: tokens already handed to on_commit
    broken_levels: set[int] = set()  # draft levels whose logits broke in this run (warned once each)
    with torch.inference_mode():
        round_start = time.perf_counter()
        while (level := ledger.next_level()) >= 0:
            rows = ledger.rows_for(level)
            starts, ends, outs = ledger.spans(level, rows)
            if level == 0 and lookup is not None:
                wanted = drafts_wanted(ledger, rows, budget_end, block_sizes)
                started = time.perf_counter()
                proposals, counts, last_is_eos = lookup.propose(state.tokens, rows, ends, wanted)
                state.write_proposals(rows, ends, proposals, counts)
                ledger.commit_proposal(rows, counts, last_is_eos)
                inside = time.perf_counter() - started
                log.proposed(counts)
            elif level == 0 and tree is not None:
                wanted = drafts_wanted(ledger, rows, budget_end, block_sizes)
                (proposed, _, broken), inside = steps[0](state, rows, starts, ends, outs, wanted)
                # a row's tree is cut above broken logits (tree_draft_step): the rest is proposed
                _check_logits(runners, level, rows, broken, broken_levels)
                ledger.commit_proposal(rows, proposed, np.zeros_like(proposed))
                log.drafted_tree(starts, ends, tree)
            elif level == 0:
                wanted = drafts_wanted(ledger, rows, budget_end, block_sizes)
                (drawn, last_is_eos, broken), inside = steps[0](
                    state, rows, starts, ends, outs, wanted, count=most_drawn
                )
                stopped = _check_logits(runners, level, rows, broken, broken_levels)
                for k in range(int(drawn.max())):  # the ledger takes drafts one at a time
                    now = ~stopped & (drawn > k)
                    ledger.commit_draft(rows[now], last_is_eos[now] & (drawn[now] == k + 1))
                if stopped.any():  # drafting stopped before broken logits: the block closes there
                    ledger.commit_proposal(rows[stopped], drawn[stopped], last_is_eos[stopped])
                log.drafted(starts, ends, drawn)
            else:
                result, inside = steps[level](state, rows, starts, ends, outs)
                accepted, is_eos, broken = result[:3]  # [R] each
                # what a draft level emitted from broken logits is kept as point masses (verify_step)
                _check_logits(runners, level, rows, broken, broken_levels)
                if tree is not None and level == 1:
                    log.ranked(result[3:])  # [depth, R] the rank of each accepted node
                kept, cascaded = ledger.commit_verify(level, rows, accepted, is_eos)
                log.verified(level, starts, ends, outs, accepted, kept, cascaded)
                if lookup is not None:  # the emitted token replaced whatever stood at its position
                    lookup.invalidate(rows, outs + 1 + accepted)
            if on_commit is not None and level == num_levels - 1:
                lens = ledger.output_lens()
                for r in np.flatnonzero(lens > emitted):
                    on_commit(int(r), state.tokens[r, emitted[r] : lens[r]])
                emitted = np.maximum(emitted, lens)
            round_end = time.perf_counter()
            log.timed(level, round_end - round_start, inside)
            round_start = round_end

    stats = log.stats()
    if compiled:
        LevelStep.compile_progress_done()
    elif compile == "auto":
        _count_eager(runners, block_sizes, sum(stats.wall_time))
    lens = ledger.output_lens()
    sequences = [state.tokens[r, : lens[r]].clone() for r in range(num_rows)]
    return HSDResult(sequences, (lens - prompt_lens).tolist(), stats)


class _RoundLog:
    """What every round did, kept raw and summed into ``HSDStats`` once at the end: a round's own
    host work stays a few list appends."""

    def __init__(self, num_levels: int) -> None:
        self.num_levels = num_levels
        self.spans: list[list[np.ndarray]] = [[] for _ in range(num_levels)]  # fed tokens per row
        self.verifies: list[list[tuple]] = [[] for _ in range(num_levels)]
        self.times: list[list[tuple[float, float]]] = [[] for _ in range(num_levels)]
        self.lookups: list[int] = []  # tokens proposed per lookup round
        self.tree_nodes = 0  # token-tree nodes drafted
        self.ranks: list[np.ndarray] = []  # [depth, R] per tree verification: accepted nodes' ranks

    def drafted(self, starts: np.ndarray, ends: np.ndarray, drawn: np.ndarray) -> None:
        for k in range(int(drawn.max())):  # one lockstep forward per token drawn
            self.spans[0].append(ends - starts if k == 0 else np.ones(int((drawn > k).sum()), dtype=np.int64))

    def drafted_tree(self, starts: np.ndarray, ends: np.ndarray, tree: Tree) -> None:
        """A token tree drafted: the catch-up forward, then one forward per depth but the last."""
        self.spans[0].append(ends - starts)
        for width in tree.widths[:-1]:
            self.spans[0].append(np.full(len(ends), width, dtype=np.int64))
        self.tree_nodes += len(ends) * tree.num_nodes

    def ranked(self, ranks: np.ndarray) -> None:
        self.ranks.append(ranks)

    def proposed(self, counts: np.ndarray) -> None:
        """A lookup round: no forward, ``counts`` [R] tokens proposed."""
        self.spans[0].append(np.zeros(len(counts), dtype=np.int64))
        self.lookups.append(int(counts.sum()))

    def verified(self, level: int, starts, ends, outs, accepted, kept, cascaded) -> None:
        self.spans[level].append(ends - starts)
        self.verifies[level].append((ends - outs - 1, accepted, kept, cascaded))

    def timed(self, level: int, wall: float, inside_step: float) -> None:
        self.times[level].append((wall, inside_step))

    def stats(self) -> HSDStats:
        stats = HSDStats(self.num_levels)
        for level in range(self.num_levels):
            for fed in self.spans[level]:
                stats.record_forward(level, len(fed), int(fed.sum()))
            if level == 0 and self.lookups:  # a lookup level: its rounds, no forwards
                stats.record_draft(sum(self.lookups))
            elif level == 0 and self.tree_nodes:
                stats.record_draft(self.tree_nodes)
            elif level == 0:
                stats.record_draft(int(sum(len(fed) for fed in self.spans[0])))
            elif self.verifies[level]:
                stats.record_verify(
                    level, *(np.concatenate(parts) for parts in zip(*self.verifies[level], strict=True))
                )
            for wall, inside in self.times[level]:
                stats.record_time(level, wall, inside)
        if self.ranks:
            stats.record_ranks(np.concatenate([r.ravel() for r in self.ranks]))
        return stats


AUTO_COMPILE_AFTER_SECONDS = 60.0
"""``compile="auto"`` decodes eagerly until a hierarchy has spent this long, then compiles it: the
rent-or-buy rule (pay for the eager path until it has cost what compiling costs, then buy). Compiling
a hierarchy's steps (about three graphs for one draft at batch 1, 20-30 s each on 2 CPU cores, and
frozen graphs are not cached across processes: docs/design.md, "Compiled steps") costs about a
minute; whatever the request lengths, the total time stays within twice that of the better choice
in hindsight."""
# target runner -> {(ids of the drafts' runners, block sizes): seconds decoded eagerly}; weak, so a
# dropped model takes its record with it
_EAGER_SECONDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _decide_compile(compile: bool | str, runners: Sequence[Runner], block_sizes: Sequence[int]) -> bool:
    if compile == "auto":
        spent = _EAGER_SECONDS.get(runners[-1], {}).get(_hierarchy_key(runners, block_sizes), 0.0)
        return spent >= AUTO_COMPILE_AFTER_SECONDS
    if not isinstance(compile, bool):
        raise ValueError(f"compile must be True, False or 'auto', got {compile!r}")
    return compile


def _hierarchy_key(runners: Sequence[Runner | LookupDraft], block_sizes: Sequence[int]) -> tuple:
    # a lookup level by value: `drafts=["lookup"]` makes a new LookupDraft per request
    return (*(r if isinstance(r, LookupDraft) else id(r) for r in runners[:-1]), *block_sizes)


def _count_eager(runners: Sequence[Runner], block_sizes: Sequence[int], seconds: float) -> None:
    spent = _EAGER_SECONDS.setdefault(runners[-1], {})
    key = _hierarchy_key(runners, block_sizes)
    spent[key] = spent.get(key, 0.0) + seconds


def _check_logits(
    runners: Sequence[Runner | LookupDraft],
    level: int,
    rows: np.ndarray,  # [R]
    broken: np.ndarray,  # [R] the step's flags: the row met a NaN or +inf in its logits
    broken_levels: set[int],
) -> np.ndarray:  # [R] bool
    """The rows whose step met broken logits (a NaN or +inf: no distribution). At the target that
    ends the run, as in HF. At a draft level the step has already made them harmless: nothing drawn
    from them is proposed, and what a verifier emitted from them goes up as a point mass
    (docs/design.md, "Why it is exact"); the first time a level breaks in a run, a warning. The flags
    come back with the step's results: no extra sync."""
    bad = broken.astype(bool)
    if not bad.any():
        return bad
    where, model = rows[bad].tolist()[:8], type(getattr(runners[level], "model", runners[level])).__name__
    if level == len(runners) - 1:
        raise FloatingPointError(
            f"level {level} produced NaN or +inf logits for rows {where}: the target ({model}) or its inputs "
            "are numerically broken, and nothing sampled from it can be trusted"
        )
    if level not in broken_levels:
        broken_levels.add(level)
        warnings.warn(
            f"hsd_fast: draft level {level} ({model}) produced NaN or +inf logits for rows {where} (warned "
            "once per run): nothing drawn from them is proposed, so the output is still the target's, but "
            "this level's work is wasted; check the model's weights and dtype",
            RuntimeWarning,
            stacklevel=3,
        )
    return bad


def _token_counts(value: int | Sequence[int], name: str) -> np.ndarray:
    """Non-negative integer counts (one, or one per row) as int64, or a TypeError/ValueError naming them."""
    counts = np.asarray(value)
    if counts.dtype == bool or not np.issubdtype(counts.dtype, np.integer) or counts.ndim > 1:
        raise TypeError(f"{name} must be an int or one int per row, got {value!r}")
    if (counts < 0).any():
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return counts.astype(np.int64)


def _widest(dtypes) -> torch.dtype:
    """The dtype every level's logits fit in (levels may differ)."""
    return functools.reduce(torch.promote_types, dtypes)
