"""The HSD loop (docs/design.md, "The algorithm") over a stack of per-level runners, driven by the C++ ledger.

    while some row is unfinished:
        level = ledger.next_level()                  # lockstep: one level's forward at a time
        logits = runners[level].forward(its rows' spans of uncached tokens)
        level 0:  draw one token per row            -> ledger.commit_draft
        else:     verify the block of tag level-1   -> ledger.commit_verify (rollback, flush, end)

(``round_steps.py`` runs and commits each step; where level 1 verifies what level 0 is about to
draft, it launches the two back to back and reads them once.)

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

from hsd_fast import compile_price
from hsd_fast._C import Ledger
from hsd_fast.compile_policy import compile_seconds
from hsd_fast.decode_state import DecodeState
from hsd_fast.layout import capacity_bucket
from hsd_fast.level_step import LevelStep
from hsd_fast.lookup import LookupDraft
from hsd_fast.probes import probe
from hsd_fast.processors import LogitsTransform
from hsd_fast.proposal_level import ProposalLevel
from hsd_fast.round_log import RoundLog
from hsd_fast.round_steps import Chain, run_step
from hsd_fast.sampling_metadata import SamplingMetadata
from hsd_fast.stats import HSDStats
from hsd_fast.steps import Runner
from hsd_fast.stopping import StopChecker
from hsd_fast.switching import Switcher, take_run
from hsd_fast.switching_types import Adaptive, Choice, Probe
from hsd_fast.target_outputs import NO_OUTPUTS, OutputRequest, TargetOutputs
from hsd_fast.tree import Tree
from hsd_fast.tree_plan import TreeBuffers, TreePlan
from hsd_fast.triton_kernels.tree_torch import COLUMN_SHIFT


@dataclass
class HSDResult:
    sequences: list[torch.Tensor]  # per row: prompt + generated tokens, [len] int64
    num_new_tokens: list[int]
    stats: HSDStats
    outputs: TargetOutputs | None = None  # the target's scores / logits per new token (``outputs=``)


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
    runners: Sequence[Runner | ProposalLevel],
    prompts: Sequence[torch.Tensor],
    *,
    block_sizes: Sequence[int] | None = None,
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
    adapt: Adaptive | None = None,
    stop: StopChecker | None = None,
    outputs: OutputRequest = NO_OUTPUTS,
) -> HSDResult:
    """Generate with the hierarchy ``runners`` (level 0 drafts, the last is the target). The first
    may be a proposal level (``ProposalLevel``): a level 0 that proposes from the host, such as a
    ``LookupDraft`` (continuations found in each row's own context) or an ``OtherTokenizerDraft``.

    ``block_sizes[i]`` is T_i: level i+1 verifies once level i has emitted at least T_i tokens.
    ``seeds``: one int (row seeds derived from it) or one int64 per row. ``temperature``: one float
    or one per row, applied to the runners' logits. ``on_commit(row, tokens)`` is called with every
    row's newly committed tokens, in order, as the target commits them (streaming): a view of the
    run's buffer, valid during the call (a later run may reuse the buffer: copy what you keep).
    ``use_kernel``: draft and verify with the Triton kernels (default: on CUDA tensors) or the torch
    references.
    ``transform``: the sampling transform (HF logits processors) every level applies to its logits.
    ``compile``: run the level steps through ``torch.compile`` (``True``), eagerly (``False``), or
    ``"auto"``: eagerly until this hierarchy has spent decoding what compiling it costs (what the last
    process that compiled it spent, ``compile_price.py``, at most ``AUTO_COMPILE_AFTER_SECONDS``),
    then compiled (docs/design.md, "Compiled steps": why). ``tree``: level 0 drafts this token tree and
    level 1 verifies it in one forward (docs/design.md, "Token trees in the engine");
    ``block_sizes[0]`` is then ignored (level 1 verifies once the tree is drafted).
    ``adapt``: the hierarchy may change between rounds. ``runners`` are then the candidates (smallest
    first) and the target, ``adapt.policy`` chooses every round's hierarchy over them, and
    ``block_sizes`` and ``tree`` are not given (docs/design.md, "Switching hierarchies").
    ``stop``: stopping criteria beyond EOS and the length budget, replayed on every row's committed
    tokens after each of the target's commits; a row they stop is finished there, as at an EOS
    (docs/design.md, "EOS, the length budget and flushing").
    ``outputs``: keep the target's scores and/or raw logits at every token it emits
    (``HSDResult.outputs``; HF's ``output_scores`` / ``output_logits``).
    """
    _check_runners(runners)
    candidates, target = list(runners[:-1]), runners[-1]
    if adapt is None:
        block_sizes = check_block_sizes([] if block_sizes is None else block_sizes, len(candidates))
        _check_tree(tree, runners)
        start: Choice | None = Choice(tuple(range(len(candidates))), tuple(block_sizes), tree)
        trees = () if tree is None else (tree,)
        widest = start.block_sizes  # the block sizes the ring of draft distributions is sized for
    else:
        if block_sizes is not None or tree is not None:
            raise ValueError(
                "an adaptive run takes its block sizes and trees from adapt=, not block_sizes=/tree="
            )
        if isinstance(runners[0], ProposalLevel) and not isinstance(runners[0], LookupDraft):
            kind = type(runners[0]).__name__
            raise ValueError(f"an adaptive run's candidates can hold a lookup level, not a {kind}")
        for t in adapt.trees:
            _check_tree(t, runners, adaptive=True)
        start, trees, widest = adapt.start, adapt.trees, [adapt.max_T] * len(candidates)
    if not prompts:
        raise ValueError("the batch needs at least one row (prompts is empty)")
    num_rows = len(prompts)
    budget = np.broadcast_to(_token_counts(max_new_tokens, "max_new_tokens"), (num_rows,))
    prompt_lens = np.array([p.numel() for p in prompts], dtype=np.int64)
    budget_end = prompt_lens + budget  # [B] where each row's length budget ends
    if trees and int(budget_end.max()) + max(t.depth for t in trees) >= 1 << COLUMN_SHIFT:  # the keys' field
        raise ValueError(f"token trees need positions below 2**{COLUMN_SHIFT}")
    # an adaptive run's policy may have served runs before it (the latency controller serves a
    # process's requests): with the same seed they must not share keys (docs/design.md, §3.7)
    runs_before = take_run(adapt.policy) if adapt is not None else 0
    sampling = SamplingMetadata.build(
        num_rows, prompts[0].device, seeds, temperature, eos_token_id, greedy, use_kernel, runs_before
    )
    # Every check is done and the runners have refused what their models cannot hold before the
    # run's buffers are allocated. A level feeds positions up to budget_end - 1 (the last draft of a
    # full budget, for the bonus after it): budget_end positions per row in each cache. Levels 0 and
    # 1 keep a pending tree after the prefix (in an adaptive run, any level may be level 0 or 1).
    tree_slots = max((t.num_nodes for t in trees), default=0)
    for level, runner in enumerate(runners):
        if not isinstance(runner, ProposalLevel):
            runner.prepare(num_rows, int(budget_end.max()), tree_slots if adapt or level <= 1 else 0)
    # +1: a bonus drawn past the length budget is written to the token buffer before the ledger drops it
    capacity = int(budget_end.max()) + 1
    positions = capacity_bucket(capacity)  # in every compiled step's shapes: a few sizes only
    transform = transform or LogitsTransform()
    models = [r for r in runners if not isinstance(r, ProposalLevel)]
    # The ring keeps a model level's p for the level above, and a proposal level's q where it draws
    # from one; a lookup level's q is implicit (point masses), and a tree keeps its own q
    proposal_q = isinstance(runners[0], ProposalLevel) and runners[0].draws_q(greedy)
    keep_q = not greedy and (len(models) > (2 if adapt is None and tree is not None else 1) or proposal_q)
    ring_dtype = torch.float32 if transform.processors else _widest(r.dtype for r in models)
    window = speculative_window(widest, int(budget.max()))
    state = DecodeState(
        prompts, positions, window, target.vocab_size, ring_dtype, sampling, transform, keep_q,
        outputs=outputs, max_new=int(budget.max()),
    )  # fmt: skip
    device = state.tokens.device
    tree_buffers = {
        t: TreeBuffers(TreePlan.of(t, device), num_rows, target.vocab_size, ring_dtype, greedy) for t in trees
    }
    sizes_key = widest if adapt is None else ADAPTIVE  # the block sizes in compile="auto"'s records
    compiled = _decide_compile(compile, runners, sizes_key)
    compiling_before = compile_seconds()
    if compiled and transform.needs_prefixes:
        names = [type(transform.processors[i]).__name__ for i in transform.general]
        warnings.warn(
            f"hsd_fast: {names} run per position on the host, so this run's steps are not compiled "
            "(docs/design.md, 'Sampling transforms')",
            stacklevel=2,
        )
        compiled = False
    proposer = (
        runners[0].proposer(num_rows, sampling, compiled, transform)
        if isinstance(runners[0], ProposalLevel)
        else None
    )

    switcher = None
    if adapt is not None:  # the policy's first choice, or the given one, checked
        has_lookup = proposer is not None
        prober = None
        if greedy and not trees:  # a probe scores argmax agreement (docs/design.md, "Probes")
            prober = functools.partial(_probe_candidate, runners, state, prompt_lens, adapt.max_T)
        switcher = Switcher(len(candidates), adapt, has_lookup, prompt_lens, budget_end, state.tokens, prober)
        start = switcher.first()
    assert start is not None

    def chain_of(choice: Choice) -> Chain:
        chain = [*(runners[i] for i in choice.drafts), target]
        above_proposals = 1 if _point_masses(chain[0], greedy) else None  # verifies point masses
        tree_below = chain[0] if choice.tree is not None else None  # level 1 moves level 0's cache too
        steps = [
            None
            if isinstance(runner, ProposalLevel)
            else LevelStep.of(
                runner,
                level,
                len(chain) - 1,
                compiled,
                level == above_proposals,
                tree_below if level == 1 else None,
            )
            for level, runner in enumerate(chain)
        ]
        catch_up = _reuse_exits(chain, steps, choice, compiled, reuse=adapt is None)
        state.set_tree(tree_buffers.get(choice.tree))
        # Level 1 verifies level 0's draft unread (round_steps.draft_and_verify) where both run a
        # model, drafting a chain, level 1 recomputing.
        paired = len(chain) > 1 and None not in steps[:2] and choice.tree is None
        return Chain(choice, chain, choice.block_sizes, steps, catch_up, paired and not catch_up[1])

    if switcher is not None and compiled:  # no switch may wait for a compiler: compile after the run
        state.deferred = set()
    chain = chain_of(start)
    ledger = Ledger(len(chain.runners), chain.block_sizes, prompt_lens.tolist(), budget.tolist(), policy)
    if switcher is not None:
        switcher.begin(start, sampling)
    logs = [(start, RoundLog(len(chain.runners)))]
    emitted = prompt_lens.copy()  # per row: tokens already handed to on_commit
    broken: set[int] = set()  # draft levels whose logits broke in this run (warned once each)
    with torch.inference_mode():
        while True:
            log = logs[-1][1]
            round_start = time.perf_counter()
            while (level := ledger.next_level()) >= 0:
                rows = ledger.rows_for(level)
                done = run_step(chain, level, rows, ledger, state, proposer, budget_end, log, broken)
                if done[-1].level == chain.top:
                    if stop is not None:
                        _stop_rows(stop, state.tokens, ledger, rows)
                    if on_commit is not None:
                        lens = _output_lens(ledger, stop)
                        for r in np.flatnonzero(lens > emitted):
                            on_commit(int(r), state.tokens[r, emitted[r] : lens[r]])
                        emitted = np.maximum(emitted, lens)
                    if switcher is not None:  # these rows' round ends: at a look they wait for the others
                        held = switcher.rounds_ended(rows)
                        if len(held):
                            ledger.hold(held)
                round_end = time.perf_counter()
                around = round_end - round_start - sum(step.wall for step in done)  # the loop's own work
                for step in done:
                    log.timed(step.level, step.wall + around * (step is done[-1]), step.inside, step.size)
                round_start = round_end
            if switcher is None or ledger.all_finished() or (stop is not None and stop.stopped.all()):
                break
            # every unfinished row has ended its round: the policy looks, the ledger takes its choice
            looked = time.perf_counter()
            choice = switcher.round_end(ledger, chain.choice, log, state.warm_up_steps)
            if choice != chain.choice:
                chain = chain_of(choice)
                logs.append((choice, RoundLog(len(chain.runners))))
                switcher.used[-1].switch_seconds = time.perf_counter() - looked
            if stop is not None:  # reconfiguring released every hold: the stopped rows stay out
                _stop_rows(stop, state.tokens, ledger, np.flatnonzero(stop.stopped))
            switcher.looked(time.perf_counter() - looked)
        if switcher is not None:
            switcher.finish(ledger, chain.choice, log, state.warm_up_steps)
        if state.deferred:  # inside inference mode, as the steps will run
            LevelStep.compile_deferred(state)

    if switcher is None:
        stats = logs[0][1].stats()
        stats.bridge_seconds = getattr(proposer, "bridge_seconds", 0.0)
        stats.chain_drafted, stats.chain_accepted = getattr(proposer, "chain_counts", (0, 0))
    else:
        lifted = [log.stats().lifted(switcher.levels_of(c), len(runners)) for c, log in logs]
        stats = functools.reduce(operator.add, lifted)
        stats.hierarchies, stats.look_seconds = switcher.used, switcher.look_seconds
        stats.probe_seconds = switcher.probe_seconds
    if compiled:
        LevelStep.compile_progress_done()
        _count_compiling(runners, sizes_key, compile_seconds() - compiling_before)
    elif compile == "auto":
        _count_eager(runners, sizes_key, sum(stats.wall_time))
    lens = _output_lens(ledger, stop)
    sequences = [state.tokens[r, : lens[r]].clone() for r in range(num_rows)]
    return HSDResult(sequences, (lens - prompt_lens).tolist(), stats, state.outputs)


def _reuse_exits(
    chain: list[Runner | ProposalLevel],
    steps: list[LevelStep | None],
    choice: Choice,
    compiled: bool,
    reuse: bool,
) -> list[list[tuple[int, LevelStep]]]:
    """Where a level verifies an early exit of its own model, its step becomes one that starts from
    the exit's hidden states (``Runner.reuse_of``), and the levels to catch up first are returned
    at that level: the exit, and below it whatever the exit's own step reads hidden states from
    (``EarlyExit(t, 1)`` under ``EarlyExit(t, 3)`` under ``t``), bottom up. Not in an adaptive run
    (the upper level's layers below the exit are not kept, and a later hierarchy would need them),
    and not where the pair drafts and verifies a token tree (the exit never feeds a tree's
    leaves)."""
    catch_up: list[list[tuple[int, LevelStep]]] = [[] for _ in chain]
    for level in range(1, len(chain) if reuse else 0):
        lower, upper = chain[level - 1], chain[level]
        if steps[level - 1] is None or (choice.tree is not None and level == 1):
            continue
        reusing = getattr(upper, "reuse_of", None)
        runner = reusing(lower) if reusing is not None else None
        if runner is not None:
            steps[level] = LevelStep.of(runner, level, len(chain) - 1, compiled)  # lower: a model
            catch_up[level] = [*catch_up[level - 1], (level - 1, steps[level - 1])]
    return catch_up


def _point_masses(level: object, greedy: bool) -> bool:
    """Whether the level above ``level`` verifies its proposals as point masses."""
    return isinstance(level, ProposalLevel) and not level.draws_q(greedy)


ADAPTIVE = ("adaptive",)
"""What stands for the block sizes in the eager-time record of an adaptive run (``compile="auto"``)."""


def _probe_candidate(
    runners: Sequence[Runner | ProposalLevel],
    state: DecodeState,
    prompt_lens: np.ndarray,
    max_T: int,
    candidate: int,
    rows: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
) -> Probe:
    runner = runners[candidate]
    assert not isinstance(runner, ProposalLevel), "only model candidates are probed"
    lookup = (0, runners[0], max_T) if isinstance(runners[0], LookupDraft) else None  # only ever first
    return probe(runner, candidate, state, rows, starts, ends, prompt_lens, lookup)


def _stop_rows(stop: StopChecker, tokens: torch.Tensor, ledger: Ledger, rows: np.ndarray) -> None:
    """Replay what the target committed through the stopping criteria, and hold those of ``rows``
    (at their round boundary: nothing speculative) that the criteria stopped and the ledger has not
    finished: they want nothing more, and their output ends at ``stop.limits``. A stopped row that
    is mid-block now is held after its next commit of the target."""
    stop.advance(tokens, np.asarray(ledger.output_lens()))
    held = [int(r) for r in rows if stop.stopped[r] and not ledger.finished(int(r))]
    if held:
        ledger.hold(held)


def _output_lens(ledger: Ledger, stop: StopChecker | None) -> np.ndarray:
    """Each row's output length (prompt included): the ledger's, cut where stopping criteria stopped
    the row or, while a run goes on, at the last step they have checked."""
    lens = np.asarray(ledger.output_lens())
    return lens if stop is None else np.minimum(lens, stop.limits)


def _check_runners(runners: Sequence[Runner | ProposalLevel]) -> None:
    """At least the target; a proposal level only first, under a model; one vocabulary size."""
    if len(runners) < 1:
        raise ValueError("need at least one runner (the target)")
    models = runners[1:] if isinstance(runners[0], ProposalLevel) else runners  # the levels that run a model
    if not models or any(isinstance(r, ProposalLevel) for r in models):
        raise ValueError(
            f"a {type(runners[0]).__name__} proposes from the host: it can only be the first level, under "
            "at least one model"
        )
    vocab = runners[-1].vocab_size
    if any(r.vocab_size != vocab for r in models):
        raise ValueError(f"runners disagree on vocab_size: {[r.vocab_size for r in models]}")


def _check_tree(tree: Tree | None, runners: Sequence[Runner | ProposalLevel], adaptive: bool = False) -> None:
    """A token tree a model at level 0 can draft (of an adaptive run: some choice's level 0), no
    deeper than a block may be."""
    if tree is None:
        return
    if not isinstance(tree, Tree):
        raise TypeError(f"tree must be a hsd_fast.Tree, got {type(tree).__name__}")
    draft_models = [r for r in runners[:-1] if not isinstance(r, ProposalLevel)]
    if not draft_models or (isinstance(runners[0], ProposalLevel) and not adaptive):
        raise ValueError("a token tree is drafted by a model at level 0: give at least one draft model")
    if tree.depth > MAX_BLOCK_SIZE:
        raise ValueError(f"a token tree may be at most {MAX_BLOCK_SIZE} deep, got {tree.depth}")


AUTO_COMPILE_AFTER_SECONDS = 60.0
"""``compile="auto"`` decodes eagerly until a hierarchy has spent what compiling it costs, then
compiles it: the rent-or-buy rule (pay for the eager path until it has cost what compiling costs,
then buy); whatever the request lengths, the total time stays within twice that of the better choice
in hindsight. The price is what the last process that compiled the hierarchy spent on it
(``compile_price.py``: a later process loads steps an earlier one compiled from inductor's cache,
``graph_cache.py``, in a fraction of the time), and at most this: compiling a hierarchy's steps where
nothing is cached (about three graphs for one draft at batch 1, 20-30 s each on 2 CPU cores) costs
about a minute."""
# target runner -> {(ids of the drafts' runners, block sizes): seconds decoded eagerly}; weak, so a
# dropped model takes its record with it
_EAGER_SECONDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _decide_compile(compile: bool | str, runners: Sequence[Runner], block_sizes: Sequence[int]) -> bool:
    if compile == "auto":
        if not all(getattr(r, "compilable", True) for r in runners):
            return False
        spent = _EAGER_SECONDS.get(runners[-1], {}).get(_hierarchy_key(runners, block_sizes), 0.0)
        return spent > 0 and spent >= _compile_price(runners, block_sizes)
    if not isinstance(compile, bool):
        raise ValueError(f"compile must be True, False or 'auto', got {compile!r}")
    return compile


def _compile_price(runners: Sequence[Runner | ProposalLevel], block_sizes: Sequence[int]) -> float:
    """Seconds compiling this hierarchy is expected to take: what the last process that compiled it
    spent (``compile_price.py``), at most ``AUTO_COMPILE_AFTER_SECONDS``."""
    key = compile_price.hierarchy_key(runners, block_sizes)
    recorded = None if key is None else compile_price.recorded_seconds(key)
    return AUTO_COMPILE_AFTER_SECONDS if recorded is None else min(recorded, AUTO_COMPILE_AFTER_SECONDS)


def _count_compiling(
    runners: Sequence[Runner | ProposalLevel], block_sizes: Sequence[int], seconds: float
) -> None:
    """Record what this run spent compiling its hierarchy's steps, for later processes' price."""
    key = compile_price.hierarchy_key(runners, block_sizes) if seconds > 0 else None
    if key is not None:
        compile_price.add_spent(key, seconds)


def _hierarchy_key(runners: Sequence[Runner | ProposalLevel], block_sizes: Sequence[int]) -> tuple:
    # a proposal level by value: `drafts=["lookup"]` makes a new LookupDraft per request
    return (*(r if isinstance(r, ProposalLevel) else id(r) for r in runners[:-1]), *block_sizes)


def _count_eager(runners: Sequence[Runner], block_sizes: Sequence[int], seconds: float) -> None:
    spent = _EAGER_SECONDS.setdefault(runners[-1], {})
    key = _hierarchy_key(runners, block_sizes)
    spent[key] = spent.get(key, 0.0) + seconds


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
