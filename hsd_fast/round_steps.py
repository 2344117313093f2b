"""One step of a round as the engine's loop runs it (``engine.py``): a proposal level's proposals,
a draft step, a verification, each committed to the C++ ledger, and level 0's draft with level 1's
verification launched back to back, read by the host once (docs/design.md, "Draft and verification
without a host sync").

Terms: ``rows`` [R] are the batch rows taking part in a step; ``starts, ends`` [R] the span each
feeds (``[starts, ends)``, the ledger's); ``outs`` [R] where a verification's block starts (its
drafts are ``[outs + 1, ends)``); a step's *result* is ``[3, R]``: a draft's counts drawn, whether
the last is an EOS and whether its logits broke, a verification's accepted counts, whether the new
token is an EOS and whether its logits broke (a token tree's verification adds the rank of the node
accepted at each depth).
"""

from __future__ import annotations

import itertools
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from hsd_fast._C import Ledger
from hsd_fast.decode_state import DecodeState
from hsd_fast.layout import MAX_WIDTH
from hsd_fast.level_step import LevelStep
from hsd_fast.proposal_level import ProposalLevel, Proposer
from hsd_fast.round_log import RoundLog
from hsd_fast.schedule import draft_count, drafts_wanted
from hsd_fast.steps import Runner
from hsd_fast.switching_types import Choice


@dataclass
class Chain:
    """The levels a run decodes with now (``choice`` over its candidates): their runners, level 0
    first and the target last, block sizes, and each level's step (None for a proposal level)."""

    choice: Choice
    runners: list[Runner | ProposalLevel]
    block_sizes: list[int]
    steps: list[LevelStep | None]
    # per level: the levels below to catch up, bottom up, before this level verifies from its
    # exit's hidden states (docs/design.md, "Early-exit levels"); empty where it recomputes
    catch_up: list[list[tuple[int, LevelStep]]]
    # level 1 may verify level 0's draft without the host reading the draft first (``pairs``)
    paired: bool = False

    @property
    def top(self) -> int:
        return len(self.runners) - 1

    @property
    def proposes_from_host(self) -> bool:
        return isinstance(self.runners[0], ProposalLevel)


@dataclass
class StepDone:
    """A step run and committed: its level, the seconds it took (``wall``; ``inside`` of them in
    its step function) and its size as the latency model counts it (``RoundLog.timed``)."""

    level: int
    wall: float
    inside: float
    size: int


PAIRED_ROUNDS = True
"""Launch level 0's draft and level 1's verification back to back where ``pairs`` allows it (the
default); False: every step is read by the host before the next is launched (benchmarks compare)."""


def pairs(chain: Chain, ledger: Ledger, level: int, rows: np.ndarray) -> bool:
    """Whether level 1 can verify the draft level 0 is about to make for ``rows`` without the host
    reading it first: the chain allows it (``Chain.paired``), every row that wants a level wants
    level 0 (so each of them wants level 1 once it has drafted: the ledger's schedule is the one
    the host would follow), and both levels' spans fit one step, level 1's no prefill."""
    if not (PAIRED_ROUNDS and chain.paired and level == 0):
        return False
    if any(len(ledger.rows_for(above)) for above in range(1, chain.top + 1)):
        return False
    cached = ledger.cached_lens()[rows, :2]  # [R, 2]
    seq_lens = ledger.frontiers()[rows, 0]  # [R]
    drafting, verifying = seq_lens - cached[:, 0], seq_lens + chain.block_sizes[0] - cached[:, 1]  # widest
    return bool((cached[:, 1] > 0).all() and max(drafting.max(), verifying.max()) <= MAX_WIDTH)


def draft_and_verify(
    chain: Chain,
    rows: np.ndarray,  # [R] the rows that want level 0 (all that want a level: ``pairs``)
    ledger: Ledger,
    state: DecodeState,
    budget_end: np.ndarray,  # [B]
    log: RoundLog,
    broken_levels: set[int],
) -> list[StepDone]:
    """Level 0 drafts for ``rows`` and level 1 verifies what it drew, launched back to back: the
    verification's spans end where each row's draft stopped, computed on the device from the draft's
    own counts, so the host reads both steps' results once (on a GPU the verification is queued
    while the draft runs). The ledger then replays the two commits and checks that it would have
    fed level 1 exactly the spans the device did."""
    draft, verify = chain.steps[0], chain.steps[1]
    assert draft is not None and verify is not None
    num_rows, device = state.num_rows, state.tokens.device
    starts, ends, outs = ledger.spans(0, rows)
    wanted = drafts_wanted(ledger, rows, budget_end, chain.block_sizes)  # [R]
    block_starts, cached = ledger.frontiers()[rows, 1], ledger.cached_lens()[rows, 1]  # [R] each
    # Level 1's spans as level 0 starts drafting: everything it has not cached, up to the draft's
    # first position (level 0's ``ends``); its block starts at its own frontier. ``widest``: every row
    # drawing all it wants.
    before = LevelStep.spans(num_rows, rows, cached, ends, block_starts - 1)  # [5, B]
    widest = before.copy()
    widest[1, rows] += wanted
    started = time.perf_counter()
    drafting = LevelStep.spans(num_rows, rows, starts, ends, outs, wanted)  # [5, B]
    # One copy to the device before anything is queued: a copy from pageable host memory waits for
    # the device's queue, so made between the two launches it would be a sync of its own.
    on_device = torch.from_numpy(np.stack([drafting, before])).to(device)  # [2, 5, B]
    count = draft_count(chain.block_sizes)
    clock = _DeviceClock(device)
    drafted = draft.launch(state, drafting, count, on_device[0]).clone()  # [3, B]
    # (cloned: kept past the verification's graph replay, which may reuse its output memory)
    clock.mark()
    launched = time.perf_counter()
    spans = verify_spans(on_device[1], drafted[0])  # [5, B]
    verified = verify.launch(state, widest, on_device=spans)  # [3, B]
    clock.mark()
    out = torch.cat([drafted, spans[:3], verified]).cpu().numpy()[:, rows]  # the round's one host read
    done = time.perf_counter()
    drafting_seconds = clock.first_share(done - started, launched - started)
    drafted_size = _commit_draft(chain, rows, ledger, out[:3], starts, ends, log, broken_levels)
    _check_replay(ledger, rows, out[3:6])
    verified_size = _commit_verify(chain, 1, rows, ledger, out[6:], out[3:6], None, log, broken_levels)
    verifying_wall = time.perf_counter() - started - drafting_seconds  # with the commits
    return [
        StepDone(0, drafting_seconds, drafting_seconds, drafted_size),
        StepDone(1, verifying_wall, done - started - drafting_seconds, verified_size),
    ]


class _DeviceClock:
    """How a pair's seconds divide between its two steps. On a CPU each launch runs its step, so the
    host clock between the launches tells; on a GPU the launches return at once and the host waits
    for both at the read, so CUDA events around the two launches time each on the device, and the
    pair's seconds are split in that proportion (an adaptive run's controller learns each level's
    own cost from them)."""

    def __init__(self, device: torch.device) -> None:
        self.events: list[torch.cuda.Event] = []  # one before the draft, one after each launch
        if device.type == "cuda":
            self.events = [torch.cuda.Event(enable_timing=True)]
            self.events[0].record()

    def mark(self) -> None:
        if self.events:
            self.events.append(torch.cuda.Event(enable_timing=True))
            self.events[-1].record()

    def first_share(self, seconds: float, host_first: float) -> float:
        """The first step's part of the pair's ``seconds`` (called after the read: events done);
        ``host_first``: what the host clock gave it."""
        if not self.events:
            return host_first
        first, second = (a.elapsed_time(b) for a, b in itertools.pairwise(self.events))
        return seconds * first / max(first + second, 1e-9)


def verify_spans(before: torch.Tensor, drawn: torch.Tensor) -> torch.Tensor:
    """[5, B] level 1's spans on the device once level 0 has drawn ``drawn`` [B] tokens per row:
    ``before`` (its spans as the draft started, ending at the draft's first position) with each
    active row's end moved past what it drew (an EOS, the length budget or broken logits stop a row
    early)."""
    ends = before[1] + drawn * before[3]
    return torch.cat([before[:1], ends[None], before[2:]])


def _check_replay(ledger: Ledger, rows: np.ndarray, spans: np.ndarray) -> None:
    """The ledger, having replayed the draft, must feed level 1 the spans (``[3, R]``) the device
    used: the same rows, starts, ends and block starts. Anything else is a bug in the pairing."""
    expected = np.stack(ledger.spans(1, rows))  # raises if some row does not want level 1
    if ledger.next_level() != 1 or not np.array_equal(np.asarray(ledger.rows_for(1)), rows):
        raise RuntimeError("hsd_fast internal error: after a paired draft the ledger wants other rows")
    if not np.array_equal(expected, spans):
        raise RuntimeError(
            f"hsd_fast internal error: level 1 verified spans {spans.tolist()} where the ledger feeds "
            f"{expected.tolist()}"
        )


def run_step(
    chain: Chain,
    level: int,
    rows: np.ndarray,  # [R] the rows that want ``level``
    ledger: Ledger,
    state: DecodeState,
    proposer: Proposer | None,
    budget_end: np.ndarray,  # [B]
    log: RoundLog,
    broken_levels: set[int],
) -> list[StepDone]:
    """One step of ``level`` for ``rows``: a proposal level's proposals, a draft step (a chain, or
    a token tree), or a verification, committed to the ledger; or, where ``pairs`` allows,
    level 0's draft and level 1's verification (``draft_and_verify``)."""
    if pairs(chain, ledger, level, rows):
        return draft_and_verify(chain, rows, ledger, state, budget_end, log, broken_levels)
    started = time.perf_counter()
    starts, ends, outs = ledger.spans(level, rows)
    runners, block_sizes, tree = chain.runners, chain.block_sizes, chain.choice.tree
    if level == 0 and chain.proposes_from_host:
        assert proposer is not None
        wanted = drafts_wanted(ledger, rows, budget_end, block_sizes)
        proposing = time.perf_counter()
        proposed = proposer.propose(state.tokens, rows, ends, wanted)
        state.write_proposals(rows, ends, proposed.tokens, proposed.counts)
        if proposed.q_logits is not None:
            state.keep_proposal_q(rows, ends, proposed.counts, proposed.q_logits, proposed.q_lse)
        ledger.commit_proposal(rows, proposed.counts, proposed.last_is_eos)
        log.proposed(proposed.counts)
        return [StepDone(level, time.perf_counter() - started, time.perf_counter() - proposing, 0)]
    step = chain.steps[level]
    assert step is not None
    if level == 0 and tree is not None:
        wanted = drafts_wanted(ledger, rows, budget_end, block_sizes)
        (proposed, _, broken), inside = step(state, rows, starts, ends, outs, wanted)
        # a row's tree is cut above broken logits (tree_draft_step): the rest is proposed
        check_logits(runners, level, rows, broken, broken_levels)
        ledger.commit_proposal(rows, proposed, np.zeros_like(proposed))
        log.drafted_tree(starts, ends, tree)
        size = tree.depth
    elif level == 0:
        wanted = drafts_wanted(ledger, rows, budget_end, block_sizes)
        result, inside = step(state, rows, starts, ends, outs, wanted, count=draft_count(block_sizes))
        size = _commit_draft(chain, rows, ledger, result, starts, ends, log, broken_levels)
    else:
        exit_seconds = 0.0
        if chain.catch_up[level]:  # the exit below feeds what it has not cached of the block
            cached = ledger.cached_lens()[rows]  # [R, levels]
            for lower, lower_step in chain.catch_up[level]:
                exit_seconds += lower_step.feed(state, rows, cached[:, lower], ends)
        result, inside = step(state, rows, starts, ends, outs)
        inside += exit_seconds
        spans = np.stack([starts, ends, outs])
        size = _commit_verify(chain, level, rows, ledger, result, spans, proposer, log, broken_levels)
    return [StepDone(level, time.perf_counter() - started, inside, size)]


def _commit_draft(
    chain: Chain,
    rows: np.ndarray,  # [R]
    ledger: Ledger,
    result: np.ndarray,  # [3, R] the draft step's
    starts: np.ndarray,  # [R]
    ends: np.ndarray,  # [R]
    log: RoundLog,
    broken_levels: set[int],
) -> int:
    """Commit level 0's draft to the ledger, one token at a time; returns the most tokens a row drew."""
    drawn, last_is_eos, broken = result
    stopped = check_logits(chain.runners, 0, rows, broken, broken_levels)
    for k in range(int(drawn.max())):  # the ledger takes drafts one at a time
        now = ~stopped & (drawn > k)
        ledger.commit_draft(rows[now], last_is_eos[now] & (drawn[now] == k + 1))
    if stopped.any():  # drafting stopped before broken logits: the block closes there
        ledger.commit_proposal(rows[stopped], drawn[stopped], last_is_eos[stopped])
    log.drafted(starts, ends, drawn)
    return int(drawn.max())


def _commit_verify(
    chain: Chain,
    level: int,
    rows: np.ndarray,  # [R]
    ledger: Ledger,
    result: np.ndarray,  # [3, R] the verification's ([3 + K, R] a token tree's)
    spans: np.ndarray,  # [3, R] starts, ends, outs: what it fed and where its block started
    proposer: Proposer | None,
    log: RoundLog,
    broken_levels: set[int],
) -> int:
    """Commit a verification to the ledger; returns the widest span it fed."""
    starts, ends, outs = spans
    accepted, is_eos, broken = result[:3]  # [R] each
    # what a draft level emitted from broken logits is kept as point masses (verify_step)
    check_logits(chain.runners, level, rows, broken, broken_levels)
    if chain.choice.tree is not None and level == 1:
        log.ranked(result[3:])  # [depth, R] the rank of each accepted node
    opens = np.ones(len(rows), dtype=bool)  # [R] the target's verifications all open its run
    if level < ledger.num_levels - 1:
        frontiers = ledger.frontiers()[rows]  # [R, levels]: before the commit moves them
        opens = frontiers[:, level] == frontiers[:, level + 1]
    kept, cascaded = ledger.commit_verify(level, rows, accepted, is_eos)
    log.verified(level, starts, ends, outs, accepted, kept, cascaded, opens)
    if proposer is not None:  # the emitted token replaced whatever stood at its position
        proposer.invalidate(rows, outs + 1 + accepted)
    return int((ends - starts).max())


def check_logits(
    runners: Sequence[Runner | ProposalLevel],
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
            stacklevel=4,
        )
    return bad
