"""Step costs for the latency model, measured through the engine's own level steps (the path
``generate`` takes: eager or compiled, the forward with the slot cache and the 4D mask, the sampling
transform, the draft or verification op, and the host's part of a step):

- ``c(n)``: a verification step over n fed tokens (n - 1 drafts), for n in ``spans``;
- ``d(k)``: a draft step that draws k tokens, for k in ``drafts``;

each fitted as ``a + b n`` with ``a, b >= 0`` (``AffineCost.fit``), for a batch of ``batch`` rows
(every row feeds the same span: a step runs over all of a batch's rows). A verification of n tokens
is priced at the bucket that holds n (``CostProfile.__call__``), the width the step really runs.
Autoregressive decoding (K = 0) draws ``TOKENS_PER_DECODE_STEP`` tokens per step: its cost per token
is ``d(that) / that``.

A busy machine makes single timings meaningless (docs/design.md, "Measuring costs on a busy
machine"): every step is warmed up until its time settles, then all steps are timed in ``repeats``
rounds or more, one call each per round in a rotated order (a slow spell hits different steps in
different rounds, not all repeats of one), and each keeps its median. ``noise`` records how far the
repeats spread: the relative standard error of the medians, which ``select_hierarchy`` compares with
the differences it chooses between; rounds go on while it is above ``NOISE_GOAL``, within a budget.
The clock is injectable (tests use a fake one); on CUDA every timing is synchronised.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from hsd_fast.decode_state import DecodeState
from hsd_fast.hf_runner import HFRunner
from hsd_fast.latency import AffineCost
from hsd_fast.layout import MAX_WIDTH, bucket
from hsd_fast.level_step import LevelStep
from hsd_fast.processors import LogitsTransform
from hsd_fast.sampling_metadata import SamplingMetadata
from hsd_fast.schedule import TOKENS_PER_DECODE_STEP


class ProfileNoiseWarning(UserWarning):
    """The timings vary more than the differences they are used to tell apart."""


@dataclass(frozen=True)
class CostProfile:
    spans: tuple[int, ...]
    seconds: tuple[float, ...]  # median seconds of a verification step over each span
    drafts: tuple[int, ...]
    draft_seconds: tuple[float, ...]  # median seconds of a step drafting that many tokens
    noise: float = 0.0  # relative standard error of the medians (the largest over steps); 0: unknown
    # the same steps timed after other models' weights went through the cache (``forward_costs``'s
    # ``crowd_bytes``): what a step costs in a chain of several models (docs/design.md, §8.8)
    crowded: CostProfile | None = None
    # For an early exit: (the cost of a level that verifies it from its hidden states, what that
    # verification costs: ``reuse_costs``) per such level; the selector matches the first by identity
    # (``latency.verifying_costs``). Set by ``ProfileCache.with_exit_reuse``, never stored.
    reused_by: tuple[tuple[Callable[[int], float], CostProfile], ...] = ()

    @functools.cached_property
    def fit(self) -> AffineCost:
        """c(n) = fixed + per_token * n over the verification steps (robust, non-negative)."""
        return AffineCost.fit(self.spans, self.seconds)

    @functools.cached_property
    def draft_fit(self) -> AffineCost:
        return AffineCost.fit(self.drafts, self.draft_seconds)

    def __call__(self, n: int) -> float:
        """Seconds of a verification over n fed tokens. A step runs at the bucket holding n
        (``layout.bucket``: 9 fed tokens run 12 columns, 8 run 8), so it costs that bucket's fit;
        the spans timed are buckets themselves. Past the widest bucket a span is fed in chunks."""
        return self.fit(bucket(n) if n <= MAX_WIDTH else n)

    def draft(self, k: int) -> float:
        return self.draft_fit(k)

    def decode(self) -> float:
        """Seconds per token of autoregressive decoding."""
        return self.draft(TOKENS_PER_DECODE_STEP) / TOKENS_PER_DECODE_STEP


def forward_costs(
    model: torch.nn.Module,
    spans: Sequence[int] = (1, 2, 4, 8, 16),
    drafts: Sequence[int] = (1, 2, 4, 8),
    context: int = 128,
    repeats: int = 5,
    warmup: int = 2,
    clock: Callable[[], float] = time.perf_counter,
    compile: bool = False,
    greedy: bool = True,
    transform: LogitsTransform | None = None,
    batch: int = 1,
    crowd_bytes: int = 0,
) -> CostProfile:
    """Time ``model``'s steps after ``context`` cached tokens, as ``generate`` runs them
    (``compile``, greedy or sampled under ``transform``), for ``batch`` rows at once. With
    ``crowd_bytes``, time them again, each call right after ``crowd_bytes`` of memory (the other
    levels' weights, in a run) went through the cache: the profile's ``crowded``."""
    if batch < 1:
        raise ValueError(f"forward_costs: batch must be >= 1, got {batch}")
    runner = HFRunner(model, model.get_output_embeddings().weight.shape[0])
    device = next(model.parameters()).device
    positions = context + max(*spans, *drafts) + 1
    state, compile = _timing_state(runner, device, batch, positions, transform, greedy, compile)
    runner.prepare(batch, positions)
    # Each measured shape is compiled at its first call, inside the warm-up: with the default
    # (compile at the third use) the compilation could fall among the timed calls.
    verify = LevelStep(runner, level=1, top=2, compile=compile, compile_after_uses=1)  # keeps its p
    draft = LevelStep(runner, level=0, top=1, compile=compile, compile_after_uses=1)
    rows = np.arange(batch, dtype=np.int64)  # every row takes part in every step
    at = np.full(batch, context, dtype=np.int64)  # [B] each row's cached tokens
    steps = [lambda n=n: verify(state, rows, at, at + n, at) for n in spans]
    steps += [lambda k=k: draft(state, rows, at, at + 1, at, np.full_like(at, k)) for k in drafts]
    with torch.inference_mode():
        verify(state, rows, np.zeros_like(at), at, at - 1)  # prefill the context once
        return _timed(steps, spans, drafts, clock, device, warmup, repeats, crowd_bytes)


def without_layers(reused: CostProfile, upper: CostProfile, deeper: CostProfile) -> CostProfile:
    """What a deeper exit (cost ``deeper``) pays to verify from an exit's hidden states, given what
    the exit's target (``upper``) pays for that (``reused``): the same minus the target's layers the
    deeper exit lacks, ``upper(n) - deeper(n)`` (the two share the fixed cost and the head: an exit is
    the target cut short), at each of ``reused``'s spans; the crowded profile alike, where all three
    have one."""
    seconds = tuple(
        max(0.0, r - (upper(n) - deeper(n))) for n, r in zip(reused.spans, reused.seconds, strict=True)
    )
    crowded = None
    if reused.crowded is not None and upper.crowded is not None and deeper.crowded is not None:
        crowded = without_layers(reused.crowded, upper.crowded, deeper.crowded)
    noise = max(reused.noise, upper.noise, deeper.noise)
    return CostProfile(reused.spans, seconds, (), (), noise, crowded=crowded)


def _timing_state(
    runner: HFRunner, device: torch.device, batch: int, positions: int, transform, greedy: bool, compile: bool
) -> tuple[DecodeState, bool]:
    """The decoding state steps are timed in (random ids, ``batch`` rows of ``positions``), and
    whether the steps compile: processors called per position run eagerly."""
    transform = transform or LogitsTransform()
    ids = torch.randint(3, runner.vocab_size, (batch, positions), device=device)
    sampling = SamplingMetadata.build(batch, device, temperature=transform.temperature, greedy=greedy)
    ring_dtype = torch.float32 if transform.processors else runner.dtype
    state = DecodeState(
        list(ids), positions, 2 * positions, runner.vocab_size, ring_dtype, sampling, transform, not greedy
    )
    return state, compile and not transform.needs_prefixes


def _timed(steps, spans, drafts, clock, device, warmup: int, repeats: int, crowd_bytes: int) -> CostProfile:
    """``steps`` (the verifications over ``spans``, then the draft steps) timed by
    ``interleaved_medians``; with ``crowd_bytes``, timed again after that much memory went through
    the cache (the profile's ``crowded``)."""
    medians, noise = interleaved_medians(steps, clock, device, warmup, repeats)
    crowded = None
    if crowd_bytes > 0:
        crowd = cache_crowd(crowd_bytes, device)
        crowded = _profile(spans, drafts, *interleaved_medians(steps, clock, device, 0, repeats, crowd))
    return replace(_profile(spans, drafts, medians, noise), crowded=crowded)


REUSE_SPANS = (1, 2, 4, 8)
"""The verifications ``reuse_costs`` times: after an exit a verification feeds T + 1 <= 9 tokens, and
compiled, each span is a graph to compile per pair."""


def reuse_costs(
    upper: torch.nn.Module,
    exit_model: torch.nn.Module,
    spans: Sequence[int] = REUSE_SPANS,
    context: int = 128,
    repeats: int = 5,
    warmup: int = 2,
    clock: Callable[[], float] = time.perf_counter,
    compile: bool = False,
    greedy: bool = True,
    transform: LogitsTransform | None = None,
    batch: int = 1,
    crowd_bytes: int = 0,
) -> CostProfile:
    """What ``upper`` costs to verify n tokens of its early exit ``exit_model`` when it starts from the
    exit's hidden states (``exit_reuse``; the pair must pass ``exit_reuse.refusal``), timed as
    ``forward_costs`` times steps: the exit's catch-up (it feeds the block's last token, which it
    drew but never fed) and ``upper``'s layers from the exit's depth on over the n tokens, with its
    head and the verification op. The profile has no draft steps."""
    if batch < 1:
        raise ValueError(f"reuse_costs: batch must be >= 1, got {batch}")
    vocab_size = upper.get_output_embeddings().weight.shape[0]
    lower, verifier = HFRunner(exit_model, vocab_size), HFRunner(upper, vocab_size)
    device = next(upper.parameters()).device
    positions = context + max(spans) + 1
    state, compile = _timing_state(verifier, device, batch, positions, transform, greedy, compile)
    lower.prepare(batch, positions)  # the exit's runner keeps its hidden states from here on
    verifier.prepare(batch, positions)
    from_hidden = verifier.reuse_of(lower)
    if from_hidden is None:
        raise ValueError("reuse_costs: the upper model cannot verify this exit from its hidden states")
    catch_up = LevelStep(lower, level=0, top=2, compile=compile, compile_after_uses=1)
    verify = LevelStep(from_hidden, level=1, top=2, compile=compile, compile_after_uses=1)
    rows = np.arange(batch, dtype=np.int64)
    at = np.full(batch, context, dtype=np.int64)  # [B] each row's cached tokens

    def step(n: int) -> None:
        # the hidden states at [at, at + n - 1) were written by earlier calls: timing does not read them
        catch_up.feed(state, rows, at + n - 1, at + n)
        verify(state, rows, at, at + n, at)

    steps = [lambda n=n: step(n) for n in spans]
    with torch.inference_mode():
        catch_up.feed(state, rows, np.zeros_like(at), at)  # the context, through the exit...
        verify(state, rows, np.zeros_like(at), at, at - 1)  # ...and the upper layers from it
        return _timed(steps, spans, (), clock, device, warmup, repeats, crowd_bytes)


def _profile(spans: Sequence[int], drafts: Sequence[int], medians: list[float], noise: float) -> CostProfile:
    """A profile from ``interleaved_medians`` over the verification steps, then the draft steps."""
    return CostProfile(
        tuple(spans), tuple(medians[: len(spans)]), tuple(drafts), tuple(medians[len(spans) :]), noise
    )


def cache_crowd(num_bytes: int, device: torch.device) -> Callable[[], None]:
    """A call that reads and writes ``num_bytes`` of memory on ``device``: what the other levels of a
    chain do to the caches between two steps of one model (their weights pass through). Timed
    alone, a small model's steps find their weights in the cache; in a chain of the zoo's models
    they do not (compiled, the 4 M-parameter draft's one-token step took 343 us alone, 505 us right
    after the other models' steps; docs/design.md, "Where the latency model errs")."""
    buffer = torch.zeros(max(1, num_bytes // 4), dtype=torch.float32, device=device)

    def crowd() -> None:
        buffer.add_(1.0)

    return crowd


def crowd_bytes(models: Sequence[torch.nn.Module]) -> list[int]:
    """For each of ``models``, the bytes of the other models' parameters that are not its own: what
    the other levels of a chain read between two of its steps (``forward_costs(crowd_bytes=)``). A
    tensor two levels share counts once, and never against a level that holds it, which reads it in
    its own step: an early exit's layers, embedding and head are its target's, so an exit and its
    target alone crowd each other by nothing but the target's layers past the exit."""
    held = [{(p.data_ptr(), p.numel()): p.numel() * p.element_size() for p in m.parameters()} for m in models]
    crowds = []
    for mine in held:
        others = {key: size for theirs in held if theirs is not mine for key, size in theirs.items()}
        crowds.append(sum(size for key, size in others.items() if key not in mine))
    return crowds


COST_METHOD = 2
"""The version of how a cost is timed and stored, part of every cost's key with the torch release and
the machine (``timing_environment``): bumped when a change to the steps changes what they cost or
the entry changes form (2: entries carry the anchor workload's time, ``anchor_seconds``)."""


def timing_environment(device: torch.device) -> str:
    """What a step's cost depends on besides the model and the step: ``COST_METHOD``, the torch
    release, and the CPU threads (on a CPU) or the GPU's name (on CUDA)."""
    release = torch.__version__.split("+")[0]
    if device.type == "cuda":
        where = torch.cuda.get_device_name(device).replace(" ", "-")
    else:
        where = f"threads {torch.get_num_threads()}"
    return f"m{COST_METHOD} torch {release} {where}"


ANCHOR_TOLERANCE = 0.25
"""How far (relative) the anchor workload's time may have moved since a cost entry was timed before
the entry is taken as another machine's or another time's, and timed again."""


def anchor_seconds(device: torch.device, clock: Callable[[], float] = time.perf_counter) -> float:
    """Median seconds of a fixed workload shaped like a small model's decode step (a few GEMVs into
    and out of a [256]-wide hidden state, a softmax over an 8k vocabulary), timed on ``device`` the way
    steps are. Stored with every cost entry and timed again before one is reused: the same cost
    entries predicted the zoo's no-draft decoding at 605 tok/s in the process that timed them
    (measured 585) and at 605 where a process two days later measured 902 (docs/design.md, "Where the
    latency model errs"). What the machine or the process changes, this workload sees too."""
    generator = torch.Generator(device="cpu").manual_seed(0)
    hidden = torch.randn(1, 256, generator=generator).to(device)
    up = torch.randn(256, 768, generator=generator).to(device) / 16
    down = torch.randn(768, 256, generator=generator).to(device) / 28
    head = torch.randn(256, 8192, generator=generator).to(device) / 16

    def workload() -> None:
        x = hidden
        for _ in range(6):  # layers
            x = x + torch.relu(x @ up) @ down
        torch.softmax(x @ head, dim=-1)

    with torch.inference_mode():
        medians, _ = interleaved_medians([workload], clock, device, warmup=3, repeats=15)
    return medians[0]


SETTLE_CALLS = 30
"""Most warm-up calls spent waiting for a step's time to settle (see ``interleaved_medians``)."""
MAD_TO_STD = 1.4826
"""Median absolute deviation to standard deviation (normal noise): a spread that ignores outliers."""
MEDIAN_STD_ERROR = 1.2533
"""The standard error of a median of n normal samples is about this times sigma / sqrt(n)."""
NOISE_GOAL = 0.03
"""Timing goes on past ``repeats`` rounds while the noise is above this (3 standard errors: 9 %, less
than the gains a pick is told apart by), up to ``MAX_REPEATS`` rounds or ``EXTRA_SECONDS`` more: five
rounds of the zoo's compiled sub-millisecond steps left 0.07-0.18, and a pick's predicted gain of 18 %
was then called noise."""
MAX_REPEATS = 60
"""Most rounds ``interleaved_medians`` times (noise falls as one over the root of the rounds)."""
EXTRA_SECONDS = 2.0
"""Most clock seconds spent on rounds past ``repeats`` (``before`` included): steps that are slow or
a machine that stays noisy end there."""


def interleaved_medians(
    steps: Sequence[Callable[[], object]],
    clock: Callable[[], float],
    device: torch.device,
    warmup: int,
    repeats: int,
    before: Callable[[], object] | None = None,
) -> tuple[list[float], float]:
    """Median seconds of each step over at least ``repeats`` rounds, and the noise of those medians.

    Warm-up: each step at least ``warmup`` calls, until three calls in a row agree within 20 %
    (right after ``torch.compile`` has built a step, with the C++ wrapper on a CPU, its calls can run
    100x slower for a while). Then round r times every step once, starting from step r: load that
    comes and goes lands on different steps in different rounds. Noise: the largest relative
    standard error of a median, from the spread of its repeats (median absolute deviation). Past
    ``repeats`` rounds, more follow while the noise is above ``NOISE_GOAL``, up to ``MAX_REPEATS``
    rounds and ``EXTRA_SECONDS``. ``before``: called before every timed call, outside the timing."""

    def once(run: Callable[[], object]) -> float:
        if before is not None:
            before()
        synchronize(device)
        begin = clock()
        run()  # rewrites the same slots each time
        synchronize(device)
        return clock() - begin

    for run in steps:
        recent = [once(run) for _ in range(warmup)]
        while len(recent) < SETTLE_CALLS and (len(recent) < 3 or max(recent[-3:]) > 1.2 * min(recent[-3:])):
            recent.append(once(run))
    samples: list[list[float]] = [[] for _ in steps]

    def round_(r: int) -> None:
        for i in [*range(r % len(steps), len(steps)), *range(r % len(steps))]:
            samples[i].append(once(steps[i]))

    for r in range(repeats):
        round_(r)
    medians, noise = _medians_and_noise(samples)
    extra_from = clock()
    for r in range(repeats, MAX_REPEATS):
        if noise <= NOISE_GOAL or clock() - extra_from >= EXTRA_SECONDS:
            break
        round_(r)
        medians, noise = _medians_and_noise(samples)
    return medians, noise


def _medians_and_noise(samples: list[list[float]]) -> tuple[list[float], float]:
    """Each step's median, and the largest relative standard error of a median (see above)."""
    medians = [statistics.median(times) for times in samples]
    noise = 0.0
    for times, median in zip(samples, medians, strict=True):
        spread = MAD_TO_STD * statistics.median(abs(t - median) for t in times)
        if median > 0:
            noise = max(noise, MEDIAN_STD_ERROR * spread / median / len(times) ** 0.5)
    return medians, noise


MAX_WARMUPS = 4
"""Most warm-up passes spent waiting for compilation to end (a pass that compiled nothing ends it)."""


def compilations() -> int:
    """Graphs ``torch.compile`` has built in this process (ours and HF's), from dynamo's counters
    (a private table: 0 where it is missing, and then no warm-up waits for compilation to end)."""
    try:
        from torch._dynamo.utils import counters

        return int(counters["stats"]["unique_graphs"])
    except (ImportError, KeyError, TypeError):
        return 0


def warm_up(run: Callable[[], object], compiled: Callable[[], int] = compilations) -> None:
    """Call ``run`` until a call compiles nothing (at most ``MAX_WARMUPS`` calls): compiled steps
    compile a shape at its third use, which one call may not reach. ``compiled``: a count of the
    compilations so far."""
    for _ in range(MAX_WARMUPS):
        before = compiled()
        run()
        if compiled() == before:
            return


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
