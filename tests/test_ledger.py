"""The C++ ledger `hsd_fast._C.Ledger` against its Python model (tests/ledger_model.py).

1. Property tests. Random ledgers run random *legal* operation sequences chosen by the model itself
   (its next level or another wanted one, all its rows or a subset, random EOS flags and acceptance
   counts; rows held at their round boundaries and, once every row is finished or held, a random new
   hierarchy); after every operation every observable of the two must agree, the model must keep the
   invariants of docs/design.md, "Invariants", and a per-row bound on the operations (so every run
   terminates).
   Random, mostly illegal calls must fail alike (ValueError in both) or succeed alike.
2. Error paths, for the model and the extension alike.
3. Hand-written scenarios with exact numbers, and one large batch through the extension.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from ledger_model import POLICIES, LedgerModel

from hsd_fast._C import Ledger

IMPLS = pytest.mark.parametrize("impl", [LedgerModel, Ledger], ids=["model", "extension"])

BULK_VIEWS = (
    "frontiers",
    "cached_lens",
    "seq_lens",
    "output_lens",
    "eos_positions",
    "wanted_levels",
    "holds",
)
ROW_QUERIES = ("seq_len", "committed_len", "last_tag", "output_len", "wanted_level")
METHODS = (
    *BULK_VIEWS,
    *ROW_QUERIES,
    "pending",
    "tags",
    "finished",
    "held",
    "all_finished",
    "next_level",
    "rows_for",
    "spans",
    "commit_draft",
    "commit_proposal",
    "commit_verify",
    "hold",
    "reconfigure",
)
PROPERTIES = ("num_levels", "num_rows", "block_sizes", "policy")


# ------------------------------------------------------------------------------------ helpers
def assert_int64(expected: np.ndarray, actual: np.ndarray, what: str) -> None:
    """Same values, same shape, both numpy int64."""
    for arr in (expected, actual):
        assert isinstance(arr, np.ndarray), f"{what}: {type(arr).__name__}, not np.ndarray"
        assert arr.dtype == np.int64, f"{what}: dtype {arr.dtype}"
    assert expected.shape == actual.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    # np.array_equal, not np.testing: this runs ~100 times per operation, and np.testing is slow.
    assert np.array_equal(actual, expected), f"{what}: extension {actual} != model {expected}"


def assert_same_value(expected: object, actual: object, what: str) -> None:
    """Same value and same Python type (int stays int, bool stays bool)."""
    assert type(actual) is type(expected), f"{what}: {type(actual)} != {type(expected)}"
    assert actual == expected, f"{what}: extension {actual!r} != model {expected!r}"


def assert_same(model: LedgerModel, ext: Ledger, per_row: bool = True) -> None:
    """Every observable of the model and the extension agrees (per_row=False: the bulk views,
    the schedule and the spans only; cheaper, for use between the operations of a burst)."""
    for name in BULK_VIEWS:
        assert_int64(getattr(model, name)(), getattr(ext, name)(), f"{name}()")
    assert_same_value(model.next_level(), ext.next_level(), "next_level()")
    assert_same_value(model.all_finished(), ext.all_finished(), "all_finished()")
    for level in range(model.num_levels):
        rows = model.rows_for(level)
        assert_int64(rows, ext.rows_for(level), f"rows_for({level})")
        assert_same_spans(model, ext, level, rows)
    if not per_row:
        return
    for name in PROPERTIES:
        assert_same_value(getattr(model, name), getattr(ext, name), name)
    for row in range(model.num_rows):
        for name in ROW_QUERIES:
            assert_same_value(getattr(model, name)(row), getattr(ext, name)(row), f"{name}({row})")
        assert_same_value(model.finished(row), ext.finished(row), f"finished({row})")
        assert_same_value(model.held(row), ext.held(row), f"held({row})")
        assert_int64(model.tags(row), ext.tags(row), f"tags({row})")
        for level in range(model.num_levels):
            what = f"pending({row}, {level})"
            assert_same_value(model.pending(row, level), ext.pending(row, level), what)


def assert_same_spans(model: LedgerModel, ext: Ledger, level: int, rows) -> None:
    expected, actual = model.spans(level, rows), ext.spans(level, rows)
    assert isinstance(actual, tuple) and len(actual) == 3
    for name, e, a in zip(("feed_start", "feed_end", "out_start"), expected, actual, strict=True):
        assert_int64(e, a, f"spans({level}, {list(rows)}).{name}")


def check_invariants(model: LedgerModel) -> None:
    """docs/design.md, "Invariants", stated on the model's observables."""
    top, sizes = model.num_levels - 1, model.block_sizes
    frontier, cached, eos_pos = model.frontiers(), model.cached_lens(), model.eos_positions()
    for r in range(model.num_rows):
        f, c, eos = frontier[r], cached[r], int(eos_pos[r])
        n, committed = model.seq_len(r), model.committed_len(r)
        prompt, budget_end = model.prompt_lens[r], model.budget_end[r]
        # Tags never increase along a row; the prompt is tagged K; the budget bounds the row.
        assert f[0] == n and f[top] == committed
        assert np.all(np.diff(f) <= 0), f"row {r}: frontiers {f} increase"
        assert prompt <= committed <= n <= budget_end
        tags = model.tags(r)
        assert len(tags) == n and np.all(np.diff(tags) <= 0) and np.all(tags[:prompt] == top)
        counts = np.bincount(tags, minlength=model.num_levels)
        assert counts[top] == committed
        for level in range(top):
            assert counts[level] == model.pending(r, level)
        finished, wanted, held = model.finished(r), model.wanted_level(r), model.held(r)
        # Level 0 never holds its own last draft while the row runs; a level >= 1 holds at most its
        # tagged prefix. At a round boundary every level feeds at least the last token.
        assert np.all(c >= 0) and np.all(c[1:] <= f[1:]) and c[0] <= n - (0 if finished else 1)
        boundary = f[0] == f[top] and not model.closed[r]
        if boundary and not finished:
            assert np.all(c <= n - 1), f"row {r}: cached {c} at a boundary of {n}"
        # EOS: only drawn tokens; while the row runs, it can only be its last token.
        assert eos == -1 or prompt <= eos < n
        assert model.output_len(r) == (eos + 1 if 0 <= eos < committed else committed)
        assert finished == (0 <= eos < committed or committed >= budget_end)
        if finished:
            assert wanted == -1
            continue
        if held:  # waits at its round boundary
            assert wanted == -1 and boundary and eos == -1
            continue
        assert eos in (-1, n - 1) and 0 <= wanted <= top
        if wanted == 0:  # drafting: below every block size, before any EOS and the budget
            assert eos == -1 and n < budget_end
            assert all(model.pending(r, lvl) < sizes[lvl] for lvl in range(top))
        else:  # verifying: nothing pending below, a non-empty block (empty only after an empty
            # proposal: level 1 then decodes one token), logits inside the feed
            assert f[wanted - 1] == n and (n - f[wanted] >= 1 or (wanted == 1 and model.closed[r]))
            assert c[wanted] <= f[wanted] - 1
            assert all(model.pending(r, lvl) < sizes[lvl] for lvl in range(wanted, top))
    for level in range(model.num_levels):
        rows = model.rows_for(level)
        starts, ends, outs = model.spans(level, rows)
        assert np.all(starts <= outs) and np.all(outs < ends)
        if level == 0:
            assert np.all(outs == ends - 1)
        else:
            block = [model.pending(r, level - 1) for r in rows.tolist()]
            assert np.array_equal(ends - outs - 1, np.array(block, dtype=np.int64))
    wanted = [w for w in model.wanted_levels().tolist() if w >= 0]
    if wanted:
        best = model.next_level()
        if model.policy == "highest_level":
            assert best == max(wanted)
        else:
            assert all(wanted.count(best) >= wanted.count(w) for w in wanted)
            assert all(wanted.count(best) > wanted.count(w) for w in wanted if w > best)
    else:
        assert model.next_level() == -1
        assert all(model.finished(r) or model.held(r) for r in range(model.num_rows))


def max_ops(model: LedgerModel, row: int, start: int | None = None) -> int:
    """Bound on the operations a row can have had. Between two operations of level >= i + 1 a row
    runs level i at most T_i times (each run adds a token tagged >= i; the T_i-th fills the batch),
    and every top-level operation commits at least one token. So with N_K top-level operations so
    far (N_K <= committed - prompt), N_0 + 1 <= (N_K + 1) * prod(T_i + 1). ``start``: the committed
    length when the operations began to be counted (the last reconfigure; by default the prompt's)."""
    start = model.prompt_lens[row] if start is None else start
    progress = model.committed_len(row) - start
    return (progress + 1) * math.prod(t + 1 for t in model.block_sizes) - 1


def proposal_room(model: LedgerModel, row: int) -> int:
    """The most tokens a proposal of ``row`` may hold: the room left in level 0's block and in the
    row's length budget."""
    room_in_block = model.block_sizes[0] - model.pending(row, 0)
    return min(room_in_block, model.budget_end[row] - model.seq_len(row))


def snapshot(model: LedgerModel) -> dict[str, np.ndarray]:
    views = {name: getattr(model, name)() for name in BULK_VIEWS}
    views["finished"] = np.array([model.finished(r) for r in range(model.num_rows)])
    return views


def check_transition(
    before: dict, model: LedgerModel, level: int, rows: list[int], drawn: list[int] | None = None
) -> None:
    """What one legal operation may change: only its rows, committed output only grows. ``drawn``:
    the tokens a level-0 operation added per row (a draft: one each)."""
    after = snapshot(model)
    others = np.setdiff1d(np.arange(model.num_rows), rows)
    for name in BULK_VIEWS:
        assert np.array_equal(after[name][others], before[name][others]), f"{name} of others"
    top = model.num_levels - 1
    assert np.all(after["frontiers"][:, top] >= before["frontiers"][:, top]), "committed shrank"
    assert np.all(after["output_lens"] >= before["output_lens"])
    assert np.all(after["finished"] >= before["finished"]), "a finished row restarted"
    # The op's tags above `level` are untouched; a draft adds exactly one token.
    for i, r in enumerate(rows):
        assert np.array_equal(after["frontiers"][r, level + 1 :], before["frontiers"][r, level + 1 :])
        if level == 0:
            assert after["seq_lens"][r] == before["seq_lens"][r] + (1 if drawn is None else drawn[i])


# -------------------------------------------------------------------------- strategies
@st.composite
def configs(draw) -> dict:
    num_levels = draw(st.integers(1, 4), label="num_levels")
    rows = draw(st.integers(1, 5), label="rows")
    per_row_budget = st.lists(st.integers(0, 12), min_size=rows, max_size=rows)
    return {
        "num_levels": num_levels,
        "block_sizes": draw(st.lists(st.integers(1, 4), min_size=num_levels - 1, max_size=num_levels - 1)),
        "prompt_lens": draw(st.lists(st.integers(1, 6), min_size=rows, max_size=rows)),
        "max_new_tokens": draw(st.one_of(per_row_budget, st.integers(0, 12))),
        "policy": draw(st.sampled_from(POLICIES)),
    }


def as_sequence(kind: str, values: list[int]):
    """The same integers as a list, a tuple or a numpy array of some integer dtype."""
    if kind == "tuple":
        return tuple(values)
    if kind == "list":
        return list(values)
    if kind == "strided":  # a non-contiguous view
        return np.repeat(np.asarray(values, dtype=np.int64), 2)[::2]
    return np.asarray(values, dtype=kind)


SEQUENCE_KINDS = st.sampled_from(["list", "tuple", "int64", "int32", "strided"])
EOS_FLAG = st.integers(0, 9).map(lambda v: int(v == 9))  # EOS ~10% of the time; shrinks to 0


# ---------------------------------------------------------------------- 1. property tests
class LedgerMachine(RuleBasedStateMachine):
    """One ledger config, the model and the extension side by side, random operations."""

    @initialize(cfg=configs())
    def build(self, cfg: dict) -> None:
        note(f"config: {cfg}")
        self.model, self.ext = LedgerModel(**cfg), Ledger(**cfg)
        self.restart_count()

    def restart_count(self) -> None:
        """Counts operations per row from here on, for the termination bound (a reconfigure changes
        the block sizes, and the bound with them)."""
        self.ops = [0] * self.model.num_rows
        self.start = [self.model.committed_len(r) for r in range(self.model.num_rows)]

    @rule(data=st.data())
    def step(self, data) -> None:
        """Mostly a burst of legal operations, sometimes an arbitrary call. (One rule, so that
        Hypothesis' swarm testing cannot switch the legal operations off for a whole run.)"""
        if data.draw(st.sampled_from(["legal"] * 3 + ["arbitrary"]), label="kind") == "arbitrary":
            self.arbitrary_call(data)
        else:
            self.legal_steps(data)

    def legal_steps(self, data) -> None:
        """Legal operations (bursts reach deep states within few machine steps), every observable
        compared after each; nothing once every row is finished or held."""
        for _ in range(data.draw(st.integers(1, 8), label="burst")):
            if self.model.next_level() < 0:
                return
            self.legal_step(data)
            assert_same(self.model, self.ext, per_row=False)  # in full after the burst

    def legal_step(self, data) -> None:
        model = self.model
        level = model.next_level()
        wanted = sorted({w for w in model.wanted_levels().tolist() if w >= 0})
        if len(wanted) > 1 and data.draw(st.booleans(), label="other level"):
            level = data.draw(st.sampled_from(wanted), label="level")
        rows = model.rows_for(level).tolist()
        if len(rows) > 1 and data.draw(st.booleans(), label="subset"):
            subset = st.lists(st.sampled_from(rows), min_size=1, max_size=len(rows), unique=True)
            rows = data.draw(subset, label="rows")
        kind = data.draw(SEQUENCE_KINDS, label="sequence kind")
        seq_rows = as_sequence(kind, rows)
        assert_same_spans(model, self.ext, level, seq_rows)
        before = snapshot(model)
        drawn = None
        if level == 0 and model.num_levels > 1 and data.draw(st.booleans(), label="proposal"):
            drawn = [data.draw(st.integers(0, proposal_room(model, r)), label="count") for r in rows]
            last_eos = [int(n > 0 and data.draw(EOS_FLAG, label="last is EOS")) for n in drawn]
            note(f"commit_proposal({rows}, {drawn}, {last_eos})")
            args = (seq_rows, as_sequence(kind, drawn), as_sequence(kind, last_eos))
            model.commit_proposal(*args)
            assert self.ext.commit_proposal(*args) is None
            assert all(model.wanted_level(r) == 1 for r in rows)  # level 1 verifies, even nothing
        elif level == 0:
            is_eos = data.draw(st.lists(EOS_FLAG, min_size=len(rows), max_size=len(rows)))
            seq_eos = np.array(is_eos, dtype=bool) if kind == "int32" else as_sequence(kind, is_eos)
            note(f"commit_draft({rows}, {is_eos})")
            model.commit_draft(seq_rows, seq_eos)
            assert self.ext.commit_draft(seq_rows, seq_eos) is None
        else:
            blocks = [int(model.seq_len(r) - model.frontiers()[r, level]) for r in rows]
            accepted = [data.draw(st.one_of(st.just(n), st.integers(0, n)), label="accepted") for n in blocks]
            extra_eos = data.draw(st.lists(EOS_FLAG, min_size=len(rows), max_size=len(rows)))
            note(f"commit_verify({level}, {rows}, {accepted}, {extra_eos})")
            args = (level, seq_rows, as_sequence(kind, accepted), as_sequence(kind, extra_eos))
            kept, cascaded = model.commit_verify(*args)
            kept_ext, cascaded_ext = self.ext.commit_verify(*args)
            assert_int64(kept, kept_ext, "kept_extra")
            assert_int64(cascaded, cascaded_ext, "cascaded")
            assert np.all((kept == 0) | (kept == 1)) and np.all((cascaded >= 0) & (cascaded <= level))
            for i, r in enumerate(rows):
                # A correction is always kept; then the row ends right after it (or the bonus).
                assert kept[i] == 1 or accepted[i] == blocks[i]
                new_len = before["frontiers"][r, level] + accepted[i] + kept[i]
                assert model.seq_len(r) == new_len
                assert np.all(model.frontiers()[r, : level + 1] == new_len)
                if accepted[i] < blocks[i]:  # rollback: no cache may hold the rejected position
                    assert np.all(model.cached_lens()[r] <= new_len - 1)
                else:
                    assert cascaded[i] == 0
        check_transition(before, model, level, rows, drawn)
        for r in rows:
            self.ops[r] += 1

    def arbitrary_call(self, data) -> None:
        """Any call, mostly illegal: the model and the extension fail alike or succeed alike."""
        model, num_rows, num_levels = self.model, self.model.num_rows, self.model.num_levels
        method = data.draw(
            st.sampled_from(
                [
                    "spans",
                    "commit_draft",
                    "commit_proposal",
                    "commit_verify",
                    "rows_for",
                    "row query",
                    "hold",
                    "reconfigure",
                ]
            )
        )
        level = data.draw(st.integers(-1, num_levels), label="level")
        rows = data.draw(st.lists(st.integers(-1, num_rows), max_size=num_rows + 1), label="rows")

        def values(lo: int, hi: int) -> list[int]:
            size = max(0, len(rows) + data.draw(st.sampled_from([0, 0, 0, -1, 1])))
            return data.draw(st.lists(st.integers(lo, hi), min_size=size, max_size=size))

        if method == "spans":
            args = (level, rows)
        elif method == "commit_draft":
            args = (rows, values(-1, 2))
        elif method == "commit_proposal":
            args = (rows, values(-1, 5), values(0, 1))
        elif method == "commit_verify":
            args = (level, rows, values(-1, 5), values(0, 1))
        elif method == "rows_for":
            args = (level,)
        elif method == "hold":
            args = (rows,)
        elif method == "reconfigure":
            sizes = data.draw(st.lists(st.integers(0, 3), max_size=3), label="block sizes")
            size = num_rows * (len(sizes) + 1) + data.draw(st.sampled_from([0, 0, 0, -1, 1]))
            top = int(max(model.committed_len(r) for r in range(num_rows)))
            args = (sizes, data.draw(st.lists(st.integers(-1, top), min_size=size, max_size=size)))
        else:
            method = data.draw(st.sampled_from([*ROW_QUERIES, "finished", "held", "tags", "pending"]))
            row = data.draw(st.integers(-2, num_rows + 1), label="row")
            args = (row, level) if method == "pending" else (row,)
        note(f"{method}{args}")
        outcomes = []
        for impl in (model, self.ext):
            try:
                outcomes.append(("ok", getattr(impl, method)(*args)))
            except ValueError as err:
                outcomes.append(("ValueError", str(err)))
        (status_model, out_model), (status_ext, out_ext) = outcomes
        assert status_model == status_ext, f"model: {out_model!r}; extension: {out_ext!r}"
        if status_model != "ok":
            return
        if isinstance(out_model, tuple):
            assert isinstance(out_ext, tuple) and len(out_ext) == len(out_model)
            for i, (e, a) in enumerate(zip(out_model, out_ext, strict=True)):
                assert_int64(e, a, f"{method} result {i}")
        elif isinstance(out_model, np.ndarray):
            assert_int64(out_model, out_ext, method)
        else:
            assert_same_value(out_model, out_ext, method)
        if method.startswith("commit_"):
            for r in rows:
                self.ops[r] += 1
        if method == "reconfigure":
            self.restart_count()

    def at_boundary(self) -> list[int]:
        """The rows hold() accepts: finished, or with no speculative token and no closed block."""
        model = self.model
        return [
            r
            for r in range(model.num_rows)
            if model.finished(r) or (model.seq_len(r) == model.committed_len(r) and not model.closed[r])
        ]

    @rule(data=st.data())
    def hold(self, data) -> None:
        """Some rows at their round boundary (held ones again, perhaps) wait: they want nothing, the
        other rows run on."""
        candidates = self.at_boundary()
        if not candidates:
            return
        if data.draw(st.booleans(), label="all at the boundary"):
            rows = candidates
        else:
            rows = data.draw(st.lists(st.sampled_from(candidates), min_size=1, unique=True), label="rows")
        kind = data.draw(SEQUENCE_KINDS, label="sequence kind")
        note(f"hold({rows})")
        before = snapshot(self.model)
        self.model.hold(as_sequence(kind, rows))
        assert self.ext.hold(as_sequence(kind, rows)) is None
        assert all(self.model.held(r) and self.model.wanted_level(r) == -1 for r in rows)
        for level in range(self.model.num_levels):
            assert not set(rows) & set(self.model.rows_for(level).tolist())
        after = snapshot(self.model)
        for name in BULK_VIEWS:  # only the flags and the wishes of the rows change
            if name not in ("holds", "wanted_levels"):
                assert np.array_equal(after[name], before[name]), name
        assert np.array_equal(after["finished"], before["finished"])
        others = np.setdiff1d(np.arange(self.model.num_rows), rows)
        assert np.array_equal(after["wanted_levels"][others], before["wanted_levels"][others])
        assert_same(self.model, self.ext)

    @rule(data=st.data())
    def reconfigure(self, data) -> None:
        """Every row finished or held: a random new hierarchy and random legal cache lengths; the rows
        keep their committed tokens, EOS and budget, and are released."""
        model = self.model
        if not all(model.finished(r) or model.held(r) for r in range(model.num_rows)):
            return
        if data.draw(st.booleans(), label="the same hierarchy, every cache kept"):
            # Always legal: how the engine releases the holds when it does not switch.
            sizes, cached = model.block_sizes, model.cached_lens().ravel().tolist()
        else:
            sizes = data.draw(st.lists(st.integers(1, 4), max_size=3), label="block sizes")
            cached = []
            for r in range(model.num_rows):
                most = model.committed_len(r) - (0 if model.finished(r) else 1)
                cached += data.draw(
                    st.lists(st.integers(0, most), min_size=len(sizes) + 1, max_size=len(sizes) + 1)
                )
        levels = len(sizes) + 1
        kind = data.draw(SEQUENCE_KINDS, label="sequence kind")
        note(f"reconfigure({sizes}, {cached})")
        before = snapshot(model)
        model.reconfigure(as_sequence(kind, sizes), as_sequence(kind, cached))
        assert self.ext.reconfigure(as_sequence(kind, sizes), as_sequence(kind, cached)) is None
        assert model.num_levels == levels and model.block_sizes == sizes
        after = snapshot(model)
        committed = before["frontiers"][:, -1]
        assert np.array_equal(after["frontiers"], np.repeat(committed[:, None], levels, axis=1))
        assert np.array_equal(after["cached_lens"].ravel(), np.array(cached, dtype=np.int64))
        assert not after["holds"].any()
        for name in ("seq_lens", "output_lens", "eos_positions", "finished"):
            assert np.array_equal(after[name], before[name]), name
        assert np.all((after["wanted_levels"] == -1) == after["finished"])  # the others draft
        assert np.all(after["wanted_levels"] <= 0)
        assert_same(self.model, self.ext)
        check_invariants(model)
        self.restart_count()

    @invariant()
    def same_observables(self) -> None:
        assert_same(self.model, self.ext)

    @invariant()
    def model_invariants(self) -> None:
        check_invariants(self.model)
        for r in range(self.model.num_rows):
            bound = max_ops(self.model, r, self.start[r])
            assert self.ops[r] <= bound, f"row {r}: {self.ops[r]} operations"


TestLedgerMachine = LedgerMachine.TestCase
TestLedgerMachine.settings = settings(stateful_step_count=30, suppress_health_check=[HealthCheck.too_slow])


@given(cfg=configs(), seed=st.integers(0, 2**32 - 1))
@settings(suppress_health_check=[HealthCheck.too_slow])
def test_default_schedule_runs_to_completion(cfg: dict, seed: int) -> None:
    """next_level() with all its rows, to the end: equal observables after every step, and the run
    ends within the operation bound."""
    rng = np.random.default_rng(seed)
    model, ext = LedgerModel(**cfg), Ledger(**cfg)
    # max_ops with the whole budget committed, summed over rows (a step runs >= 1 row).
    per_batch = math.prod(t + 1 for t in cfg["block_sizes"])
    budgets = np.array(model.budget_end) - np.array(model.prompt_lens)
    total_bound = int(np.sum((budgets + 1) * per_batch - 1))
    steps = 0
    while (level := model.next_level()) >= 0:
        assert ext.next_level() == level
        rows = model.rows_for(level)
        assert_same_spans(model, ext, level, rows)
        eos = (rng.random(len(rows)) < 0.1).astype(np.int64)
        if level == 0:
            model.commit_draft(rows, eos)
            ext.commit_draft(rows, eos)
        else:
            _, ends, outs = model.spans(level, rows)
            blocks = ends - outs - 1
            accepted = np.where(rng.random(len(rows)) < 0.5, blocks, rng.integers(0, blocks + 1))
            for e, a in zip(
                model.commit_verify(level, rows, accepted, eos),
                ext.commit_verify(level, rows, accepted, eos),
                strict=True,
            ):
                assert_int64(e, a, "commit_verify")
        assert_same(model, ext)
        steps += 1
        assert steps <= total_bound, "the run does not terminate"
    assert model.all_finished() and ext.all_finished()
    out = model.output_lens()
    assert np.all(out >= np.array(cfg["prompt_lens"])) and np.all(out <= np.array(model.budget_end))


# --------------------------------------------------------------------------- 2. error paths
@IMPLS
@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        ((0, [], [3], [4]), {}, "num_levels"),
        ((3, [2], [3], [4]), {}, "block_sizes"),
        ((1, [2], [3], [4]), {}, "block_sizes"),
        ((2, [0], [3], [4]), {}, "block size"),
        ((3, [2, -1], [3], [4]), {}, "block size"),
        ((2, [2], [], []), {}, "at least one row"),
        ((2, [2], [], 4), {}, "at least one row"),
        ((2, [2], [0, 3], [4, 4]), {}, "prompt"),
        ((2, [2], [3], [-1]), {}, "max_new_tokens"),
        ((2, [2], [3, 3], -1), {}, "max_new_tokens"),
        ((2, [2], [3, 3], [4]), {}, "max_new_tokens has"),
        ((2, [2], [3], [4, 4]), {}, "max_new_tokens has"),
        ((2, [2], [3], [4]), {"policy": "fastest"}, "policy"),
        # Several problems: the first check in the model's order wins.
        ((0, [0, 0], [], [-1]), {"policy": "x"}, "num_levels"),
        ((2, [0], [], [-1]), {"policy": "x"}, "block size"),
        ((2, [1], [], [-1, 3]), {"policy": "x"}, "at least one row"),
        ((2, [1], [0], [-1, 3]), {"policy": "x"}, "max_new_tokens has"),
        ((2, [1], [0], [-1]), {"policy": "x"}, "prompt"),
        ((2, [1], [1], [-1]), {"policy": "x"}, "max_new_tokens"),
    ],
)
def test_constructor_rejects(impl, args, kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        impl(*args, **kwargs)


def three_rows(impl):
    """num_levels 3, T = [2, 2]: row 0 wants level 1 (two drafts), row 1 wants 0, row 2 is
    finished (max_new_tokens 0)."""
    ledger = impl(3, [2, 2], [3, 3, 3], [4, 4, 0])
    ledger.commit_draft([0], [0])
    ledger.commit_draft([0], [0])
    assert ledger.wanted_levels().tolist() == [1, 0, -1]
    return ledger


@IMPLS
@pytest.mark.parametrize(
    ("method", "args", "match"),
    [
        ("rows_for", (-1,), "level"),
        ("rows_for", (3,), "level"),
        ("spans", (3, [0]), "level"),
        ("spans", (-1, []), "level"),
        ("spans", (1, [5]), "row 5"),
        ("spans", (1, [-1]), "row -1"),
        ("spans", (0, [1, 1]), "duplicate"),
        ("spans", (0, [7, 7]), "duplicate"),  # duplicates are checked before the range
        ("spans", (0, [0]), "row 0 wants level 1"),
        ("spans", (0, [1, 0]), "row 0 wants level 1"),
        ("spans", (0, [2]), "row 2.*finished"),
        ("spans", (2, [0]), "row 0 wants level 1"),
        ("commit_draft", ([0], [0]), "row 0 wants level 1"),
        ("commit_draft", ([2], [0]), "row 2.*finished"),
        ("commit_draft", ([3], [0]), "row 3"),
        ("commit_draft", ([1, 1], [0, 0]), "duplicate"),
        ("commit_draft", ([1], []), "is_eos"),
        ("commit_draft", ([1], [0, 0]), "is_eos"),
        ("commit_proposal", ([0], [0], [0]), "row 0 wants level 1"),
        ("commit_proposal", ([1], [3], [0]), r"count 3 outside \[0, 2\]"),
        ("commit_proposal", ([1], [-1], [0]), "count -1"),
        ("commit_proposal", ([1], [0], [1]), "last_is_eos set for an empty proposal"),
        ("commit_proposal", ([1], [], [0]), "counts"),
        ("commit_proposal", ([1], [1], []), "last_is_eos"),
        ("commit_verify", (0, [1], [0], [0]), "level"),
        ("commit_verify", (-1, [0], [0], [0]), "level"),
        ("commit_verify", (3, [0], [0], [0]), "level"),
        ("commit_verify", (1, [1], [0], [0]), "row 1 wants level 0"),
        ("commit_verify", (1, [2], [0], [0]), "row 2.*finished"),
        ("commit_verify", (1, [0, 0], [0, 0], [0, 0]), "duplicate"),
        ("commit_verify", (1, [0], [0, 1], [0]), "num_accepted"),
        ("commit_verify", (1, [0], [], [0]), "num_accepted"),
        ("commit_verify", (1, [0], [0], []), "extra_is_eos"),
        ("commit_verify", (1, [0], [0], [0, 1]), "extra_is_eos"),
        ("commit_verify", (1, [0], [3], [0]), "num_accepted 3"),
        ("commit_verify", (1, [0], [-1], [0]), "num_accepted -1"),
        ("commit_verify", (1, [0], [3], []), "extra_is_eos"),  # lengths before values
        ("hold", ([0],), "row 0 is not at a round boundary: it holds 2 speculative tokens"),
        ("hold", ([1, 0],), "row 0 is not at a round boundary"),  # row 1 is not held either
        ("hold", ([1, 1],), "duplicate"),
        ("hold", ([7, 7],), "duplicate"),
        ("hold", ([1, 3],), "row 3"),
        ("hold", ([-1],), "row -1"),
        ("reconfigure", ([2], [0] * 6), "row 0 is neither finished nor held"),
        ("reconfigure", ([0], [0]), "row 0 is neither finished nor held"),  # the rows first
        *[(name, (3,), "row 3") for name in (*ROW_QUERIES, "finished", "held", "tags")],
        *[(name, (-1,), "row -1") for name in (*ROW_QUERIES, "finished", "held", "tags")],
        ("pending", (3, 0), "row 3"),
        ("pending", (0, 3), "level 3"),
        ("pending", (0, -1), "level -1"),
        ("pending", (-1, -1), "row -1"),
    ],
)
def test_method_rejects(impl, method, args, match) -> None:
    ledger = three_rows(impl)
    before = snapshot_of(ledger)
    with pytest.raises(ValueError, match=match):
        getattr(ledger, method)(*args)
    after = snapshot_of(ledger)
    for name in BULK_VIEWS:  # a rejected call changes nothing
        np.testing.assert_array_equal(after[name], before[name], err_msg=name)


def snapshot_of(ledger) -> dict[str, np.ndarray]:
    return {name: getattr(ledger, name)() for name in BULK_VIEWS}


def at_rest(impl):
    """num_levels 3, T = [2, 2]: row 0 ran a round (committed 7, cached [4, 5, 6]) and is held, row 1
    is held at its prompt (committed 3), row 2 is finished (max_new_tokens 0) and not held."""
    ledger = impl(3, [2, 2], [3, 3, 3], [10, 10, 0])
    ledger.commit_draft([0], [0])
    ledger.commit_draft([0], [0])
    ledger.commit_verify(1, [0], [2], [0])
    ledger.commit_verify(2, [0], [3], [0])
    assert ledger.frontiers().tolist() == [[7, 7, 7], [3, 3, 3], [3, 3, 3]]
    ledger.hold([0, 1])
    assert ledger.holds().tolist() == [1, 1, 0] and ledger.next_level() == -1
    assert not ledger.all_finished() and ledger.finished(2)
    return ledger


@IMPLS
@pytest.mark.parametrize(
    ("args", "match"),
    [
        (([0], [0] * 6), "block size"),
        (([2, -1], [0] * 9), "block size"),
        (([0], [0] * 5), "block size"),  # block sizes before the length of cached
        (([2], [0] * 5), r"cached has 5 entries for 3 rows x 2 levels"),
        (([2], [0] * 7), r"cached has 7 entries"),
        (([], [0] * 6), r"cached has 6 entries for 3 rows x 1 levels"),
        (([2], [9] * 5), r"cached has 5 entries"),  # the length before the values
        (([2], [0, 0, 0, 0, -1, 0]), r"row 2, level 0: cached -1 outside \[0, 3\]"),
        (([2], [7, 0, 0, 0, 0, 0]), r"row 0, level 0: cached 7 outside \[0, 6\] \(held"),
        (([2], [0, 7, 0, 0, 0, 0]), r"row 0, level 1: cached 7 outside \[0, 6\]"),  # the target too
        (([2], [6, 6, 3, 0, 0, 0]), r"row 1, level 0: cached 3 outside \[0, 2\]"),
        (([2], [6, 6, 0, 0, 0, 4]), r"row 2, level 1: cached 4 outside \[0, 3\] \(finished"),
        (([], [7, 0, 0]), r"row 0, level 0: cached 7 outside \[0, 6\]"),  # the target alone too
        (([2], [0, 0, 9, 9, 9, 9]), r"row 1, level 0"),  # rows in order
    ],
)
def test_reconfigure_rejects(impl, args, match) -> None:
    ledger = at_rest(impl)
    before = snapshot_of(ledger)
    with pytest.raises(ValueError, match=match):
        ledger.reconfigure(*args)
    assert (ledger.num_levels, ledger.block_sizes) == (3, [2, 2])  # a rejected call changes nothing
    assert ledger.cached_lens().tolist() == [[4, 5, 6], [0, 0, 0], [0, 0, 0]]
    after = snapshot_of(ledger)
    for name in BULK_VIEWS:
        np.testing.assert_array_equal(after[name], before[name], err_msg=name)


@IMPLS
def test_reconfigure_keeps_the_rows(impl) -> None:
    """The bounds are inclusive: a held row's caches up to committed_len - 1, a finished row's up to
    committed_len; committed tokens, EOS, budgets and finished rows are kept, holds released."""
    ledger = at_rest(impl)
    ledger.reconfigure(np.array([3], np.int32), (6, 6, 2, 2, 3, 3))
    assert (ledger.num_levels, ledger.block_sizes) == (2, [3])
    assert ledger.frontiers().tolist() == [[7, 7], [3, 3], [3, 3]]
    assert ledger.cached_lens().tolist() == [[6, 6], [2, 2], [3, 3]]
    assert ledger.holds().tolist() == [0, 0, 0] and ledger.wanted_levels().tolist() == [0, 0, -1]
    assert ledger.output_lens().tolist() == [7, 3, 3] and ledger.finished(2)
    assert [a.tolist() for a in ledger.spans(0, [0, 1])] == [[6, 2], [7, 3], [6, 2]]
    ledger.hold([2])  # a finished row may be held; reconfigure needs no hold on it
    with pytest.raises(ValueError, match="row 0 is neither finished nor held"):
        ledger.reconfigure([], [0, 0, 0])


@IMPLS
def test_hold_is_idempotent_and_released_only_by_reconfigure(impl) -> None:
    ledger = impl(2, [2], [3, 4], [5, 5])
    ledger.hold([1])
    ledger.hold(np.array([1, 0]))  # row 1 again
    assert ledger.holds().tolist() == [1, 1] and ledger.held(0) and ledger.held(1)
    assert ledger.wanted_levels().tolist() == [-1, -1] and ledger.next_level() == -1
    assert ledger.rows_for(0).tolist() == [] and not ledger.all_finished()
    ledger.hold([])
    ledger.reconfigure([2], [0, 0, 0, 0])
    assert ledger.holds().tolist() == [0, 0] and ledger.next_level() == 0


@IMPLS
@pytest.mark.parametrize(
    ("call", "errors"),
    [
        (lambda led: led.spans(0, [[1]]), ValueError),  # 2-D
        (lambda led: led.spans(0, np.zeros((1, 1), np.int64)), ValueError),
        (lambda led: led.spans(0, 1), ValueError),  # a scalar, not a sequence
        (lambda led: led.spans(0, [0.5]), TypeError),
        (lambda led: led.spans(0, np.array([1.0])), TypeError),
        (lambda led: led.spans(0, [1, None]), TypeError),
        (lambda led: led.spans(0, ["1"]), TypeError),
        (lambda led: led.spans(0, [[1], [1, 2]]), (TypeError, ValueError)),  # ragged
        (lambda led: led.commit_draft([1], [0.0]), TypeError),
        (lambda led: led.commit_verify(1, [0], [[2]], [0]), ValueError),
        (lambda led: led.seq_len(0.0), TypeError),
        (lambda led: led.rows_for(1.0), TypeError),
        (lambda led: led.rows_for("1"), TypeError),
        (lambda led: led.hold([0.5]), TypeError),
        (lambda led: led.hold(1), ValueError),
        (lambda led: led.hold([[1]]), ValueError),
        (lambda led: led.held(1.0), TypeError),
        # Both sequences are converted before any check (the rows are not at rest here).
        (lambda led: led.reconfigure([2.0], [0] * 6), TypeError),
        (lambda led: led.reconfigure([2], [[0, 0]] * 3), ValueError),
        (lambda led: led.reconfigure([2], np.zeros(6)), TypeError),
    ],
)
def test_bad_argument_types(impl, call, errors) -> None:
    ledger = three_rows(impl)
    with pytest.raises(errors):
        call(ledger)


@IMPLS
@pytest.mark.parametrize(
    "args",
    [
        (2.0, [2], [3], [4]),
        (2, [2.0], [3], [4]),
        (2, [[2]], [3], [4]),
        (2, [2], [3.5], [4]),
        (2, [2], [3], [4.0]),
        (2, [2], [3], 4.0),
        (2, [2], [3], [[4]]),
    ],
)
def test_constructor_bad_argument_types(impl, args) -> None:
    with pytest.raises((TypeError, ValueError)):
        impl(*args)


@IMPLS
def test_properties_are_read_only(impl) -> None:
    ledger = impl(3, [2, 3], [1, 2], 5, policy="highest_level")
    assert (ledger.num_levels, ledger.num_rows) == (3, 2)
    assert ledger.block_sizes == [2, 3] and ledger.policy == "highest_level"
    ledger.block_sizes.append(9)  # a copy
    assert ledger.block_sizes == [2, 3]
    for name in PROPERTIES:
        with pytest.raises(AttributeError):
            setattr(ledger, name, 1)


def test_same_interface() -> None:
    """Every documented name on both; keyword names identical (called by keyword on both)."""
    for name in (*METHODS, *PROPERTIES):
        assert hasattr(LedgerModel, name) and hasattr(Ledger, name), name
    for impl in (LedgerModel, Ledger):
        led = impl(num_levels=2, block_sizes=[1], prompt_lens=[2, 2], max_new_tokens=[3, 3])
        assert led.pending(row=0, level=0) == 0 and led.wanted_level(row=1) == 0
        for name in ROW_QUERIES:
            getattr(led, name)(row=0)
        led.tags(row=0), led.finished(row=0)
        rows = led.rows_for(level=0)
        led.spans(level=0, rows=rows)
        led.commit_draft(rows=rows, is_eos=[0, 1])
        led.commit_verify(level=1, rows=[0, 1], num_accepted=[0, 1], extra_is_eos=[0, 0])
        assert led.frontiers().tolist() == [[3, 3], [3, 3]]  # no bonus after row 1's EOS
        led.hold(rows=[0, 1])
        assert led.held(row=0) and led.holds().tolist() == [1, 1]
        led.reconfigure(block_sizes=[], cached=[2, 2])
        assert led.num_levels == 1 and led.frontiers().tolist() == [[3], [3]]


@IMPLS
@pytest.mark.parametrize(
    "convert",
    [
        list,
        tuple,
        lambda v: np.asarray(v, np.int64),
        lambda v: np.asarray(v, np.int32),
        lambda v: np.asarray(v, np.uint8),
        lambda v: np.repeat(np.asarray(v, np.int64), 2)[::2],  # non-contiguous
    ],
    ids=["list", "tuple", "int64", "int32", "uint8", "strided"],
)
def test_sequence_arguments(impl, convert) -> None:
    """Lists, tuples and 1-D integer arrays of any integer dtype all work, and mean the same."""
    led = impl(3, convert([2, 2]), convert([3, 1]), convert([4, 4]))
    rows = convert([1, 0])
    starts, ends, outs = led.spans(0, rows)
    assert (starts.tolist(), ends.tolist(), outs.tolist()) == ([0, 0], [1, 3], [0, 2])
    led.commit_draft(rows, np.array([False, False]))  # bool flags
    led.commit_draft(convert([0, 1]), convert([0, 1]))  # row 1 drafts EOS at position 2
    kept, cascaded = led.commit_verify(1, rows, convert([2, 1]), convert([0, 0]))
    assert (kept.tolist(), cascaded.tolist()) == ([0, 1], [0, 0])  # no bonus after the EOS
    assert led.frontiers().tolist() == [[5, 5, 3], [3, 3, 1]]
    assert led.eos_positions().tolist() == [-1, 2]
    assert all(len(a) == 0 for a in led.spans(0, convert([])))


@IMPLS
@pytest.mark.parametrize("budget", [4, np.int64(4), [4, 4], (4, 4), np.array([4, 4])])
def test_max_new_tokens_int_or_per_row(impl, budget) -> None:
    led = impl(2, [1], [3, 5], budget)
    assert led.wanted_levels().tolist() == [0, 0]
    steps = 0
    while (level := led.next_level()) >= 0 and steps < 100:
        steps += 1
        rows = led.rows_for(level)
        if level == 0:
            led.commit_draft(rows, np.zeros(len(rows), np.int64))
        else:
            _, ends, outs = led.spans(level, rows)
            led.commit_verify(level, rows, ends - outs - 1, np.zeros(len(rows), np.int64))
    assert led.all_finished() and led.output_lens().tolist() == [7, 9]


# ------------------------------------------------------------------------------ 3. scenarios
@IMPLS
def test_reject_then_rollback_cascades_to_every_level(impl) -> None:
    led = impl(3, [2, 2], [3], [10])  # K = 2
    led.commit_draft([0], [0])
    led.commit_draft([0], [0])
    assert led.frontiers().tolist() == [[5, 3, 3]] and led.cached_lens().tolist() == [[4, 0, 0]]
    assert led.wanted_level(0) == 1 and led.pending(0, 0) == 2
    assert [a.tolist() for a in led.spans(1, [0])] == [[0], [5], [2]]
    # Level 1 accepts the first draft, rejects the second (position 4): level 0 never fed it.
    kept, cascaded = led.commit_verify(1, [0], [1], [0])
    assert (kept.tolist(), cascaded.tolist()) == ([1], [0])
    assert led.frontiers().tolist() == [[5, 5, 3]] and led.cached_lens().tolist() == [[4, 4, 0]]
    assert led.tags(0).tolist() == [2, 2, 2, 1, 1] and led.last_tag(0) == 1
    assert led.wanted_level(0) == 2 and led.pending(0, 1) == 2
    assert [a.tolist() for a in led.spans(2, [0])] == [[0], [5], [2]]
    # The target rejects position 3: levels 0 and 1 both cached it and lose it.
    kept, cascaded = led.commit_verify(2, [0], [0], [0])
    assert (kept.tolist(), cascaded.tolist()) == ([1], [2])
    assert led.frontiers().tolist() == [[4, 4, 4]] and led.cached_lens().tolist() == [[3, 3, 3]]
    assert led.committed_len(0) == 4 and led.tags(0).tolist() == [2, 2, 2, 2]
    assert led.wanted_level(0) == 0
    assert [a.tolist() for a in led.spans(0, [0])] == [[3], [4], [3]]


@IMPLS
def test_reject_first_draft_cuts_level_zero(impl) -> None:
    led = impl(3, [2, 2], [3], [10])
    led.commit_draft([0], [0])
    led.commit_draft([0], [0])
    kept, cascaded = led.commit_verify(1, [0], [0], [0])
    assert (kept.tolist(), cascaded.tolist()) == ([1], [1])
    assert led.frontiers().tolist() == [[4, 4, 3]] and led.cached_lens().tolist() == [[3, 3, 0]]
    assert led.wanted_level(0) == 0  # one token tagged 1 < T_1 = 2


@IMPLS
def test_all_accepted_earns_a_bonus(impl) -> None:
    led = impl(3, [2, 2], [3], [10])
    led.commit_draft([0], [0])
    led.commit_draft([0], [0])
    kept, cascaded = led.commit_verify(1, [0], [2], [0])
    assert (kept.tolist(), cascaded.tolist()) == ([1], [0])
    assert led.frontiers().tolist() == [[6, 6, 3]] and led.cached_lens().tolist() == [[4, 5, 0]]
    assert led.pending(0, 1) == 3 and led.wanted_level(0) == 2
    assert [a.tolist() for a in led.spans(2, [0])] == [[0], [6], [2]]
    kept, cascaded = led.commit_verify(2, [0], [3], [0])
    assert (kept.tolist(), cascaded.tolist()) == ([1], [0])
    assert led.frontiers().tolist() == [[7, 7, 7]] and led.cached_lens().tolist() == [[4, 5, 6]]
    assert led.committed_len(0) == 7 and not led.finished(0)
    assert [a.tolist() for a in led.spans(0, [0])] == [[4], [7], [6]]  # catch-up: 4, 5, 6


@IMPLS
def test_bonus_dropped_at_the_budget(impl) -> None:
    led = impl(3, [2, 2], [3], 2)
    led.commit_draft([0], [0])
    led.commit_draft([0], [0])
    assert led.seq_len(0) == 5 and led.wanted_level(0) == 1
    kept, cascaded = led.commit_verify(1, [0], [2], [1])  # the dropped bonus's EOS flag is moot
    assert (kept.tolist(), cascaded.tolist()) == ([0], [0])
    assert led.frontiers().tolist() == [[5, 5, 3]] and led.eos_positions().tolist() == [-1]
    assert led.wanted_level(0) == 2
    kept, _ = led.commit_verify(2, [0], [2], [0])
    assert kept.tolist() == [0] and led.frontiers().tolist() == [[5, 5, 5]]
    assert led.finished(0) and led.all_finished() and led.output_len(0) == 5
    assert led.wanted_level(0) == -1 and led.next_level() == -1
    assert led.rows_for(0).tolist() == led.rows_for(2).tolist() == []


@IMPLS
def test_full_budget_flushes_a_partial_batch(impl) -> None:
    led = impl(3, [3, 3], [3], [2])
    led.commit_draft([0], [0])
    led.commit_draft([0], [0])
    assert led.pending(0, 0) == 2 and led.wanted_level(0) == 1  # 2 < T_0 = 3, but flushed
    kept, _ = led.commit_verify(1, [0], [2], [0])
    assert kept.tolist() == [0] and led.wanted_level(0) == 2
    kept, cascaded = led.commit_verify(2, [0], [1], [0])  # reject position 4: the correction fits
    assert (kept.tolist(), cascaded.tolist()) == ([1], [1])
    assert led.frontiers().tolist() == [[5, 5, 5]] and led.cached_lens().tolist() == [[4, 4, 4]]
    assert led.finished(0) and led.output_len(0) == 5


@IMPLS
def test_drafted_eos_flushes_upward(impl) -> None:
    led = impl(3, [4, 4], [2], [10])
    led.commit_draft([0], [0])
    led.commit_draft([0], [1])
    assert led.eos_positions().tolist() == [3] and led.pending(0, 0) == 2
    assert led.wanted_level(0) == 1  # 2 < T_0 = 4: the EOS forces the flush
    kept, _ = led.commit_verify(1, [0], [2], [0])
    assert kept.tolist() == [0]  # no bonus after an accepted EOS
    assert led.frontiers().tolist() == [[4, 4, 2]] and led.wanted_level(0) == 2
    kept, _ = led.commit_verify(2, [0], [2], [0])
    assert kept.tolist() == [0] and led.frontiers().tolist() == [[4, 4, 4]]
    assert led.finished(0) and led.output_len(0) == 4 and led.eos_positions().tolist() == [3]


@IMPLS
def test_rejected_eos_resumes_drafting(impl) -> None:
    led = impl(3, [4, 4], [2], [10])
    led.commit_draft([0], [0])
    led.commit_draft([0], [1])
    kept, cascaded = led.commit_verify(1, [0], [1], [0])  # the EOS at 3 is rejected
    assert (kept.tolist(), cascaded.tolist()) == ([1], [0])
    assert led.eos_positions().tolist() == [-1] and led.frontiers().tolist() == [[4, 4, 2]]
    assert led.wanted_level(0) == 0


@IMPLS
def test_eos_as_correction_and_as_bonus(impl) -> None:
    led = impl(3, [2, 4], [2], [10])
    led.commit_draft([0], [0])
    led.commit_draft([0], [0])
    kept, cascaded = led.commit_verify(1, [0], [0], [1])  # the correction at 2 is EOS
    assert (kept.tolist(), cascaded.tolist()) == ([1], [1])
    assert led.eos_positions().tolist() == [2] and led.frontiers().tolist() == [[3, 3, 2]]
    assert led.wanted_level(0) == 2 and led.last_tag(0) == 1
    kept, _ = led.commit_verify(2, [0], [1], [0])
    assert kept.tolist() == [0] and led.finished(0) and led.output_len(0) == 3

    led = impl(2, [1], [2], [10])  # K = 1: the bonus of the target is committed
    led.commit_draft([0], [0])
    kept, _ = led.commit_verify(1, [0], [1], [1])
    assert kept.tolist() == [1] and led.eos_positions().tolist() == [3]
    assert led.finished(0) and led.output_len(0) == 4 and led.committed_len(0) == 4


@IMPLS
def test_a_proposal_closes_level_zeros_block(impl) -> None:
    """A model-free level 0 proposes 0..T_0 tokens at once; level 1 then verifies what is pending,
    and with nothing pending its forward is an ordinary decoding step whose bonus it keeps."""
    led = impl(3, [4, 2], [3, 3], [10, 10])
    led.commit_proposal([0, 1], [0, 2], [0, 0])
    assert led.wanted_levels().tolist() == [1, 1] and led.frontiers().tolist() == [[3, 3, 3], [5, 3, 3]]
    assert [a.tolist() for a in led.spans(1, [0, 1])] == [[0, 0], [3, 5], [2, 2]]
    kept, cascaded = led.commit_verify(1, [0, 1], [0, 1], [0, 0])  # row 1 rejects at 4
    assert (kept.tolist(), cascaded.tolist()) == ([1, 1], [0, 0])
    assert led.frontiers().tolist() == [[4, 4, 3], [5, 5, 3]]
    assert led.wanted_levels().tolist() == [0, 2]  # the block is open again; row 1's level 1 is full
    led.commit_proposal([0], [3], [1])  # ends in an EOS: flushed upward
    assert led.eos_positions().tolist() == [6, -1] and led.cached_lens()[0, 0] == 6
    assert led.wanted_level(0) == 1
    with pytest.raises(ValueError, match="needs a level above level 0"):
        impl(1, [], [3], 4).commit_proposal([0], [0], [0])


@IMPLS
def test_target_alone_decodes_autoregressively(impl) -> None:
    led = impl(1, [], [2], 3)
    assert [a.tolist() for a in led.spans(0, [0])] == [[0], [2], [1]]
    led.commit_draft([0], [0])
    assert led.committed_len(0) == 3 and led.cached_lens().tolist() == [[2]]
    led.commit_draft([0], [1])
    assert led.finished(0) and led.output_len(0) == 4 and led.next_level() == -1


@IMPLS
def test_zero_budget_is_finished_at_once(impl) -> None:
    led = impl(2, [3], [4, 2], 0)
    assert led.all_finished() and led.next_level() == -1
    assert led.wanted_levels().tolist() == [-1, -1] and led.output_lens().tolist() == [4, 2]
    assert led.tags(1).tolist() == [1, 1]


@IMPLS
def test_policies(impl) -> None:
    for policy, expected in (("most_rows", 0), ("highest_level", 1)):
        led = impl(2, [1], [1, 1, 1], 5, policy=policy)
        led.commit_draft([0], [0])
        assert led.wanted_levels().tolist() == [1, 0, 0]
        assert led.next_level() == expected
    led = impl(2, [1], [1, 1], 5)  # a tie goes to the higher level
    led.commit_draft([0], [0])
    assert led.wanted_levels().tolist() == [1, 0] and led.next_level() == 1


@IMPLS
def test_hold_and_reconfigure(impl) -> None:
    """Two rows: one waits at its round boundary while the other finishes its round; then the
    hierarchy switches from 3 levels to 2, to the target alone, to 4, and the run ends."""
    led = impl(3, [2, 2], [3, 3], [20, 20])
    led.commit_draft([0, 1], [0, 0])
    led.commit_draft([0, 1], [0, 0])
    led.commit_verify(1, [0, 1], [2, 2], [0, 0])
    assert led.frontiers().tolist() == [[6, 6, 3], [6, 6, 3]] and led.wanted_levels().tolist() == [2, 2]
    with pytest.raises(ValueError, match="row 1 is not at a round boundary: it holds 3 speculative"):
        led.hold([1])
    led.commit_verify(2, [0], [3], [0])  # row 0 ends its round: all accepted, a bonus
    assert led.frontiers()[0].tolist() == [7, 7, 7] and led.wanted_levels().tolist() == [0, 2]
    led.hold([0])
    assert led.held(0) and not led.held(1) and led.holds().tolist() == [1, 0]
    assert led.wanted_levels().tolist() == [-1, 2] and led.next_level() == 2
    assert led.rows_for(0).tolist() == [] and led.rows_for(2).tolist() == [1]
    with pytest.raises(ValueError, match="row 0 is held: it wants no level, not level 0"):
        led.spans(0, [0])
    with pytest.raises(ValueError, match="row 1 is neither finished nor held"):
        led.reconfigure([3], [0, 6, 0, 4])
    kept, cascaded = led.commit_verify(2, [1], [1], [0])  # row 1 runs on: rejects position 4
    assert (kept.tolist(), cascaded.tolist()) == ([1], [1])
    assert led.frontiers()[1].tolist() == [5, 5, 5] and led.cached_lens()[1].tolist() == [4, 4, 4]
    assert led.frontiers()[0].tolist() == [7, 7, 7] and led.held(0)  # untouched
    led.hold([1])
    assert led.next_level() == -1 and not led.all_finished()

    # 2 levels: a new draft model (nothing cached) under the same target (its cache kept).
    led.reconfigure([3], [0, 6, 0, 4])
    assert (led.num_levels, led.block_sizes) == (2, [3])
    assert led.frontiers().tolist() == [[7, 7], [5, 5]] and led.cached_lens().tolist() == [[0, 6], [0, 4]]
    assert led.holds().tolist() == [0, 0] and led.wanted_levels().tolist() == [0, 0]
    assert [a.tolist() for a in led.spans(0, [0, 1])] == [[0, 0], [7, 5], [6, 4]]
    for _ in range(3):
        led.commit_draft([0, 1], [0, 0])
    assert led.wanted_levels().tolist() == [1, 1]
    assert [a.tolist() for a in led.spans(1, [0, 1])] == [[6, 4], [10, 8], [6, 4]]
    led.commit_verify(1, [0, 1], [3, 3], [0, 0])
    assert led.frontiers().tolist() == [[11, 11], [9, 9]]
    led.hold([0, 1])

    # The target alone: level 0 is the target, its cache kept; every step commits a token.
    led.reconfigure([], [10, 8])
    assert led.num_levels == 1 and led.frontiers().tolist() == [[11], [9]]
    assert [a.tolist() for a in led.spans(0, [0, 1])] == [[10, 8], [11, 9], [10, 8]]
    led.commit_draft([0, 1], [0, 0])
    led.commit_draft([0], [1])  # row 0 draws EOS: committed at once, the row is finished
    assert led.finished(0) and led.output_len(0) == 13 and led.committed_len(1) == 10
    led.hold([0, 1])  # a finished row may be held too

    # 4 levels; the finished row may cache its whole committed length.
    led.reconfigure([1, 2, 1], [0, 0, 0, 13, 0, 0, 0, 9])
    assert led.num_levels == 4 and led.frontiers().tolist() == [[13] * 4, [10] * 4]
    assert led.wanted_levels().tolist() == [-1, 0] and led.finished(0) and not led.held(0)
    assert led.eos_positions().tolist() == [12, -1] and led.output_len(0) == 13
    run_accepting_everything(led)
    assert led.all_finished() and led.output_lens().tolist() == [13, 23]


def run_accepting_everything(led, max_steps: int | None = None) -> None:
    """Run ``led`` until no row wants a level (or ``max_steps`` steps): drafts without EOS, every
    verification accepting its whole block."""
    steps = 0
    while (level := led.next_level()) >= 0 and (max_steps is None or steps < max_steps):
        rows = led.rows_for(level)
        _, ends, outs = led.spans(level, rows)
        zeros = np.zeros(len(rows), np.int64)
        if level == 0:
            led.commit_draft(rows, zeros)
        else:
            led.commit_verify(level, rows, ends - outs - 1, zeros)
        steps += 1


def test_extension_handles_large_batches() -> None:
    """The engine's statistical tests run ~50,000 rows per step. The work is bounded, not timed:
    every step serves all the rows that want its level (the batch moves in lockstep, so the step
    count does not grow with the rows), and no row runs more operations than the bound of max_ops."""
    num_rows, block_sizes = 50_000, [3, 2]
    rng = np.random.default_rng(0)
    prompts = rng.integers(1, 8, num_rows)
    led = Ledger(3, block_sizes, prompts, 16)
    ops, steps = np.zeros(num_rows, np.int64), 0
    while (level := led.next_level()) >= 0:
        rows = led.rows_for(level)
        assert np.array_equal(rows, np.flatnonzero(led.wanted_levels() == level)), "rows left behind"
        _, ends, outs = led.spans(level, rows)
        eos = rng.random(len(rows)) < 0.02
        if level == 0:
            led.commit_draft(rows, eos)
        else:
            blocks = ends - outs - 1
            led.commit_verify(level, rows, rng.integers(0, blocks + 1), eos)
        ops[rows] += 1
        steps += 1
        assert steps < 1_000, "no end in sight"  # about 100 steps for this seed
    out = led.output_lens()
    assert led.all_finished() and np.all((prompts <= out) & (out <= prompts + 16))
    progress = led.frontiers()[:, -1] - prompts  # committed tokens per row
    bound = (progress + 1) * math.prod(t + 1 for t in block_sizes) - 1  # max_ops, per row
    assert np.all(ops >= 1) and np.all(ops <= bound), "a row ran more operations than its bound"


@IMPLS
def test_huge_budget_does_not_overflow(impl) -> None:
    """prompt + max_new_tokens beyond int64: the extension saturates instead of overflowing."""
    led = impl(2, [2], [5, 1], 2**63 - 1)
    assert led.wanted_levels().tolist() == [0, 0] and not led.all_finished()
    led.commit_draft([0, 1], [0, 0])
    led.commit_draft([0, 1], [0, 0])
    kept, _ = led.commit_verify(1, [0, 1], [2, 0], [0, 0])
    assert kept.tolist() == [1, 1] and led.frontiers().tolist() == [[8, 8], [2, 2]]


def test_long_budget_is_exact() -> None:
    """A budget of thousands of tokens ends exactly there (the extension only: the model is slow)."""
    led = Ledger(2, [4], [3, 1], [3000, 2999])
    run_accepting_everything(led, max_steps=2 * 3000)  # a draft or a verify per step: ~1.25 per token
    assert led.all_finished() and led.output_lens().tolist() == [3003, 3000]
