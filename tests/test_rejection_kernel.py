"""The fused verification kernel equals its torch reference: identical accepted counts and tokens.

On CPU the kernel runs under the Triton interpreter (conftest.py) on tiny shapes, fp16/fp32 (the
interpreter mishandles bf16, docs/design.md, "The Triton interpreter"); `-m gpu` runs real sizes and
bf16 natively on CUDA."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from padded import pad_rows, row_columns

pytest.importorskip("triton")  # every test here runs a kernel: none without Triton

from hsd_fast.engine import run_hsd
from hsd_fast.testing.tables import TableRunner, table_family
from hsd_fast.triton_kernels import rejection, sampling, split
from hsd_fast.triton_kernels.keyed_random_torch import DRAFT
from hsd_fast.triton_kernels.rejection import verify_triton
from hsd_fast.triton_kernels.rejection_torch import verify_torch

pytestmark = pytest.mark.triton


def _case(counts: list[int], vocab: int, dtype: torch.dtype, seed: int, masked: str | None = None):
    """Random inputs for rows with ``counts`` drafts. ``masked``: "strided" excludes a regular pattern
    of tokens on both sides; "topk" keeps 3 verifier tokens per position (so whole vocabulary
    chunks are -inf, and most drafts fall outside the verifier's support)."""
    gen = torch.Generator().manual_seed(seed)
    rows, drafts = len(counts), sum(counts)
    owner = torch.repeat_interleave(torch.arange(rows), torch.tensor(counts, dtype=torch.int64))  # [D]
    verifier = 2 * torch.randn(rows + drafts, vocab, generator=gen)
    draft = 2 * torch.randn(drafts, vocab, generator=gen)
    if masked == "strided":
        verifier[:, ::3] = -float("inf")
        draft[:, 1::4] = -float("inf")
    elif masked == "topk":  # drafts close to the verifier, inside its support, so some accept
        kth = verifier.topk(min(3, vocab), dim=-1).values[:, -1:]
        verifier = verifier.masked_fill(verifier < kth, -float("inf"))
        draft = verifier[torch.arange(drafts) + owner] + 0.5 * torch.randn(drafts, vocab, generator=gen)
    temperature = torch.rand(rows, generator=gen) + 0.5
    q = torch.softmax(draft / temperature[owner, None], -1)
    tokens = torch.multinomial(q, 1, generator=gen)[:, 0] if drafts else torch.zeros(0, dtype=torch.long)
    seeds = torch.randint(0, 2**40, (rows,), generator=gen)
    positions = torch.randint(0, 500, (rows,), generator=gen)
    verifier, draft, tokens, num_drafts = pad_rows(counts, verifier.to(dtype), draft.to(dtype), tokens, seed)
    draft_lse = torch.logsumexp(draft.float() / temperature[:, None, None], -1)  # [B, D]
    return (verifier, draft, draft_lse, tokens, num_drafts, temperature, seeds, positions)


def _assert_same(out, ref, num_drafts: torch.Tensor, atol: float = 1e-5) -> None:
    """Counts and tokens identical; log-sum-exps close where they mean something (a row's drafts
    and its bonus column: the kernel leaves the padding columns unwritten)."""
    assert out.num_accepted.tolist() == ref.num_accepted.tolist()
    assert out.next_token.tolist() == ref.next_token.tolist()
    counts = num_drafts.tolist()
    for got, want in zip(
        row_columns(counts, out.verifier_lse), row_columns(counts, ref.verifier_lse), strict=True
    ):
        torch.testing.assert_close(got.cpu(), want.cpu(), atol=atol, rtol=1e-5)


# (vocab, block, chunks): one block; one chunk of one block; the launcher's split (two chunks, the
# second 1 token long); three chunks of two blocks, the last chunk a 1-token block.
SHAPES = [(7, None, None), (64, 64, 1), (65, 64, None), (65, 16, 3)]
# Rows of 0, 1 and 5 drafts, alone and as one batch; fp16 on the batch (the interpreter is slow:
# docs/design.md, "The Triton interpreter"), fp32 everywhere.
CASES = [(counts, *shape, torch.float32) for counts in [[0], [1], [5], [0, 1, 5]] for shape in SHAPES]
CASES += [([0, 1, 5], *shape, torch.float16) for shape in SHAPES]


@pytest.mark.parametrize(("counts", "vocab", "block", "chunks", "dtype"), CASES, ids=str)
@pytest.mark.parametrize("greedy", [False, True], ids=["sampled", "greedy"])
def test_kernel_equals_reference(counts, vocab, block, chunks, dtype, greedy) -> None:
    for seed, masked in enumerate([None, "strided", "topk"]):
        args = _case(counts, vocab, dtype, seed, masked)
        ref = verify_torch(*args, level=2, greedy=greedy)
        out = verify_triton(*args, level=2, greedy=greedy, block_v=block, num_chunks=chunks)
        _assert_same(out, ref, args[4])


@pytest.mark.parametrize("greedy", [False, True], ids=["sampled", "greedy"])
def test_kernel_loops_over_position_and_chunk_blocks(greedy, monkeypatch) -> None:
    """Positions tested 4 at a time and 9 chunks reduced 4 at a time: the accept kernel takes
    several steps of both loops, and some rows get past the first block of positions."""
    monkeypatch.setattr(rejection, "BLOCK_K", 4)
    monkeypatch.setattr(split, "BLOCK_C", 4)
    reached_second_block = False
    counts = [0, 9, 5, 6]
    for seed in range(2):
        args = _case(counts, 72, torch.float32, seed, masked="topk")
        if greedy:  # drafts equal to the verifier's argmax, one wrong at draft 6 of the second row
            width = max(counts)
            tokens = args[0][:, :width].argmax(-1)  # [B, D]
            column = width - counts[1] + 6
            tokens[1, column] = (tokens[1, column] + 1) % 72
            args = (*args[:3], tokens, *args[4:])
        ref = verify_torch(*args, level=1, greedy=greedy)
        _assert_same(verify_triton(*args, level=1, greedy=greedy, block_v=8, num_chunks=9), ref, args[4])
        reached_second_block |= bool((ref.num_accepted >= 4).any())
    assert reached_second_block


@settings(max_examples=12)
@given(
    counts=st.lists(st.integers(0, 6), min_size=1, max_size=4),
    vocab=st.integers(2, 40),
    block=st.sampled_from([2, 8, 16]),
    chunks=st.one_of(st.none(), st.integers(1, 6)),
    greedy=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_kernel_equals_reference_on_uneven_rows(counts, vocab, block, chunks, greedy, seed) -> None:
    """Uneven rows leave some (row, chunk, position) programs idle, and their padding unread."""
    args = _case(counts, vocab, torch.float32, seed, masked=["strided", None][seed % 2])
    ref = verify_torch(*args, level=3, greedy=greedy)
    out = verify_triton(*args, level=3, greedy=greedy, block_v=block, num_chunks=chunks)
    _assert_same(out, ref, args[4])


def test_vocab_chunks_fill_the_grid_in_whole_blocks() -> None:
    cuda_like = torch.device("cpu")  # the interpreter asks for 8 programs
    assert split.vocab_chunks(1, 64, 16, cuda_like) == (4, 16)  # capped by whole blocks
    assert split.vocab_chunks(2, 1000, 16, cuda_like) == (4, 256)
    assert split.vocab_chunks(64, 1000, 16, cuda_like) == (1, 1008)
    for rows, vocab, block in [(1, 151936, 1024), (3, 32000, 1024), (8, 7, 8)]:
        chunks, size = split.vocab_chunks(rows, vocab, block, cuda_like)
        assert size % block == 0 and (chunks - 1) * size < vocab <= chunks * size


def test_kernel_rejects_and_accepts_in_these_cases() -> None:
    """Guard against a vacuous comparison: the cases above take every path of the op (all drafts
    accepted, some, none; whole -inf chunks under top-k), in both modes."""
    for greedy in (False, True):
        outcomes = set()
        for counts, vocab, *_ in CASES:
            for seed, masked in enumerate([None, "strided", "topk"]):
                args = _case(counts, vocab, torch.float32, seed, masked)
                accepted = verify_torch(*args, level=2, greedy=greedy).num_accepted.tolist()
                outcomes |= {
                    "all" if a == n else "none" if a == 0 else "some"
                    for a, n in zip(accepted, counts, strict=True)
                    if n
                }
        assert outcomes == {"all", "some", "none"}, (greedy, outcomes)
    verifier = torch.cat(
        row_columns([0, 1, 5], _case([0, 1, 5], 65, torch.float32, seed=2, masked="topk")[0])
    )
    first_chunks_masked = torch.isinf(verifier[:, :32]).all(-1) | torch.isinf(verifier[:, 32:64]).all(-1)
    assert first_chunks_masked.any()  # (65, 16, 3) has chunks [0, 32), [32, 64), [64, 65)


def _as_point_masses(args):
    """The same drafts with q a point mass on each token: written out as logits (0 at the token,
    -inf elsewhere, log-sum-exp 0), and as ``None`` (the op's point-mass mode)."""
    verifier, draft, _, tokens, *rest = args
    at = tokens.clamp(0, draft.shape[-1] - 1)[..., None]  # [B, D, 1] (padding columns hold anything)
    written = torch.full_like(draft, -float("inf")).scatter(-1, at, 0.0)
    return (verifier, written, torch.zeros(tokens.shape), tokens, *rest), (
        verifier,
        None,
        None,
        tokens,
        *rest,
    )


@pytest.mark.parametrize(("vocab", "block", "chunks"), [(7, None, None), (65, 16, 3)])
@pytest.mark.parametrize("greedy", [False, True], ids=["sampled", "greedy"])
def test_point_masses_verify_as_the_masses_written_out(vocab, block, chunks, greedy) -> None:
    """A lookup level's drafts: the reference and the kernel given no q give the tokens they give
    with the point masses materialised, accepted and rejected alike."""
    outcomes = set()
    for seed, masked in enumerate([None, "topk", "topk"]):
        written, point = _as_point_masses(_case([0, 1, 5, 3], vocab, torch.float32, seed, masked))
        ref = verify_torch(*written, level=2, greedy=greedy)
        _assert_same(verify_torch(*point, level=2, greedy=greedy), ref, written[4])
        _assert_same(
            verify_triton(*point, level=2, greedy=greedy, block_v=block, num_chunks=chunks), ref, written[4]
        )
        outcomes |= {
            "all" if a == n else "some" if a else "none"
            for a, n in zip(ref.num_accepted.tolist(), [0, 1, 5, 3], strict=True)
            if n
        }
    assert "none" in outcomes and len(outcomes) >= 2, outcomes  # rejections (the residual) and acceptances


def test_point_masses_need_both_q_arguments_absent() -> None:
    verifier, draft, _, *rest = _case([2], 7, torch.float32, 0)
    for op in (verify_torch, verify_triton):
        with pytest.raises(ValueError, match="both None"):
            op(verifier, draft, None, *rest, level=1, greedy=False)


def test_engine_through_the_interpreted_kernel() -> None:
    family = table_family(5, 2, 3, spread=2.0, seed=4)
    prompts = [torch.tensor([0, 1, 2]), torch.tensor([4, 4])]
    kwargs = {"block_sizes": [2, 2], "max_new_tokens": 10, "eos_token_id": 3, "seeds": 9}
    ref = run_hsd([TableRunner(m) for m in family], prompts, use_kernel=False, **kwargs)
    out = run_hsd([TableRunner(m) for m in family], prompts, use_kernel=True, **kwargs)
    assert [s.tolist() for s in out.sequences] == [s.tolist() for s in ref.sequences]
    assert out.stats.corrections == ref.stats.corrections and sum(ref.stats.corrections) > 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("vocab", [32000, 128256, 151936])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("chunks", [None, 1], ids=["split", "unsplit"])
def test_kernel_equals_reference_on_cuda(vocab, dtype, chunks) -> None:
    for seed, masked in enumerate([None, "topk"]):
        args = [a.cuda() for a in _case([4, 0, 8, 16, 1], vocab, dtype, seed, masked)]
        for greedy in (False, True):
            ref = verify_torch(*args, level=1, greedy=greedy)
            out = verify_triton(*args, level=1, greedy=greedy, num_chunks=chunks)
            _assert_same(out, ref, args[4], atol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_kernels_do_not_recompile_per_step() -> None:
    """Batch size, draft counts, chunk counts and the level change from step to step; after one
    warm-up call per mode, none of them may add a compiled variant (verification or drafting)."""
    kernels = [
        rejection._chunk_stats_kernel,
        rejection._accept_kernel,
        rejection._chunk_race_kernel,
        rejection._race_pick_kernel,
        sampling._sample_chunk_kernel,
        sampling._sample_pick_kernel,
    ]

    def variants() -> list[int]:  # device_caches[device][0] is the kernel cache (triton 3.6-3.9)
        return [len(k.device_caches[torch.cuda.current_device()][0]) for k in kernels]

    def step(counts: list[int], level: int, greedy: bool) -> None:
        args = [a.cuda() for a in _case(counts, 32000, torch.bfloat16, seed=len(counts))]
        verify_triton(*args, level=level, greedy=greedy)
        logits, temperature, seeds, positions = args[0][:, -1], *args[5:]
        sampling.sample_triton(logits, temperature, seeds, positions, level, DRAFT, greedy)

    for greedy in (False, True):
        step([4], 1, greedy)
    warm = variants()
    for counts, level in [([1, 0, 7], 0), ([16] * 8, 2), ([3] * 64, 1), ([0] * 5, 3), ([2, 9], 1)]:
        for greedy in (False, True):
            step(counts, level, greedy)
    assert variants() == warm
