"""The ops refuse bad arguments instead of crashing or reading out of bounds.

``verify`` and ``sample``: the torch references and the Triton launchers run one shared check
(triton_kernels/checks.py) and raise the same ``ValueError``, naming the argument: shapes, ranks,
dtypes, devices and scalars always; values (draft tokens in [0, V), counts in [0, D], temperature
> 0) on the host for CPU tensors. Where values are not read on the host (CUDA), the kernels clamp
what they read and OR error bits into ``error_flag``; that is tested in a subprocess (an
out-of-bounds read under the interpreter is a segfault, which must fail the test, not kill the run).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from hsd_fast.triton_kernels import checks
from hsd_fast.triton_kernels.keyed_random_torch import DRAFT
from hsd_fast.triton_kernels.rejection_torch import verify_torch
from hsd_fast.triton_kernels.sampling_torch import sample_torch

B, D, V = 3, 3, 7
COUNTS = [2, 0, 3]
META = torch.device("meta")  # another device, on any machine


def _verify_batch() -> dict:
    """Rows of 2, 0 and 3 drafts; row 1's padding holds negative garbage (allowed: not a draft)."""
    gen = torch.Generator().manual_seed(0)
    draft = torch.randn(B, D, V, generator=gen)
    tokens = torch.randint(0, V, (B, D), generator=gen)
    tokens[1] = -5
    tokens[0, 0] = -1
    return {
        "verifier_logits": torch.randn(B, D + 1, V, generator=gen),
        "draft_logits": draft,
        "draft_lse": torch.logsumexp(draft, -1),
        "draft_tokens": tokens,
        "num_drafts": torch.tensor(COUNTS),
        "temperature": torch.tensor([1.0, 0.5, 2.0]),
        "seeds": torch.tensor([11, 22, 33]),
        "positions": torch.tensor([4, 9, 6]),
        "level": 1,
        "greedy": False,
    }


def _put(t: torch.Tensor, index, value) -> torch.Tensor:
    t = t.clone()
    t[index] = value
    return t


# (id, changed arguments given the valid batch, the argument the error must name)
VERIFY_CASES = [
    ("token-at-V", lambda a: {"draft_tokens": _put(a["draft_tokens"], (0, 2), V)}, "draft_tokens"),
    ("token-negative", lambda a: {"draft_tokens": _put(a["draft_tokens"], (2, 0), -1)}, "draft_tokens"),
    ("token-huge", lambda a: {"draft_tokens": _put(a["draft_tokens"], (2, 2), 2**40)}, "draft_tokens"),
    ("count-above-D", lambda a: {"num_drafts": torch.tensor([2, 0, 4])}, "num_drafts"),
    ("count-negative", lambda a: {"num_drafts": torch.tensor([2, -1, 3])}, "num_drafts"),
    ("temperature-zero", lambda a: {"temperature": torch.tensor([1.0, 0.0, 1.0])}, "temperature"),
    ("temperature-negative", lambda a: {"temperature": torch.tensor([-1.0, 1.0, 1.0])}, "temperature"),
    ("temperature-nan", lambda a: {"temperature": torch.tensor([1.0, 1.0, float("nan")])}, "temperature"),
    (
        "too-few-verifier-columns",
        lambda a: {"verifier_logits": a["verifier_logits"][:, :D]},
        "verifier_logits",
    ),
    ("verifier-rows", lambda a: {"verifier_logits": a["verifier_logits"][:2]}, "verifier_logits"),
    ("verifier-rank", lambda a: {"verifier_logits": a["verifier_logits"][0]}, "verifier_logits"),
    (
        "verifier-not-a-tensor",
        lambda a: {"verifier_logits": a["verifier_logits"].tolist()},
        "verifier_logits",
    ),
    ("verifier-int", lambda a: {"verifier_logits": a["verifier_logits"].long()}, "verifier_logits"),
    ("empty-vocabulary", lambda a: {"verifier_logits": a["verifier_logits"][..., :0]}, "verifier_logits"),
    ("draft-vocabulary", lambda a: {"draft_logits": a["draft_logits"][..., :-1]}, "draft_logits"),
    ("draft-columns", lambda a: {"draft_logits": a["verifier_logits"]}, "draft_logits"),
    ("draft-rank", lambda a: {"draft_logits": a["draft_logits"][0]}, "draft_logits"),
    ("draft-device", lambda a: {"draft_logits": a["draft_logits"].to(META)}, "draft_logits"),
    ("lse-shape", lambda a: {"draft_lse": a["draft_lse"][:, :2]}, "draft_lse"),
    ("lse-int", lambda a: {"draft_lse": a["draft_lse"].long()}, "draft_lse"),
    ("tokens-rank", lambda a: {"draft_tokens": a["draft_tokens"][0]}, "draft_tokens"),
    ("tokens-float", lambda a: {"draft_tokens": a["draft_tokens"].float()}, "draft_tokens"),
    ("tokens-bool", lambda a: {"draft_tokens": a["draft_tokens"] > 0}, "draft_tokens"),
    ("tokens-device", lambda a: {"draft_tokens": a["draft_tokens"].to(META)}, "draft_tokens"),
    ("counts-length", lambda a: {"num_drafts": torch.tensor([2, 0, 3, 1])}, "num_drafts"),
    ("counts-float", lambda a: {"num_drafts": torch.tensor([2.0, 0.0, 3.0])}, "num_drafts"),
    ("temperature-length", lambda a: {"temperature": torch.ones(2)}, "temperature"),
    ("temperature-int", lambda a: {"temperature": torch.ones(B, dtype=torch.int64)}, "temperature"),
    ("temperature-scalar", lambda a: {"temperature": 1.0}, "temperature"),
    ("seeds-rank", lambda a: {"seeds": a["seeds"][:, None]}, "seeds"),
    ("seeds-float", lambda a: {"seeds": a["seeds"].double()}, "seeds"),
    ("positions-length", lambda a: {"positions": a["positions"][:1]}, "positions"),
    ("positions-device", lambda a: {"positions": a["positions"].to(META)}, "positions"),
    ("level-negative", lambda a: {"level": -1}, "level"),
    ("level-too-large", lambda a: {"level": 2**24}, "level"),
    ("level-float", lambda a: {"level": 1.0}, "level"),
    ("level-bool", lambda a: {"level": True}, "level"),
    ("greedy-int", lambda a: {"greedy": 1}, "greedy"),
    ("flag-dtype", lambda a: {"error_flag": torch.zeros(1, dtype=torch.int64)}, "error_flag"),
    ("flag-size", lambda a: {"error_flag": torch.zeros(2, dtype=torch.int32)}, "error_flag"),
    ("flag-device", lambda a: {"error_flag": torch.zeros(1, dtype=torch.int32, device=META)}, "error_flag"),
]


def _sample_batch() -> dict:
    gen = torch.Generator().manual_seed(1)
    return {
        "logits": torch.randn(B, V, generator=gen),
        "temperature": torch.tensor([1.0, 0.5, 2.0]),
        "seeds": torch.tensor([11, 22, 33]),
        "positions": torch.tensor([4, 9, 6]),
        "level": 0,
        "purpose": DRAFT,
        "greedy": False,
    }


SAMPLE_CASES = [
    ("temperature-zero", lambda a: {"temperature": torch.tensor([1.0, 0.0, 1.0])}, "temperature"),
    ("temperature-nan", lambda a: {"temperature": torch.tensor([float("nan"), 1.0, 1.0])}, "temperature"),
    ("logits-rank", lambda a: {"logits": a["logits"][None]}, "logits"),
    ("logits-int", lambda a: {"logits": a["logits"].long()}, "logits"),
    ("empty-vocabulary", lambda a: {"logits": a["logits"][:, :0]}, "logits"),
    ("temperature-length", lambda a: {"temperature": torch.ones(B + 1)}, "temperature"),
    ("seeds-float", lambda a: {"seeds": a["seeds"].float()}, "seeds"),
    ("positions-rank", lambda a: {"positions": a["positions"][:, None]}, "positions"),
    ("positions-device", lambda a: {"positions": a["positions"].to(META)}, "positions"),
    ("level-negative", lambda a: {"level": -2}, "level"),
    ("purpose-too-large", lambda a: {"purpose": 256}, "purpose"),
    ("purpose-float", lambda a: {"purpose": 1.5}, "purpose"),
    ("greedy-none", lambda a: {"greedy": None}, "greedy"),
    ("flag-dtype", lambda a: {"error_flag": torch.zeros(1)}, "error_flag"),
]

SPLIT_CASES = [
    ("block-not-power-of-two", {"block_v": 3}, "block_v"),
    ("block-zero", {"block_v": 0}, "block_v"),
    ("chunks-zero", {"num_chunks": 0}, "num_chunks"),
    ("chunks-float", {"num_chunks": 2.0}, "num_chunks"),
]


def _ids(cases) -> list[str]:
    return [case[0] for case in cases]


def _error(fn, kwargs: dict) -> str:
    with pytest.raises(ValueError) as info:
        fn(**kwargs)
    return str(info.value)


@pytest.mark.parametrize(("name", "change", "argument"), VERIFY_CASES, ids=_ids(VERIFY_CASES))
def test_verify_reference_names_the_bad_argument(name, change, argument) -> None:
    batch = _verify_batch()
    assert _error(verify_torch, {**batch, **change(batch)}).startswith(f"{argument}: ")


@pytest.mark.parametrize(("name", "change", "argument"), SAMPLE_CASES, ids=_ids(SAMPLE_CASES))
def test_sample_reference_names_the_bad_argument(name, change, argument) -> None:
    batch = _sample_batch()
    assert _error(sample_torch, {**batch, **change(batch)}).startswith(f"{argument}: ")


def test_valid_edge_cases_pass() -> None:
    """Padding with garbage, rows without drafts, no draft columns at all, no rows, an error flag
    that stays 0: the checks refuse none of them."""
    batch = _verify_batch()
    flag = torch.zeros(1, dtype=torch.int32)
    verify_torch(**batch, error_flag=flag)
    no_columns = {**batch, "verifier_logits": batch["verifier_logits"][:, :1]}
    no_columns |= {"draft_logits": batch["draft_logits"][:, :0], "draft_lse": batch["draft_lse"][:, :0]}
    no_columns |= {
        "draft_tokens": batch["draft_tokens"][:, :0],
        "num_drafts": torch.zeros(B, dtype=torch.long),
    }
    verify_torch(**no_columns)
    verify_torch(**{k: v[:0] if isinstance(v, torch.Tensor) else v for k, v in batch.items()})
    sample_torch(**_sample_batch(), error_flag=flag)
    assert flag.item() == 0


def test_error_flag_reads_as_the_arguments() -> None:
    checks.raise_on_error_flag(torch.zeros(1, dtype=torch.int32))
    flag = torch.tensor(
        [checks.DRAFT_TOKEN_OUT_OF_RANGE | checks.TEMPERATURE_NOT_POSITIVE], dtype=torch.int32
    )
    with pytest.raises(ValueError, match=r"draft_tokens.*temperature"):
        checks.raise_on_error_flag(flag)


# ------------------------------------------------------------------ the launchers (Triton)
@pytest.mark.triton
@pytest.mark.parametrize(("name", "change", "argument"), VERIFY_CASES, ids=_ids(VERIFY_CASES))
def test_verify_launcher_raises_the_reference_error(name, change, argument) -> None:
    from hsd_fast.triton_kernels.rejection import verify_triton

    batch = _verify_batch()
    kwargs = {**batch, **change(batch)}
    assert _error(verify_triton, kwargs) == _error(verify_torch, kwargs)


@pytest.mark.triton
@pytest.mark.parametrize(("name", "change", "argument"), SAMPLE_CASES, ids=_ids(SAMPLE_CASES))
def test_sample_launcher_raises_the_reference_error(name, change, argument) -> None:
    from hsd_fast.triton_kernels.sampling import sample_triton

    batch = _sample_batch()
    kwargs = {**batch, **change(batch)}
    assert _error(sample_triton, kwargs) == _error(sample_torch, kwargs)


@pytest.mark.triton
@pytest.mark.parametrize(("name", "override", "argument"), SPLIT_CASES, ids=_ids(SPLIT_CASES))
def test_launchers_refuse_bad_splits(name, override, argument) -> None:
    from hsd_fast.triton_kernels.rejection import verify_triton
    from hsd_fast.triton_kernels.sampling import sample_triton

    assert _error(verify_triton, {**_verify_batch(), **override}).startswith(f"{argument}: ")
    assert _error(sample_triton, {**_sample_batch(), **override}).startswith(f"{argument}: ")


FLAG_SCRIPT = r"""
import os, sys
import torch
if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are imported
from hsd_fast.triton_kernels import checks
from hsd_fast.triton_kernels.rejection import verify_triton
from hsd_fast.triton_kernels.rejection_torch import verify_torch
from hsd_fast.triton_kernels.sampling import sample_triton
from hsd_fast.triton_kernels.sampling_torch import sample_torch

checks.host_values = lambda t: False  # as on CUDA: no value read on the host, the kernels flag them
device = "cuda" if torch.cuda.is_available() else "cpu"
B, D, V = 3, 3, 7
gen = torch.Generator().manual_seed(0)
draft = torch.randn(B, D, V, generator=gen)
good = dict(
    verifier_logits=torch.randn(B, D + 1, V, generator=gen), draft_logits=draft,
    draft_lse=torch.logsumexp(draft, -1), draft_tokens=torch.randint(0, V, (B, D), generator=gen),
    num_drafts=torch.tensor([2, 3, 1]), temperature=torch.ones(B), seeds=torch.tensor([1, 2, 3]),
    positions=torch.tensor([4, 5, 6]),
)
good = {k: v.to(device) for k, v in good.items()}

def put(name, index, value):
    t = good[name].clone()
    t[index] = value
    return {name: t}

# Row 1 is bad in each case (values far out: an unclamped read would fault); rows 0 and 2 are not.
cases = [
    (put("num_drafts", 1, 2**30), checks.NUM_DRAFTS_OUT_OF_RANGE),
    (put("num_drafts", 1, -2**30), checks.NUM_DRAFTS_OUT_OF_RANGE),
    (put("draft_tokens", (1, 2), 2**40), checks.DRAFT_TOKEN_OUT_OF_RANGE),
    (put("draft_tokens", (1, 1), -2**40), checks.DRAFT_TOKEN_OUT_OF_RANGE),
    (put("temperature", 1, 0.0), checks.TEMPERATURE_NOT_POSITIVE),
    ({**put("temperature", 1, float("nan")), **put("num_drafts", 1, 4)},
     checks.TEMPERATURE_NOT_POSITIVE | checks.NUM_DRAFTS_OUT_OF_RANGE),
]
for greedy in (False, True):
    split = dict(block_v=2, num_chunks=3)  # several chunks and blocks per row
    reference = verify_triton(**good, level=1, greedy=greedy, **split)
    for change, bits in cases:
        args = {**good, **change}
        flag = torch.zeros(1, dtype=torch.int32, device=device)
        out = verify_triton(**args, level=1, greedy=greedy, error_flag=flag, **split)
        assert flag.item() == bits, (change, flag.item(), bits)
        want = checks.verify_error_bits(args["draft_tokens"], args["num_drafts"], args["temperature"], V)
        assert int(want) == bits  # what the reference ORs in where it cannot raise
        for field in ("num_accepted", "next_token"):  # the good rows are untouched by the bad one
            got, ref = getattr(out, field), getattr(reference, field)
            assert got[[0, 2]].tolist() == ref[[0, 2]].tolist(), (change, field)
        verify_triton(**args, level=1, greedy=greedy)  # no flag given: still no fault
        if bits == checks.TEMPERATURE_NOT_POSITIVE:  # the reference flags it alike (no index is off)
            flag.zero_()
            verify_torch(**args, level=1, greedy=greedy, error_flag=flag)
            assert flag.item() == bits
    flag = torch.zeros(1, dtype=torch.int32, device=device)
    verify_triton(**good, level=1, greedy=greedy, error_flag=flag)
    assert flag.item() == 0
    logits, temperature = good["verifier_logits"][:, 0], good["temperature"].clone()
    temperature[2] = -1.0
    sample_triton(logits, temperature, good["seeds"], good["positions"], 0, 0, greedy, error_flag=flag)
    assert flag.item() == checks.TEMPERATURE_NOT_POSITIVE
    ref_flag = torch.zeros_like(flag)
    sample_torch(logits, temperature, good["seeds"], good["positions"], 0, 0, greedy, error_flag=ref_flag)
    assert ref_flag.item() == checks.TEMPERATURE_NOT_POSITIVE
    try:
        checks.raise_on_error_flag(flag)
    except ValueError as err:
        assert "temperature" in str(err)
    else:
        raise AssertionError("the flag was not raised")
print("flags ok")
"""


@pytest.mark.triton
def test_kernels_flag_bad_values_and_never_read_out_of_bounds() -> None:
    """Counts and tokens 2**30 and 2**40 away from their range: before the clamps, the interpreter
    segfaulted on them (on a GPU, an illegal memory access)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-c", FLAG_SCRIPT], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    assert "flags ok" in done.stdout
