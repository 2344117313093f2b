"""The padded layout of a level step: right-aligned blocks, the bucket rule, prompt chunks."""

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from hsd_fast.layout import BUCKETS, MAX_WIDTH, bucket, fed_block, head_chunks

SPANS = st.lists(st.tuples(st.integers(0, 20), st.integers(0, 6), st.booleans()), min_size=1, max_size=5)


@given(SPANS, st.integers(0, 3))
def test_fed_block_right_aligns_every_span(spans, extra: int) -> None:
    starts = torch.tensor([s for s, _, _ in spans])
    ends = starts + torch.tensor([n for _, n, _ in spans])
    active = torch.tensor([a for _, _, a in spans])
    width = max(n for _, n, _ in spans) + extra
    tokens = torch.arange(100).repeat(len(spans), 1) * 10 + torch.arange(len(spans))[:, None]  # [B, 100]
    block = fed_block(tokens, starts, ends, active, width)
    for r, (s, n, a) in enumerate(spans):
        fed = [
            (int(p), int(t))
            for p, t, v in zip(block.positions[r], block.input_ids[r], block.valid[r], strict=True)
            if v
        ]
        assert fed == ([(p, p * 10 + r) for p in range(s, s + n)] if a else [])
        assert block.valid[r, : width - n].sum() == 0  # padding on the left only
    assert (block.positions >= 0).all() and (block.input_ids[~block.valid] == 0).all()


def test_bucket_is_the_smallest_width_that_fits() -> None:
    assert [bucket(n) for n in (1, 2, 3, 5, 7, 9, 64)] == [1, 2, 3, 6, 8, 12, 64]
    assert all(bucket(b) == b for b in BUCKETS)
    with pytest.raises(ValueError, match="chunks"):
        bucket(MAX_WIDTH + 1)


@given(
    st.lists(st.tuples(st.integers(0, 50), st.integers(0, 300)), min_size=1, max_size=4), st.integers(1, 70)
)
def test_head_chunks_leave_spans_that_fit_and_feed_everything_once(spans, width: int) -> None:
    starts = np.array([s for s, _ in spans])
    ends = starts + np.array([n for _, n in spans])
    fed = [[] for _ in spans]
    cursor = starts
    for chunk_start, chunk_end in head_chunks(starts, ends, width):
        assert (chunk_start == cursor).all() and (chunk_end - chunk_start <= width).all()
        for r in range(len(spans)):
            fed[r] += range(chunk_start[r], chunk_end[r])
        cursor = chunk_end
    assert ((ends - cursor) <= width).all()
    for r in range(len(spans)):
        assert fed[r] + list(range(cursor[r], ends[r])) == list(range(starts[r], ends[r]))
