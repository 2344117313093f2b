"""A plain-Python model of the C++ ledger (`hsd_fast._C.Ledger`): the specification it is tested
against.

Per row and level it keeps integers only (docs/design.md, "The ledger"). Levels are 0..K, K the target.
Tags never increase along a row, so they are stored as *frontiers*: ``frontier[l]`` = number of tokens
(prompt included) whose tag is >= l. Hence ``frontier[0] == seq_len`` and ``frontier[K] == committed
length``; ``pending(l) = frontier[l] - frontier[l + 1]``. The prompt is tagged K. ``cached[l]`` is how
many leading positions level l's KV cache holds validly.

Written for clarity, not speed: every method loops over rows. The property tests drive random
operation sequences through this model and the extension and compare every observable.

Arguments are converted as the extension converts them: integers via ``operator.index``; sequences
(list, tuple, 1-D numpy integer or bool array) via ``numpy.asarray``: not 1-D -> ValueError, not
integer -> TypeError. Every sequence argument is converted before any value is checked.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence

import numpy as np

POLICIES = ("most_rows", "highest_level")


def _as_ints(name: str, values: Sequence[int]) -> list[int]:
    """A 1-D integer sequence as a list of Python ints (as the extension reads it: int64)."""
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D sequence, got shape {arr.shape}")
    if arr.size and arr.dtype.kind not in "iub":
        raise TypeError(f"{name} must hold integers, got dtype {arr.dtype}")
    return arr.astype(np.int64).tolist()


class LedgerModel:
    def __init__(
        self,
        num_levels: int,
        block_sizes: Sequence[int],
        prompt_lens: Sequence[int],
        max_new_tokens: Sequence[int] | int,
        policy: str = "most_rows",
    ) -> None:
        num_levels = operator.index(num_levels)
        block_sizes = _as_ints("block_sizes", block_sizes)
        prompt_lens = _as_ints("prompt_lens", prompt_lens)
        budget = np.asarray(max_new_tokens)
        if budget.ndim == 0:  # one int: the same budget for every row
            max_new_tokens = [operator.index(budget.item())] * len(prompt_lens)
        else:
            max_new_tokens = _as_ints("max_new_tokens", budget)
        if num_levels < 1:
            raise ValueError(f"num_levels must be >= 1, got {num_levels}")
        if len(block_sizes) != num_levels - 1:
            raise ValueError(
                f"block_sizes needs one entry per draft level ({num_levels - 1}), got {len(block_sizes)}"
            )
        if any(t < 1 for t in block_sizes):
            raise ValueError(f"every block size T must be >= 1, got {list(block_sizes)}")
        if len(prompt_lens) < 1:
            raise ValueError("the batch needs at least one row")
        if len(max_new_tokens) != len(prompt_lens):
            raise ValueError(f"max_new_tokens has {len(max_new_tokens)} entries for {len(prompt_lens)} rows")
        if any(p < 1 for p in prompt_lens):
            raise ValueError(f"every prompt needs at least one token, got {list(prompt_lens)}")
        if any(m < 0 for m in max_new_tokens):
            raise ValueError(f"max_new_tokens must be >= 0, got {list(max_new_tokens)}")
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; choose one of {POLICIES}")
        self._num_levels = num_levels
        self._num_rows = len(prompt_lens)
        self._block_sizes = list(block_sizes)
        self._policy = policy
        self.prompt_lens = list(prompt_lens)
        self.budget_end = [p + m for p, m in zip(prompt_lens, max_new_tokens, strict=True)]
        self.frontier = [[p] * num_levels for p in prompt_lens]
        self.cached = [[0] * num_levels for _ in prompt_lens]
        self.eos_pos = [-1] * self.num_rows
        self.closed = [False] * self.num_rows  # from commit_proposal until the next commit_verify
        self._held = [False] * self.num_rows  # from hold until the next reconfigure

    # ------------------------------------------------------------ read-only
    @property
    def num_levels(self) -> int:
        return self._num_levels

    @property
    def num_rows(self) -> int:
        return self._num_rows

    @property
    def block_sizes(self) -> list[int]:
        return list(self._block_sizes)

    @property
    def policy(self) -> str:
        return self._policy

    # ----------------------------------------------------------------- queries
    @property
    def top(self) -> int:
        return self.num_levels - 1

    def seq_len(self, row: int) -> int:
        row = self._check_row(row)
        return self.frontier[row][0]

    def committed_len(self, row: int) -> int:
        row = self._check_row(row)
        return self.frontier[row][self.top]

    def pending(self, row: int, level: int) -> int:
        row = self._check_row(row)
        level = self._check_level(level)
        f = self.frontier[row]
        return f[level] - f[level + 1] if level < self.top else 0

    def last_tag(self, row: int) -> int:
        row = self._check_row(row)
        f, n = self.frontier[row], self.frontier[row][0]
        return max(lvl for lvl in range(self.num_levels) if f[lvl] == n)

    def tags(self, row: int) -> np.ndarray:  # [seq_len]
        row = self._check_row(row)
        f = self.frontier[row]
        return np.array(
            [max(lvl for lvl in range(self.num_levels) if f[lvl] > pos) for pos in range(f[0])],
            dtype=np.int64,
        )

    def finished(self, row: int) -> bool:
        row = self._check_row(row)
        committed = self.committed_len(row)
        eos = self.eos_pos[row]
        return (0 <= eos < committed) or committed >= self.budget_end[row]

    def output_len(self, row: int) -> int:
        """Committed length, cut after a committed EOS."""
        row = self._check_row(row)
        committed, eos = self.committed_len(row), self.eos_pos[row]
        return eos + 1 if 0 <= eos < committed else committed

    def held(self, row: int) -> bool:
        row = self._check_row(row)
        return self._held[row]

    def wanted_level(self, row: int) -> int:
        row = self._check_row(row)
        if self.finished(row) or self._held[row]:
            return -1
        for level in range(self.top, 0, -1):
            if self.pending(row, level - 1) >= self.block_sizes[level - 1]:
                return level
        if self.eos_pos[row] >= 0 or self.seq_len(row) >= self.budget_end[row]:
            return self.last_tag(row) + 1  # flush upward
        if self.closed[row]:  # level 0 proposed all it had: level 1 verifies what is pending
            return 1
        return 0

    # Bulk views, as the extension returns them (numpy int64).
    def frontiers(self) -> np.ndarray:  # [B, L]
        return np.array(self.frontier, dtype=np.int64)

    def cached_lens(self) -> np.ndarray:  # [B, L]
        return np.array(self.cached, dtype=np.int64)

    def seq_lens(self) -> np.ndarray:  # [B]
        return np.array([self.seq_len(r) for r in range(self.num_rows)], dtype=np.int64)

    def output_lens(self) -> np.ndarray:  # [B]
        return np.array([self.output_len(r) for r in range(self.num_rows)], dtype=np.int64)

    def eos_positions(self) -> np.ndarray:  # [B], -1 where the row holds no EOS
        return np.array(self.eos_pos, dtype=np.int64)

    def holds(self) -> np.ndarray:  # [B], 1 where the row is held
        return np.array(self._held, dtype=np.int64)

    def all_finished(self) -> bool:
        return all(self.finished(r) for r in range(self.num_rows))

    def wanted_levels(self) -> np.ndarray:
        return np.array([self.wanted_level(r) for r in range(self.num_rows)], dtype=np.int64)

    def next_level(self) -> int:
        wanted = [w for w in self.wanted_levels().tolist() if w >= 0]
        if not wanted:
            return -1
        if self.policy == "highest_level":
            return max(wanted)
        return max(set(wanted), key=lambda lvl: (wanted.count(lvl), lvl))

    def rows_for(self, level: int) -> np.ndarray:
        level = self._check_level(level)
        return np.array([r for r in range(self.num_rows) if self.wanted_level(r) == level], dtype=np.int64)

    def spans(self, level: int, rows: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per row: feed_start, feed_end (the tokens level must feed) and out_start (first position
        whose logits are needed; logits at position t give the distribution of token t + 1)."""
        level = operator.index(level)
        rows = _as_ints("rows", rows)
        self._check_rows(level, rows)
        starts, ends, outs = [], [], []
        for r in rows:
            end = self.seq_len(r)
            out = end - 1 if level == 0 else self.frontier[r][level] - 1
            starts.append(self.cached[r][level])
            ends.append(end)
            outs.append(out)
        return (np.array(starts, np.int64), np.array(ends, np.int64), np.array(outs, np.int64))

    # ----------------------------------------------------------------- commits
    def commit_draft(self, rows: Sequence[int], is_eos: Sequence[int]) -> None:
        """Level 0 fed its span and drew one token (tag 0) at position seq_len."""
        rows = _as_ints("rows", rows)
        is_eos = _as_ints("is_eos", is_eos)
        self._check_rows(0, rows)
        self._check_same_length("is_eos", is_eos, rows)
        for r, eos in zip(rows, is_eos, strict=True):
            n = self.seq_len(r)
            self.cached[r][0] = n
            self.frontier[r][0] = n + 1
            if eos:
                self.eos_pos[r] = n

    def commit_proposal(self, rows: Sequence[int], counts: Sequence[int], last_is_eos: Sequence[int]) -> None:
        """Level 0 proposed ``counts[r]`` tokens at once (tag 0), the last an EOS where flagged, and
        closed its block: as that many ``commit_draft`` calls, after which the row wants level 1 even
        with fewer than T_0 (or no) tokens pending."""
        if self.num_levels < 2:
            raise ValueError("commit_proposal needs a level above level 0 to verify it")
        rows = _as_ints("rows", rows)
        counts = _as_ints("counts", counts)
        last_is_eos = _as_ints("last_is_eos", last_is_eos)
        self._check_rows(0, rows)
        self._check_same_length("counts", counts, rows)
        self._check_same_length("last_is_eos", last_is_eos, rows)
        for r, count, eos in zip(rows, counts, last_is_eos, strict=True):
            room = min(self.block_sizes[0] - self.pending(r, 0), self.budget_end[r] - self.seq_len(r))
            if not 0 <= count <= room:
                raise ValueError(
                    f"row {r}: count {count} outside [0, {room}] (room in its block and its length budget)"
                )
            if eos and count == 0:
                raise ValueError(f"row {r}: last_is_eos set for an empty proposal")
        for r, count, eos in zip(rows, counts, last_is_eos, strict=True):
            for k in range(count):
                self.commit_draft([r], [eos if k == count - 1 else 0])
            self.closed[r] = True

    def commit_verify(
        self,
        level: int,
        rows: Sequence[int],
        num_accepted: Sequence[int],
        extra_is_eos: Sequence[int],
    ) -> tuple[np.ndarray, np.ndarray]:
        """Level fed its span and verified the block [frontier[level], seq_len) of tag level-1.

        ``num_accepted[r]`` drafts passed; then a correction (on a rejection) or a bonus token
        follows. A bonus is dropped when the last accepted draft is EOS or the row's length budget
        is full. Returns per row: kept_extra (0/1) and how many levels below ``level`` lost cache
        entries.
        """
        level = operator.index(level)
        rows = _as_ints("rows", rows)
        num_accepted = _as_ints("num_accepted", num_accepted)
        extra_is_eos = _as_ints("extra_is_eos", extra_is_eos)
        if level < 1:
            raise ValueError(f"commit_verify needs a verifying level >= 1, got {level}")
        self._check_rows(level, rows)
        self._check_same_length("num_accepted", num_accepted, rows)
        self._check_same_length("extra_is_eos", extra_is_eos, rows)
        for r, a in zip(rows, num_accepted, strict=True):
            n = self.seq_len(r) - self.frontier[r][level]
            if not 0 <= a <= n:
                raise ValueError(f"row {r}: num_accepted {a} outside [0, {n}] (drafts in its block)")
        kept, cascaded = [], []
        for r, a, eos in zip(rows, num_accepted, extra_is_eos, strict=True):
            f, cached = self.frontier[r], self.cached[r]
            end = f[0]
            cached[level] = end
            cut = f[level] + a
            if cut < end:  # rejection at `cut`: the correction replaces that token
                cascaded.append(sum(1 for lvl in range(level) if cached[lvl] > cut))
                for lvl in range(self.num_levels):
                    cached[lvl] = min(cached[lvl], cut)
                if self.eos_pos[r] >= cut:
                    self.eos_pos[r] = -1
                new_len, keep = cut + 1, 1
            else:
                cascaded.append(0)
                keep = int(self.eos_pos[r] != end - 1 and end < self.budget_end[r])
                new_len = end + keep
            if keep and eos:
                self.eos_pos[r] = new_len - 1
            for lvl in range(level + 1):
                f[lvl] = new_len
            self.closed[r] = False  # level 0's block was verified (or cut away): it proposes anew
            kept.append(keep)
        return np.array(kept, np.int64), np.array(cascaded, np.int64)

    # ------------------------------------------------- holding, reconfiguring
    def hold(self, rows: Sequence[int]) -> None:
        """The rows wait at their round boundary (no speculative token, no closed block) or are
        finished: they want no level until the next ``reconfigure``. Holding twice is allowed."""
        rows = _as_ints("rows", rows)
        self._check_distinct(rows)
        for r in rows:
            self._check_row(r)
            if self.finished(r):
                continue
            speculative = self.seq_len(r) - self.committed_len(r)
            if speculative > 0:
                raise ValueError(
                    f"row {r} is not at a round boundary: it holds {speculative} speculative tokens"
                )
            if self.closed[r]:
                raise ValueError(f"row {r} is not at a round boundary: its proposal waits for level 1")
        for r in rows:
            self._held[r] = True

    def reconfigure(self, block_sizes: Sequence[int], cached: Sequence[int]) -> None:
        """Every row finished or held: ``len(block_sizes) + 1`` levels from now on. ``cached``
        ([num_rows * new num_levels], row-major) is what each new level's cache validly holds of the
        row's committed prefix: at most committed_len - 1 for a held row (each level feeds at least
        its last token, whose logits it needs), committed_len for a finished one. Every frontier
        becomes the committed length, no block is closed, every hold is released; EOS positions and
        length budgets are kept."""
        block_sizes = _as_ints("block_sizes", block_sizes)
        cached = _as_ints("cached", cached)
        for r in range(self.num_rows):
            if not self.finished(r) and not self._held[r]:
                raise ValueError(f"row {r} is neither finished nor held: reconfigure needs every row at rest")
        if any(t < 1 for t in block_sizes):
            raise ValueError(f"every block size T must be >= 1, got {list(block_sizes)}")
        levels = len(block_sizes) + 1
        if len(cached) != self.num_rows * levels:
            raise ValueError(f"cached has {len(cached)} entries for {self.num_rows} rows x {levels} levels")
        for r in range(self.num_rows):
            finished = self.finished(r)
            most = self.committed_len(r) - (0 if finished else 1)
            for lvl in range(levels):
                value = cached[r * levels + lvl]
                if not 0 <= value <= most:
                    why = "finished: its committed length" if finished else "held: its committed length - 1"
                    raise ValueError(f"row {r}, level {lvl}: cached {value} outside [0, {most}] ({why})")
        committed = [self.committed_len(r) for r in range(self.num_rows)]
        self._num_levels = levels
        self._block_sizes = list(block_sizes)
        self.frontier = [[n] * levels for n in committed]
        self.cached = [cached[r * levels : (r + 1) * levels] for r in range(self.num_rows)]
        self.closed = [False] * self.num_rows
        self._held = [False] * self.num_rows

    # ----------------------------------------------------------------- checks
    def _check_level(self, level: int) -> int:
        level = operator.index(level)
        if not 0 <= level < self.num_levels:
            raise ValueError(f"level {level} outside [0, {self.num_levels - 1}]")
        return level

    def _check_row(self, row: int) -> int:
        row = operator.index(row)
        if not 0 <= row < self.num_rows:
            raise ValueError(f"row {row} outside [0, {self.num_rows - 1}]")
        return row

    @staticmethod
    def _check_distinct(rows: Sequence[int]) -> None:
        if len(set(rows)) != len(rows):
            raise ValueError(f"rows contain duplicates: {list(rows)}")

    def _check_rows(self, level: int, rows: Sequence[int]) -> None:
        self._check_level(level)
        self._check_distinct(rows)
        for r in rows:
            self._check_row(r)
            wanted = self.wanted_level(r)
            if wanted == level:
                continue
            if wanted < 0:
                state = "finished" if self.finished(r) else "held"
                raise ValueError(f"row {r} is {state}: it wants no level, not level {level}")
            raise ValueError(f"row {r} wants level {wanted}, not level {level}")

    @staticmethod
    def _check_same_length(name: str, values: Sequence[int], rows: Sequence[int]) -> None:
        if len(values) != len(rows):
            raise ValueError(f"{name} has {len(values)} entries for {len(rows)} rows")
