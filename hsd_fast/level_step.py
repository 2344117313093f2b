"""One level of a run as the engine calls it: its runner, and a step function per step *shape*
(kind, fed width, output width or draft count), eager or compiled, chosen by the compile policy
(``compile_policy.py``). The step functions themselves are the chain steps (``steps.py``: feed,
draft, verify) and the token-tree steps (``tree_steps.py``: tree draft, tree verify), bound to the
level's runner and widths by ``_STEP_KINDS``.
"""

from __future__ import annotations

import functools
import time
import warnings
from collections.abc import Callable

import numpy as np
import torch

from hsd_fast.attached import attached
from hsd_fast.compile_policy import (
    COMPILE_AFTER_USES,
    COMPILED_MAX_WIDTH,
    MAX_COVER_WASTE,
    Compiling,
    compiled_step,
    fingerprint,
    graph_memory_ok,
)
from hsd_fast.decode_state import DecodeState
from hsd_fast.layout import MAX_WIDTH, bucket, head_chunks
from hsd_fast.steps import Runner, draft_step, feed_step, verify_step
from hsd_fast.tree_steps import tree_draft_step, tree_verify_step


def _feed(level: LevelStep, width: int, out_width: int, keep_q: bool, use_kernel: bool | None) -> Callable:
    return functools.partial(feed_step, level.runner, width=width)


def _draft(level: LevelStep, width: int, out_width: int, keep_q: bool, use_kernel: bool | None) -> Callable:
    return functools.partial(
        draft_step, level.runner, width=width, count=out_width, keep_q=keep_q, use_kernel=use_kernel,
        below_target=level.level < level.top,
    )  # fmt: skip


def _verify(level: LevelStep, width: int, out_width: int, keep_q: bool, use_kernel: bool | None) -> Callable:
    return functools.partial(
        verify_step, level.runner, level=level.level, width=width, out_width=out_width,
        keep_q=keep_q, use_kernel=use_kernel, point_mass=level.point_mass,
        below_target=level.level < level.top,
    )  # fmt: skip


def _tree_draft(
    level: LevelStep, width: int, out_width: int, keep_q: bool, use_kernel: bool | None
) -> Callable:
    return functools.partial(tree_draft_step, level.runner, width=width)


def _tree_verify(
    level: LevelStep, width: int, out_width: int, keep_q: bool, use_kernel: bool | None
) -> Callable:
    return functools.partial(
        tree_verify_step, level.runner, level.tree_below, width=width, keep_q=keep_q,
        below_target=level.level < level.top,
    )  # fmt: skip


_STEP_KINDS: dict[str, Callable[[LevelStep, int, int, bool, bool | None], Callable]] = {
    "feed": _feed,  # cache a chunk of a long span, no outputs
    "draft": _draft,  # level 0 draws a chain
    "verify": _verify,  # level >= 1 verifies a chain
    "tree draft": _tree_draft,  # level 0 drafts a token tree
    "tree verify": _tree_verify,  # level 1 verifies it
}
"""Each kind of step: (level, fed width, output width or draft count, keep_q, use_kernel) -> the
eager step function ``fn(state, spans)``. The token-tree steps plug in as the chain steps do."""


class LevelStep:
    """One level of a run: its runner and its step functions, one per step *shape* (kind, fed width,
    output width or draft count). ``compile``: run steps through ``torch.compile`` (fullgraph,
    static shapes); a compiled graph costs tens of seconds on a CPU, so few are built
    (``choose``): a shape runs in an already compiled graph that covers it when one is at most
    ``MAX_COVER_WASTE`` times as wide, and is compiled itself only at its ``COMPILE_AFTER_USES``-th use;
    until then it runs eagerly (the same code). Prefills and steps wider than ``COMPILED_MAX_WIDTH``
    always run eagerly: a graph per prompt length would cost more to compile than it could save."""

    def __init__(
        self,
        runner: Runner,
        level: int,
        top: int,
        compile: bool = False,
        compile_after_uses: int = COMPILE_AFTER_USES,
        point_mass: bool = False,
        tree_below: Runner | None = None,
    ) -> None:
        self.runner, self.level, self.top, self.compile = runner, level, top, compile
        self.point_mass = point_mass  # it verifies a lookup level's proposals
        # A token tree at level 0 (docs/design.md, "Token trees in the engine"): level 0 drafts
        # trees; level 1 verifies them and moves the accepted path in level 0's cache too.
        self.tree_below = tree_below
        self.compile_after_uses = compile_after_uses  # 1: every shape compiles at once (profiling)
        self.functions: dict[tuple, Callable] = {}
        self.compiled: dict[tuple, list[tuple[int, int]]] = {}  # (kind, structure) -> compiled shapes
        self.uses: dict[tuple, int] = {}  # shape key -> uses so far
        self.fingerprint = fingerprint(runner)
        self.memory_capped = False  # memory allowed no more graphs (_room_for_a_graph)

    @classmethod
    def of(
        cls,
        runner: Runner,
        level: int,
        top: int,
        compile: bool = False,
        point_mass: bool = False,
        tree_below: Runner | None = None,
    ) -> LevelStep:
        """The step of ``runner`` at this place in a hierarchy (``point_mass``: above a lookup
        level; ``tree_below``: level 1 verifying the token trees this level 0 runner drafts), kept
        with the runner so that what was built (and compiled) for it serves every later run, unless
        the model changed since."""
        steps = attached(runner, "steps")  # {(level, top, compile, point mass, id(tree_below)): step}
        key = (level, top, compile, point_mass, None if tree_below is None else id(tree_below))
        if key not in steps or steps[key].fingerprint != fingerprint(runner):
            steps[key] = cls(runner, level, top, compile, point_mass=point_mass, tree_below=tree_below)
        return steps[key]

    @staticmethod
    def compile_progress_done() -> None:
        Compiling.done()

    def choose(self, kind: str, width: int, out_width: int, state: DecodeState, prefill: bool) -> Callable:
        """The function that runs a step of this shape (``width`` fed columns, ``out_width`` output
        columns or drafts): its own compiled graph, a compiled graph of the same kind at most
        ``MAX_COVER_WASTE`` times as wide that covers it (padding columns are invalid columns, and a
        verification with fewer drafts than columns leaves the first ones out), or eagerly until
        the shape has been used ``COMPILE_AFTER_USES`` times. A step that could compile runs in a
        wider covering graph rather than eagerly while it waits."""
        if not self.compile or prefill or width > COMPILED_MAX_WIDTH:
            return self.function(kind, width, out_width, state, compiled=False)
        family = (kind, *state.structure)
        compiled = self.compiled.setdefault(family, [])
        covering = sorted((w, o) for w, o in compiled if w >= width and o >= out_width)
        if covering and ((width, out_width) in compiled or covering[0][0] <= MAX_COVER_WASTE * width):
            return self.function(kind, *covering[0], state, compiled=True)  # its own graph comes first
        key = (*family, width, out_width)
        self.uses[key] = self.uses.get(key, 0) + 1
        if self.uses[key] >= self.compile_after_uses and state.deferred is not None:
            state.deferred.add((self, kind, width, out_width, state.tree))  # compiled once the run is over
        elif self.uses[key] >= self.compile_after_uses and self._room_for_a_graph(state.tokens.device):
            compiled.append((width, out_width))
            return self.function(kind, width, out_width, state, compiled=True)
        if covering:
            return self.function(kind, *covering[0], state, compiled=True)
        state.warm_up_steps += 1
        return self.function(kind, width, out_width, state, compiled=False)

    @staticmethod
    def compile_deferred(state: DecodeState) -> int:
        """Compile the step shapes a run deferred (``state.deferred``: an adaptive run compiles
        nothing while it decodes, so no switch waits for a compiler), each by one call in which
        every row sits out (padding into the scratch slots only), so that later runs find them.
        Returns how many graphs were compiled."""
        count = 0
        idle = torch.zeros(
            (5, state.num_rows), dtype=torch.int64, device=state.tokens.device
        )  # no row active
        for level, kind, width, out_width, tree in sorted(
            state.deferred or (), key=lambda d: (d[0].level, *d[1:4])
        ):
            state.set_tree(tree)  # a token tree's steps are built for its topology
            family = level.compiled.setdefault((kind, *state.structure), [])
            if (width, out_width) in family or not level._room_for_a_graph(state.tokens.device):
                continue
            family.append((width, out_width))
            level.function(kind, width, out_width, state, compiled=True)(state, idle)
            count += 1
        return count

    def feed(self, state: DecodeState, rows: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> float:
        """Only cache positions ``[starts, ends)`` of ``rows`` (``[R]`` each; empty spans allowed):
        an early exit caught up before the level above verifies from its hidden states. No host
        sync. Returns the seconds spent."""
        full = np.zeros((5, state.num_rows), dtype=np.int64)
        full[:, rows] = np.stack([starts, ends, ends, ends > starts, np.zeros_like(rows)])
        started = time.perf_counter()
        longest = self._feed_heads(state, full, full[1])
        if longest > 0:
            fn = self.choose("feed", bucket(longest), 0, state, prefill=False)
            fn(state, torch.from_numpy(full).to(state.tokens.device))
        return time.perf_counter() - started

    def _feed_heads(self, state: DecodeState, full: np.ndarray, span_ends: np.ndarray) -> int:
        """Feed the heads of spans longer than ``MAX_WIDTH`` (prompts), ``MAX_WIDTH`` at a time,
        moving their starts (``full[0]``) past them. Returns the longest span left."""
        longest = int((span_ends - full[0]).max())
        if longest <= MAX_WIDTH:
            return longest
        for head_start, head_end in head_chunks(full[0], span_ends, MAX_WIDTH):
            chunk = np.stack([head_start, head_end, head_end, head_end > head_start, head_end * 0])
            self.function("feed", MAX_WIDTH, 0, state)(state, torch.from_numpy(chunk).to(state.tokens.device))
            full[0] = np.maximum(full[0], head_end)
        return int((span_ends - full[0]).max())

    def _room_for_a_graph(self, device: torch.device) -> bool:
        """Whether memory allows one more compiled graph of this level. On a CPU each graph holds
        its own packed copy of the model's weights (``CPU_INDUCTOR_CONFIG``), so graphs of a large
        model can exhaust the memory; past ``graph_memory_ok``'s limit a new shape runs in a
        covering graph or eagerly (the same tokens), and the run warns once."""
        if self.memory_capped:
            return False
        if device.type != "cpu":
            return True
        model = getattr(self.runner, "model", None)
        if not isinstance(model, torch.nn.Module):
            return True
        weights = sum(p.numel() * p.element_size() for p in model.parameters())
        if graph_memory_ok(weights):
            return True
        self.memory_capped = True
        warnings.warn(
            f"hsd_fast: level {self.level}'s model ({weights / 2**30:.2f} GiB of weights) compiles no more "
            "step graphs: each holds its own copy of the weights on a CPU and memory is short; new step "
            "shapes run eagerly or in a wider graph (same tokens, slower)",
            RuntimeWarning,
            stacklevel=2,
        )
        return False

    def function(
        self, kind: str, width: int, out_width: int, state: DecodeState, compiled: bool = False
    ) -> Callable:
        """The step function for these widths, compiled or eager (built once, then kept)."""
        key = (kind, width, out_width, compiled, *state.structure)
        fn = self.functions.get(key)
        if fn is None:
            keep_q = state.q_logits is not None and self.level < self.top
            use_kernel = False if compiled else state.sampling.use_kernel  # compiled: traced torch
            fn = _STEP_KINDS[kind](self, width, out_width, keep_q, use_kernel)
            if compiled:
                device = state.tokens.device
                name = f"level {self.level} {kind} {width}x{out_width}"
                fn = Compiling(compiled_step(fn, device), name, device, getattr(self.runner, "model", None))
            self.functions[key] = fn
        return fn

    @staticmethod
    def spans(
        num_rows: int,
        rows: np.ndarray,  # [R] the rows that take part
        starts: np.ndarray,  # [R] what each feeds: [starts, ends) (the ledger's spans)
        ends: np.ndarray,  # [R]
        outs: np.ndarray,  # [R] a verification's drafts are [outs + 1, ends)
        wanted: np.ndarray | None = None,  # [R] drafts: tokens each row wants drawn
    ) -> np.ndarray:  # [5, B]
        """A step's spans over the whole batch: starts, ends, outs, active, wanted (rows that sit out:
        zeros)."""
        full = np.zeros((5, num_rows), dtype=np.int64)
        full[:, rows] = np.stack(
            [starts, ends, outs, np.ones_like(rows), np.ones_like(rows) if wanted is None else wanted]
        )
        return full

    def launch(
        self,
        state: DecodeState,
        full: np.ndarray,  # [5, B] the spans (``spans``); with ``on_device``: their widest case
        count: int | None = None,  # drafts: the most tokens a draft step of this run draws (T_0)
        on_device: torch.Tensor | None = None,  # [5, B] the spans already on the device, within ``full``
    ) -> torch.Tensor:  # [3, B] on the device ([3 + K, B] for a token tree's verification)
        """Run the step for the active rows of ``full`` and return its output unread (no host sync):
        a long span's head chunks, then the step function of this shape. ``on_device``: the spans
        already on the device (``round_steps.draft_and_verify``: copied ahead, or a verification's
        ends computed there from the draft's own counts); ``full`` then says the widest they can be,
        which chooses the step's shape, and must fit one step (no head chunks)."""
        if on_device is not None and int((full[1] - full[0]).max()) > MAX_WIDTH:
            raise ValueError(f"spans already on the device must fit one step ({MAX_WIDTH} columns)")
        rows = np.flatnonzero(full[3])
        # What is fed in chunks: the span, or before a token tree's verification, the span up to
        # the tree (its nodes follow in the step).
        longest = self._feed_heads(state, full, full[2] + 1 if self.tree_below is not None else full[1])
        prefill = bool((full[0, rows] == 0).any())
        if state.tree is not None and self.level <= 1:  # a token tree: its shape is the tree's
            kind = "tree draft" if self.level == 0 else "tree verify"
            fn = self.choose(kind, bucket(max(longest, 1)), 0, state, prefill)
        elif self.level == 0:
            drawn = int(full[4].max())
            fixed = self.compile and count is not None and drawn <= count and not prefill
            fn = self.choose("draft", bucket(longest), count if fixed else drawn, state, prefill)
        else:
            out_width = bucket(int((full[1] - full[2]).max()))
            fn = self.choose("verify", bucket(longest), out_width, state, prefill)
        if on_device is None:
            on_device = torch.from_numpy(full).to(state.tokens.device)
        return fn(state, on_device)

    def __call__(
        self,
        state: DecodeState,
        rows: np.ndarray,  # [R] the rows that take part
        starts: np.ndarray,  # [R] what each feeds: [starts, ends) (the ledger's spans)
        ends: np.ndarray,  # [R]
        outs: np.ndarray,  # [R] a verification's drafts are [outs + 1, ends)
        wanted: np.ndarray | None = None,  # [R] drafts: tokens each row wants drawn
        count: int | None = None,  # drafts: the most tokens a draft step of this run draws (T_0)
    ) -> tuple[np.ndarray, float]:
        """Run the step for ``rows`` and read its output. Returns ``[3, R]`` (a draft: tokens drawn
        and whether the last is an EOS; a verification: accepted counts and whether the new token is
        an EOS; and whether the row's logits held a NaN or +inf; a token tree's verification adds
        the rank of the accepted node at each depth, ``[3 + K, R]``) and the seconds spent in
        forwards (a long span's head chunks, then the step function, its host sync included): a
        round's remaining time is the host's own work. A compiled draft step always draws ``count``
        tokens' worth of forwards (rows stop at their ``wanted``): one graph serves the whole run,
        whatever is left of a row's budget."""
        full = self.spans(state.num_rows, rows, starts, ends, outs, wanted)
        started = time.perf_counter()  # the head chunks are forwards too, not the engine's host work
        out = self.launch(state, full, count).cpu().numpy()  # the step's one host sync
        return out[:, rows], time.perf_counter() - started
