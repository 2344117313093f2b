"""Expected latency per committed token of an HSD hierarchy (docs/design.md, "The latency model and the
selector"). Pure Python math.

Inputs, for levels 0..K (K the target): ``costs[i](n)``, the seconds of one step of level i over
n fed tokens (a verification), ``draft_seconds(costs[0], k)`` those of a step that drafts k tokens,
and ``alphas[i]`` = alpha(i, i+1), the probability that level i+1 accepts a token of
level i (acceptance i.i.d. across positions and levels, the paper's assumption). Convention: a
verification of a block of b tokens feeds n = b + 1 tokens (the block and the token before it);
catch-up tokens (a level re-feeding the tokens emitted above it since its last forward) are ignored.

A lookup level (docs/design.md, "The lookup level") is a level 0 whose cost is a ``LookupCost``: a
call costs host seconds only and proposes a random number of tokens (0 when nothing matches), and
the rate its verifier accepts them with is given per position of the proposal (a tuple
``(a_1, a_2, ...)``: a_j is the probability that token j is accepted given tokens 1..j-1 were),
because a matched passage tends to be accepted whole or not at all. Where a run's calls sit depends
on its block size, so a pair's rates may carry the level's replays at each T (``DepthRates``), and a
level 0 is priced from its own T's (``at_block_size``). Under a middle model, the
level's calls after the first of that model's run may take lengths and rates of their own
(``LaterCalls``: they follow the middle model's token, not the target's).

A batch of B rows runs every step over all its rows at once (docs/design.md, "Selecting for a
batch"): with costs measured at B rows, a latency is the seconds per token each row commits, and
the batch makes B / latency tokens per second. The recursion follows one row (rows accept
independently); what the batch adds besides costs is the lookup level's padding: its rows' blocks
differ and one verification feeds them all, padded to the widest (``LookupCost.rows``).

The loop of docs/design.md, "The one loop", as a recursion: level 0 returns exactly T_0 tokens for
d_0(T_0) (one draft step); level i (0 < i < K) calls level i-1 and verifies its block b (gain
G = min(A, b) + 1, P(A >= k) = a^k) until its running gain reaches T_i, and returns that gain. The
target verifies one block per round:

    L = (E[C_{K-1}] + E_b[c_K(b + 1)]) / E_b[E[G | b]],      E[G | b] = (1 - a^(b+1)) / (1 - a)

E[C_i] = E[J_i] (E[C_{i-1}] + E_b[c_i(b + 1)]) by Wald; E[J_i] and the distribution of the returned
block follow from a DP over the running sum. Our derivation, checked by Monte Carlo in the tests.
"""

from __future__ import annotations

import itertools
import math
import random
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

Cost = Callable[[int], float]
Acceptance = float | tuple[float, ...]
"""One rate for every position of a block, or per position (a_1, a_2, ...): a_j the probability
that the j-th token of a block is accepted given that the tokens before it were; positions past the
tuple's end take its last rate."""


@dataclass(frozen=True)
class AffineCost:
    """c(n) = fixed + per_token * n: close to a CPU forward; on a GPU per_token is nearly 0. Both
    are >= 0: a step never costs less than nothing, nor less for more tokens."""

    fixed: float
    per_token: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.fixed) and math.isfinite(self.per_token)):
            raise ValueError(f"a cost must be finite, got fixed={self.fixed}, per_token={self.per_token}")
        if self.fixed < 0 or self.per_token < 0:
            raise ValueError(f"a cost must be >= 0, got fixed={self.fixed}, per_token={self.per_token}")

    def __call__(self, n: int) -> float:
        return self.fixed + self.per_token * n

    @classmethod
    def fit(cls, sizes: Sequence[int], seconds: Sequence[float]) -> AffineCost:
        """A robust, monotone, non-negative fit of timings: the slope is the median of the pairwise
        slopes (Theil-Sen: one timing spoiled by load moves it little), at least 0; the intercept
        the median of ``seconds - slope * size``, at least 0 (docs/design.md, "Measuring costs on a
        busy machine"). A single size gives a constant."""
        if len(sizes) != len(seconds) or not sizes:
            raise ValueError(f"need as many timings as sizes (>= 1), got {len(sizes)} and {len(seconds)}")
        if not all(math.isfinite(s) and s >= 0 for s in seconds):
            raise ValueError(f"timings must be finite and >= 0, got {list(seconds)}")
        pairs = list(itertools.combinations(zip(sizes, seconds, strict=True), 2))
        slopes = [(s2 - s1) / (n2 - n1) for (n1, s1), (n2, s2) in pairs if n2 != n1]
        slope = max(0.0, statistics.median(slopes)) if slopes else 0.0
        fixed = max(0.0, statistics.median(s - slope * n for n, s in zip(sizes, seconds, strict=True)))
        return cls(float(fixed), float(slope))


@dataclass(frozen=True)
class LaterCalls:
    """A proposal level's calls under a middle model m (proposal level > m > ...) after the first of
    m's run: the first comes right after the verification above m, a context the profile's replay
    under the target measures; the later ones come after m's own token (its correction of a
    rejected proposal, its bonus, or its draft where nothing was offered), a context the text
    repeats less (docs/design.md, "Tokens that came through", *First and later calls*).
    ``lengths`` as ``LookupCost``'s, ``rates`` m's acceptance per block position on them."""

    lengths: tuple[float, ...]
    rates: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.lengths or any(not 0.0 <= p <= 1.0 for p in self.lengths):
            raise ValueError(f"lengths must be probabilities, got {self.lengths}")
        if abs(sum(self.lengths) - 1.0) > 1e-6:
            raise ValueError(f"lengths must sum to 1, got {sum(self.lengths)}")
        if not self.rates or any(not 0.0 <= r <= 1.0 for r in self.rates):
            raise ValueError(f"rates must lie in [0, 1], got {self.rates}")


@dataclass(frozen=True)
class LookupCost:
    """A lookup level's cost and output: ``seconds`` of host work per call (no forward) for a batch
    of ``rows`` rows, and ``lengths[b]``, the fraction of a row's calls whose match offers b tokens
    (b = 0..len - 1, the last entry: at least that many); a call with block size T proposes
    min(b, T) of them. ``noise``: the relative standard error of ``seconds``, as for a
    ``CostProfile``. In a batch the rows' blocks differ, but one verification step feeds them all,
    padded to the widest (``padded_block``); each row gains from its own block. ``later``: where a
    chain's middle model verifies the level, its calls after the first of the middle's run (None:
    alike; ``with_later_calls``)."""

    seconds: float
    lengths: tuple[float, ...]
    noise: float = 0.0
    rows: int = 1
    later: LaterCalls | None = field(default=None, kw_only=True)  # (subclasses add positional fields)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.seconds) and self.seconds >= 0):
            raise ValueError(f"a lookup cost must be finite and >= 0, got {self.seconds}")
        if not self.lengths or any(not 0.0 <= p <= 1.0 for p in self.lengths):
            raise ValueError(f"lengths must be probabilities, got {self.lengths}")
        if abs(sum(self.lengths) - 1.0) > 1e-6:
            raise ValueError(f"lengths must sum to 1, got {sum(self.lengths)}")
        if self.rows < 1:
            raise ValueError(f"a batch has at least one row, got rows={self.rows}")

    def __call__(self, n: int) -> float:  # what ordering by c(1) reads: the lookup is the cheapest
        return self.seconds

    def draft(self, k: int) -> float:
        return self.seconds

    def decode(self) -> float:
        raise ValueError("a lookup level cannot decode on its own: it needs a model above it")

    def block(self, T: int) -> dict[int, float]:
        """The distribution of the number of tokens one call proposes to a row with block size T."""
        out: dict[int, float] = {}
        for b, p in enumerate(self.lengths):
            if p > 0:
                out[min(b, T)] = out.get(min(b, T), 0.0) + p
        return out

    def with_lengths(self, lengths: tuple[float, ...]) -> LookupCost:
        """The level offering ``lengths`` instead (its replay at another block size, ``at_block_size``)."""
        return replace(self, lengths=lengths)

    def later_calls(self) -> LookupCost:
        """The level as its later calls under a middle model propose (``later``), or itself."""
        return self if self.later is None else replace(self, lengths=self.later.lengths, later=None)

    def padded_block(self, T: int) -> dict[int, float]:
        """The distribution of the widest of ``rows`` independent blocks: what the verification of
        a call feeds every row (P(widest <= b) = P(block <= b) ** rows)."""
        out, below = {}, 0.0  # below: P(a block < b)
        for b, p in sorted(self.block(T).items()):
            at_most = min(1.0, below + p)
            out[b] = at_most**self.rows - below**self.rows
            below = at_most
        return {b: p for b, p in out.items() if p > 0}


@dataclass(frozen=True)
class TreeCost:
    """A model that drafts a token tree at level 0 (docs/design.md, "Choosing a tree"): one step
    drafts the whole tree (a forward for the token before it, then one per depth but the last over
    that depth's ``widths[d]`` nodes), whatever T; the block the level above verifies is the tree's
    depth, and that verification feeds all its nodes (+ 1). Its acceptance towards a verifier is
    per position (``tree_latency.tree_acceptance``)."""

    model: Cost  # the drafting model's step cost
    widths: tuple[int, ...]  # nodes per depth

    def __call__(self, n: int) -> float:  # what ordering by c(1) reads: the model's
        return self.model(n)

    @property
    def crowded(self) -> TreeCost | None:
        """The tree drafted at the model's crowded cost (``sharing_the_cache``), where measured."""
        crowded = getattr(self.model, "crowded", None)
        return TreeCost(crowded, self.widths) if crowded is not None else None

    @property
    def noise(self) -> float:
        return getattr(self.model, "noise", 0.0)

    def draft(self, k: int) -> float:
        return draft_seconds(self.model, 1) + sum(self.model(w) for w in self.widths[:-1])

    def decode(self) -> float:
        raise ValueError("a token tree needs a model above it to verify it")

    def block(self, T: int) -> dict[int, float]:
        return {len(self.widths): 1.0}

    def fed(self, block: int) -> int:
        return sum(self.widths) + 1


@dataclass(frozen=True)
class BridgedCost(LookupCost):
    """A draft with another tokenizer as level 0 (docs/design.md, "Drafts with another tokenizer"):
    a proposal level as the lookup is (a call offers a random number of tokens, ``lengths``: text
    may end mid-character, the last target token is held back), whose calls run its model, so they
    cost more for a larger block: ``call_seconds[T - 1]`` per call with block size T (a T past the
    tuple's end takes its last entry). ``seconds``, what ordering by c(1) reads, is the T = 1 call."""

    call_seconds: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.call_seconds or any(not (math.isfinite(s) and s >= 0) for s in self.call_seconds):
            raise ValueError(f"call_seconds must be finite and >= 0 seconds per T, got {self.call_seconds}")

    def draft(self, k: int) -> float:
        return self.call_seconds[min(k, len(self.call_seconds)) - 1]


class DepthRates(tuple):
    """A proposal level's rates per block position towards one verifier (an ``Acceptance``: the
    tuple itself, from the level's replay at the profile's largest block size) with its replays at
    the smaller block sizes: ``at[T]`` = (``LookupCost.lengths``, these rates) as calls of block
    size T come. Where a run's calls sit depends on T: after a passage kept whole, a run at T = 7
    calls again inside it, where a run at 16 is still verifying, so a replay at the largest T prices
    a smaller one too low (docs/design.md, "Rates at each block size"). ``at_block_size`` picks a
    level's own."""

    at: dict[int, tuple[tuple[float, ...], tuple[float, ...]]]

    def __new__(cls, rates: Sequence[float], at: Mapping[int, tuple[Sequence[float], Sequence[float]]]):
        self = super().__new__(cls, rates)
        self.at = {T: (tuple(lengths), tuple(own)) for T, (lengths, own) in at.items()}
        return self

    def __reduce__(self):  # copies and pickles keep the replays (a tuple's would drop ``at``)
        return DepthRates, (tuple(self), self.at)


def at_block_size(
    costs: Sequence[Cost], alphas: Sequence[Acceptance], T: Sequence[int]
) -> tuple[list[Cost], list[Acceptance]]:
    """``costs`` and ``alphas`` with a proposal level 0 replayed at its own block size ``T[0]``: its
    lengths and its verifier's rates of that replay (``DepthRates``); otherwise as they are."""
    costs, alphas = list(costs), list(alphas)
    rate = alphas[0] if alphas else None
    if isinstance(rate, DepthRates) and T[0] in rate.at and hasattr(costs[0], "with_lengths"):
        lengths, alphas[0] = rate.at[T[0]]
        costs[0] = costs[0].with_lengths(lengths)
    return costs, alphas


def verify_tokens(below: Cost, block: int) -> int:
    """Tokens a verification of ``block`` tokens of the level ``below`` feeds: the block and the
    token before it, or a token tree's nodes and the token before them."""
    fed = getattr(below, "fed", None)
    return fed(block) if fed is not None else block + 1


def block_sizes(cost: Cost, T: int) -> dict[int, float]:
    """The distribution of the block a level-0 call returns to a row: exactly T for a model that
    drafts, a random 0..T for a lookup level."""
    block = getattr(cost, "block", None)
    return block(T) if block is not None else {T: 1.0}


def padded_block_sizes(cost: Cost, T: int) -> dict[int, float]:
    """The distribution of the block the verification of a level-0 call feeds each row: the
    widest over the batch's rows (a random block differs between rows), else the block itself."""
    padded = getattr(cost, "padded_block", None)
    return padded(T) if padded is not None else block_sizes(cost, T)


def first_verify_seconds(above: Cost, below: Cost, T: int) -> float:
    """Expected seconds of the verification of a level-0 call (``below``, block size T) by the
    level above it: over the padded block, and a token tree's nodes."""
    return sum(p * above(verify_tokens(below, b)) for b, p in padded_block_sizes(below, T).items())


def draft_seconds(cost: Cost, k: int) -> float:
    """Seconds for a level to draft k tokens: its measured draft step (``cost.draft``: one step
    draws them all) where known, else k one-token forwards."""
    draft = getattr(cost, "draft", None)
    return draft(k) if draft is not None else k * cost(1)


def decode_seconds(cost: Cost) -> float:
    """Seconds per token of plain autoregressive decoding (K = 0) with this model."""
    per_token = getattr(cost, "decode", None)
    return per_token() if per_token is not None else cost(1)


def rate_at(a: Acceptance, j: int) -> float:
    """The acceptance rate of the j-th token (j >= 1) of a block."""
    if isinstance(a, tuple):
        return a[min(j, len(a)) - 1]
    return a


def gain_probs(a: Acceptance, b: int) -> list[float]:
    """P(G = g) for g = 1..b+1 when b drafts are verified with acceptance a."""
    probs, survive = [], 1.0  # survive: P(the first k tokens are accepted)
    for k in range(b):
        rate = rate_at(a, k + 1)
        probs.append(survive * (1.0 - rate))
        survive *= rate
    return [*probs, survive]


def expected_gain(a: Acceptance, b: int) -> float:
    """E[G | b] = sum_k P(A >= k) over k = 0..b; for one rate (1 - a^(b+1)) / (1 - a), with its
    limit b + 1 at a = 1."""
    if isinstance(a, tuple):
        total, survive = 1.0, 1.0
        for j in range(1, b + 1):
            survive *= rate_at(a, j)
            total += survive
        return total
    return float(b + 1) if a >= 1.0 else (1.0 - a ** (b + 1)) / (1.0 - a)


def mean_gain(a: Acceptance, block: dict[int, float]) -> float:
    """E[G] over a distribution of block sizes."""
    return sum(p * expected_gain(a, b) for b, p in block.items())


@dataclass(frozen=True)
class RatesThrough:
    """How a model v takes what the model m under it hands up from a proposal level p's proposals
    (docs/design.md, "Tokens that came through")."""

    passed: float  # v's rate on the proposed tokens m accepted
    corrected: float | None = None  # on m's own token where it rejected one (None: m's own rate)
    # on m's other own tokens: the bonus after a proposal it kept whole, its draft where nothing was
    # offered (None: m's own rate, alpha(m, v); a run can show them taken more often, controller.through)
    own: float | None = None


Through = Mapping[tuple[int, int, int], RatesThrough]
"""(p, m, v) -> ``RatesThrough`` (measured by ``proposal_scores``; ``chain_rates``)."""


def reindexed(through: Iterable[tuple[tuple, RatesThrough]], index: Mapping) -> dict[tuple, RatesThrough]:
    """The entries of ``through`` (``(p, m, v), rates`` items) whose three levels ``index`` maps,
    keyed by what it maps them to (another candidate list's indices, or the levels' ids to
    indices); the others dropped."""
    return {
        (index[p], index[m], index[v]): rates
        for (p, m, v), rates in through
        if p in index and m in index and v in index
    }


def shares_through(
    below: Cost, rate: Acceptance, T: int, T_above: int | None = None
) -> tuple[float, float, float]:
    """Of the tokens a level 1 hands up over its level-0 call (``below``, block size ``T``,
    accepted at ``rate``), the shares that came through (proposed and kept), that are its
    corrections (its own token where it rejected a proposed one) and its other own tokens (the
    bonus after a proposal kept whole, or its draft where nothing was offered): a verification of
    a block of b keeps E[G | b] - 1 tokens and adds one of the other two kinds. Over a proposal
    level with ``later`` calls, the first call of each run of level 1 (block size ``T_above``)
    and the later ones weigh by how many of each a run makes (``T_above`` None: all alike)."""
    first = _Call(block_sizes(below, T), rate, 0.0)
    kept, corrections = _kept_and_corrected(first)
    calls = 1.0
    if (later := getattr(below, "later", None)) is not None and T_above is not None:
        after = _Call(below.later_calls().block(T), later.rates, 0.0)  # type: ignore[attr-defined]
        more = sum(_run(first, after, T_above)[0]) - 1.0  # later calls per run
        more_kept, more_corrections = (more * x for x in _kept_and_corrected(after))
        kept, corrections, calls = kept + more_kept, corrections + more_corrections, 1.0 + more
    gain = kept + calls
    return kept / gain, corrections / gain, (calls - corrections) / gain


def _kept_and_corrected(call: _Call) -> tuple[float, float]:
    """Over one verification of a level-0 ``call``: the proposed tokens it keeps, and the chance it
    rejects one (its token is then a correction)."""
    kept = corrections = 0.0
    for b, p in call.block.items():
        kept += p * (expected_gain(call.rate, b) - 1.0)
        corrections += p * (1.0 - math.prod(rate_at(call.rate, j) for j in range(1, b + 1)))
    return kept, corrections


def chain_rates(
    costs: Sequence[Cost],
    alpha: Sequence[Sequence[Acceptance]],
    levels: Sequence[int],
    T: Sequence[int],
    through: Through | None = None,
) -> list[Acceptance]:
    """The rates of a chain's pairs (``levels``: candidate indices, smallest first), each pair's
    ``alpha``, except where ``through`` holds the chain's first three (docs/design.md, "Tokens that
    came through"): level 2 then verifies three kinds of level 1's tokens: proposed by level 0
    and kept by level 1, which level 2 takes at ``passed`` (two levels that agree on a proposed
    token are mostly right: 0.96-1.0 on the zoo's text sets); level 1's corrections of the
    proposals it rejected, at ``corrected`` (where a small model rejects a passage the text
    repeats, the target mostly keeps it: 0.2-0.4); and its other own tokens, at ``own`` (None:
    its ``alpha``).
    The kinds come in a fixed order, each of level 1's verifications handing up its kept tokens
    and then one of its own, so the pair's rate is one per block position (``rates_through``)."""
    rates = [alpha[a][b] for a, b in itertools.pairwise(levels)]
    known = (through or {}).get(tuple(levels[:3])) if len(levels) >= 3 else None
    if known is not None and not isinstance(rates[1], tuple):
        own = rates[1] if known.own is None else known.own
        (below,), (rate,) = at_block_size([costs[levels[0]]], rates[:1], T)
        rates[1] = rates_through(below, rate, T[0], known, own, T[0] + T[1])
    return rates


def rates_through(
    below: Cost, rate: Acceptance, T: int, known: RatesThrough, own: float, positions: int
) -> tuple[float, ...]:
    """Level 2's rate per position of the blocks level 1 hands up over a proposal level
    (``below``, block size ``T``, whose proposals level 1 accepts at ``rate``): a_j, the chance
    that token j is accepted given tokens 1..j-1 were, for j = 1..``positions``. Each of level 1's
    verifications hands up A kept proposals (taken at ``known.passed``) and then one token of its
    own: a correction where it rejected a proposal (at ``known.corrected``), else the bonus or its
    draft (at ``own``). Blocks are runs of such verifications, a renewal sequence: ``boundary[n]``
    is the chance-weighted product of the rates of n tokens that end a verification's run, and
    ``survive[j]`` that of the first j tokens, whatever their run; a_j = survive[j] / survive[j-1].
    Where a small model rejects the end of a repeated passage, the low rates sit at the ends of
    the runs; one rate for every position (the kinds' geometric mean by their shares) would spread
    them over the block: on the cost twin's runs the model expected 0.68-1.00 of the tokens a
    target round committed, in place 0.74-1.09 (docs/design.md, "Tokens that came through").
    Over a proposal level with ``later`` calls, a run's first piece is its first call's, the
    others its later calls' (``LaterCalls``)."""
    corrected = own if known.corrected is None else known.corrected
    first = later = _pieces(block_sizes(below, T), rate, T, corrected, own)
    if (calls := getattr(below, "later", None)) is not None:  # the pieces after a run's first
        later = _pieces(below.later_calls().block(T), calls.rates, T, corrected, own)  # type: ignore[attr-defined]
    boundary, survive = [1.0] + [0.0] * positions, [1.0] + [0.0] * positions
    for n in range(positions):  # a run starting after token n
        if boundary[n] == 0.0:
            continue
        at_least, after = first if n == 0 else later
        for i in range(1, min(T, positions - n) + 1):  # its i-th token, a kept proposal
            survive[n + i] += boundary[n] * at_least[i] * known.passed**i
        for kept in range(min(T, positions - n - 1) + 1):  # its own token after ``kept`` proposals
            ends = boundary[n] * known.passed**kept * after[kept]
            survive[n + kept + 1] += ends
            boundary[n + kept + 1] += ends
    # a ratio of chances that only shrink, at most 1, but rounding can tip it past (rates all near 1
    # on a text both levels repeat: 1.0000000000000002, which every check of a rate refuses)
    return tuple(min(s / before, 1.0) if before > 0 else 0.0 for before, s in itertools.pairwise(survive))


def _pieces(
    block: dict[int, float], rate: Acceptance, T: int, corrected: float, own: float
) -> tuple[list[float], list[float]]:
    """Over one verification by level 1 of a call whose block is distributed as ``block``:
    P(it keeps at least i proposals), i = 0..T + 1, and P(it keeps k) x the rate of the token of
    its own after them, k = 0..T (``rates_through``)."""
    keeps, after = [0.0] * (T + 1), [0.0] * (T + 1)
    for b, p in block.items():
        for gain, q in enumerate(gain_probs(rate, b), start=1):
            keeps[gain - 1] += p * q
            after[gain - 1] += p * q * (corrected if gain - 1 < b else own)
    return [*reversed([*itertools.accumulate(reversed(keeps))]), 0.0], after


@dataclass(frozen=True)
class LevelOutcome:
    block: dict[int, float]  # distribution of the block size the level returns
    cost: float  # expected seconds to return it
    calls: float  # expected verifications (1 at level 0)

    def mean(self, f: Callable[[int], float]) -> float:
        return sum(p * f(b) for b, p in self.block.items())


def level_outcomes(
    costs: Sequence[Cost], alphas: Sequence[Acceptance], T: Sequence[int]
) -> list[LevelOutcome]:
    """Outcomes of the draft levels 0..K-1 under the 'verify until at least T_i' rule. Over a
    proposal level with ``later`` calls, level 1's first call of a run is the level's own and the
    others its later ones (``LaterCalls``)."""
    _check(costs, alphas, T)
    costs, alphas = at_block_size(costs, alphas, T)
    outcomes = [LevelOutcome(block_sizes(costs[0], T[0]), draft_seconds(costs[0], T[0]), 1.0)]
    for i in range(1, len(costs) - 1):
        below, a = outcomes[-1], alphas[i - 1]
        first = _Call(below.block, a, below.cost + _verify_seconds(costs, T, i, below))
        later = _later_call(costs, T) if i == 1 else None
        reach, returned = _run(first, later or first, T[i])
        calls = sum(reach)  # every state below T_i is visited at most once: one call per visit
        cost = calls * first.seconds if later is None else first.seconds + (calls - 1.0) * later.seconds
        outcomes.append(LevelOutcome(returned, cost, calls))
    return outcomes


@dataclass(frozen=True)
class _Call:
    """One call of level i - 1 as level i's run makes it, and its verification: the block's
    distribution, the rate level i accepts it at, and the seconds of both."""

    block: dict[int, float]
    rate: Acceptance
    seconds: float


def _later_call(costs: Sequence[Cost], T: Sequence[int]) -> _Call | None:
    """Level 1's later calls of a run over a proposal level with ``later`` ones (None: alike)."""
    later = getattr(costs[0], "later", None)
    if later is None:
        return None
    proposing = costs[0].later_calls()  # type: ignore[attr-defined]  # their blocks; a call costs the same
    verify = sum(p * costs[1](verify_tokens(costs[0], b)) for b, p in proposing.padded_block(T[0]).items())
    return _Call(proposing.block(T[0]), later.rates, draft_seconds(costs[0], T[0]) + verify)


def _run(first: _Call, later: _Call, target: int) -> tuple[list[float], dict[int, float]]:
    """A level's run until its gain reaches ``target``, its first call ``first`` and the others
    ``later``: ``reach[s]``, the probability its running gain ever equals s (< target; a call is
    made at each), and the distribution of the gain it returns."""
    reach = [0.0] * target
    reach[0] = 1.0
    returned: dict[int, float] = {}
    for s in range(target):
        if reach[s] == 0.0:
            continue
        call = first if s == 0 else later
        for b, pb in call.block.items():
            for g, pg in enumerate(gain_probs(call.rate, b), start=1):
                p = reach[s] * pb * pg
                if s + g >= target:
                    returned[s + g] = returned.get(s + g, 0.0) + p
                else:
                    reach[s + g] += p
    return reach, returned


def verifying_costs(levels: Sequence[Cost]) -> list[Cost]:
    """The levels' costs as each verifies the level below it: where that level is an early exit the
    level verifies from its hidden states (the exit's cost lists this level's cost, by identity, in
    ``reused_by``), what that verification costs instead (docs/design.md, "Early-exit levels");
    otherwise, and at level 0, the level's own."""
    out = list(levels[:1])
    for below, cost in itertools.pairwise(levels):
        reused = (verify for upper, verify in getattr(below, "reused_by", ()) if upper is cost)
        out.append(next(reused, cost))
    return out


def sharing_the_cache(levels: Sequence[Cost]) -> list[Cost]:
    """The levels' costs as a run pays them: where two or more models take turns (a lookup level has
    no weights), each model's step runs right after the others' and finds its weights pushed out of
    the cache, so its ``crowded`` cost counts where one was measured (docs/design.md, "Where the
    latency model errs"). One model alone keeps the cost it was timed at."""
    if sum(not isinstance(c, LookupCost) for c in levels) < 2:
        return list(levels)
    return [getattr(c, "crowded", None) or c for c in levels]


def expected_latency(costs: Sequence[Cost], alphas: Sequence[Acceptance], T: Sequence[int]) -> float:
    """Expected seconds per committed token; K = 0 is plain autoregressive decoding. Costs are
    taken as the levels share the cache (``sharing_the_cache``)."""
    if len(costs) == 1:
        return decode_seconds(costs[0])
    costs, alphas = at_block_size(sharing_the_cache(verifying_costs(costs)), alphas, T)
    below = level_outcomes(costs, alphas, T)[-1]
    verify = _verify_seconds(costs, T, len(costs) - 1, below)
    return (below.cost + verify) / below.mean(lambda b: expected_gain(alphas[-1], b))


def _verify_seconds(costs: Sequence[Cost], T: Sequence[int], i: int, below: LevelOutcome) -> float:
    """Expected seconds of level i's verification of the block level i - 1 returns (``below``)."""
    if i == 1:
        return first_verify_seconds(costs[1], costs[0], T[0])
    return below.mean(lambda b: costs[i](b + 1))


def fixed_block_latency(costs: Sequence[Cost], alphas: Sequence[Acceptance], T: Sequence[int]) -> float:
    """The decomposable form: as if every level above 0 returned exactly T_i tokens,
    L = (1/g_K) [c_K + r_{K-1} (c_{K-1} + ... + r_1 (c_1 + T_0 c_0))], r_i = T_i / g_i (level 0's
    block, random for a lookup level, averaged in g_1 and c_1)."""
    _check(costs, alphas, T)
    if len(costs) == 1:
        return decode_seconds(costs[0])
    costs, alphas = at_block_size(verifying_costs(costs), alphas, T)
    produce = draft_seconds(costs[0], T[0])  # seconds for level 0 to produce its block
    block = block_sizes(costs[0], T[0])
    for i in range(1, len(costs)):
        verify = first_verify_seconds(costs[1], costs[0], T[0]) if i == 1 else costs[i](T[i - 1] + 1)
        gain = mean_gain(alphas[i - 1], block)
        if i == len(costs) - 1:
            return (verify + produce) / gain
        produce = T[i] / gain * (verify + produce)
        block = {T[i]: 1.0}
    raise AssertionError("unreachable")


def simulate(
    costs: Sequence[Cost],
    alphas: Sequence[Acceptance],
    T: Sequence[int],
    rounds: int = 20_000,
    seed: int = 0,
) -> tuple[float, float]:
    """Monte Carlo of the same control flow: (mean seconds per committed token, standard error),
    following one row; a lookup level's other ``rows`` draw their own blocks, and the verification
    is padded to the widest."""
    _check(costs, alphas, T)
    costs, alphas = at_block_size(costs, alphas, T)
    rng = random.Random(seed)
    top = len(costs) - 1
    later = getattr(costs[0], "later", None)  # level 1's calls after the first of its run, if apart
    # level 0's block sizes and their probabilities, for a run's first call and for the later ones
    blocks = [list(block_sizes(c, T[0]).items()) for c in (costs[0], later and costs[0].later_calls())]

    def draw_block(kind: int) -> int:
        sizes = blocks[kind] if later is not None else blocks[0]
        return rng.choices([b for b, _ in sizes], [p for _, p in sizes])[0]

    def produce(i: int, kind: int = 0) -> tuple[int, int, float]:
        """(block returned to the followed row, tokens its verification feeds, seconds); ``kind``:
        a level-0 call that is the first of level 1's run (0) or a later one (1)."""
        if i == 0:
            b = draw_block(kind)
            # the other rows of a batch draw their own blocks: the verification is padded to the widest
            widest = max([b, *(draw_block(kind) for _ in range(getattr(costs[0], "rows", 1) - 1))])
            return b, verify_tokens(costs[0], widest), draft_seconds(costs[0], b)
        total, spent = 0, 0.0
        while total < T[i]:
            kind = int(i == 1 and total > 0 and later is not None)
            b, fed, c = produce(i - 1, kind)
            gain = draw_gain(rng, later.rates if kind else alphas[i - 1], b)
            spent += c + costs[i](fed)
            total += gain
        return total, total + 1, spent

    per_round_cost, per_round_tokens = [], []
    for _ in range(rounds):
        if top == 0:
            per_round_cost.append(decode_seconds(costs[0]))
            per_round_tokens.append(1)
            continue
        b, fed, c = produce(top - 1)
        per_round_cost.append(c + costs[top](fed))
        per_round_tokens.append(draw_gain(rng, alphas[top - 1], b))
    return _ratio_with_error(per_round_cost, per_round_tokens)


def draw_gain(rng: random.Random, a: Acceptance, b: int) -> int:
    """A random gain of verifying a block of ``b`` tokens: the drafts accepted (each in turn with its
    position's rate, up to the first rejection) plus the correction or bonus."""
    accepted = 0
    while accepted < b and rng.random() < rate_at(a, accepted + 1):
        accepted += 1
    return accepted + 1


def _ratio_with_error(costs: list[float], tokens: list[int]) -> tuple[float, float]:
    """Ratio estimator sum(costs) / sum(tokens) and its delta-method standard error."""
    n = len(costs)
    mean_c, mean_t = sum(costs) / n, sum(tokens) / n
    ratio = mean_c / mean_t
    resid = [c - ratio * t for c, t in zip(costs, tokens, strict=True)]
    var = sum(r * r for r in resid) / (n - 1)
    return ratio, (var / n) ** 0.5 / mean_t


def _check(costs: Sequence[Cost], alphas: Sequence[Acceptance], T: Sequence[int]) -> None:
    k = len(costs) - 1
    if k < 0:
        raise ValueError("need at least the target's cost")
    if len(alphas) != k or len(T) != k:
        raise ValueError(
            f"{k} draft level(s) need {k} alphas and {k} block sizes, got {len(alphas)} and {len(T)}"
        )
    rates = [r for a in alphas for r in (a if isinstance(a, tuple) else (a,))]
    if any(not 0.0 <= r <= 1.0 for r in rates) or any(isinstance(a, tuple) and not a for a in alphas):
        raise ValueError(f"acceptance rates must lie in [0, 1], got {list(alphas)}")
    if any(hasattr(c, "block") for c in costs[1:]):
        raise ValueError("a lookup level can only be level 0")
    if any(t < 1 for t in T):
        raise ValueError(f"block sizes must be >= 1, got {list(T)}")
