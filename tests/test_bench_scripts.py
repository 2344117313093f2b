"""The scripts under bench/ run against the package as it is: each imports (a function renamed or
moved in the package breaks a script that nothing else runs, and a GPU session has no time to find
out), and the host-time bench's launcher part calls the launchers with arguments they accept.
Nothing is timed: the timer is replaced by one call."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parent.parent / "bench"
SCRIPTS = sorted(path.stem for path in BENCH.glob("*.py"))


@pytest.fixture
def bench_on_path(monkeypatch) -> None:
    pytest.importorskip("triton")  # the kernel benches time with triton.testing
    monkeypatch.syspath_prepend(str(BENCH))


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_bench_script_imports(name: str, bench_on_path) -> None:
    importlib.import_module(name)


def test_the_launcher_host_bench_calls_each_launcher(bench_on_path, monkeypatch) -> None:
    bench_host = importlib.import_module("bench_host")
    written = {}

    def once(fn, cuda: bool) -> float:
        fn()
        return 1.0

    monkeypatch.setattr(bench_host, "median_us", once)
    monkeypatch.setattr(bench_host, "write_results", lambda stem, *args: written.setdefault(stem, args))
    bench_host.launchers()
    rows = written["launcher_host_cpu"][3]
    assert [row["launcher"] for row in rows][:3] == ["verify sampled", "verify greedy", "sample sampled"]


def test_the_busy_share_counts_overlapping_kernels_once() -> None:
    from hsd_fast.bench.gpu_busy import covered

    kernels = [(5.0, 8.0), (0.0, 2.0), (1.0, 3.0), (9.0, 20.0)]
    assert covered(kernels, (1.0, 10.0)) == 2.0 + 3.0 + 1.0  # [1, 3), [5, 8), [9, 10)
    assert covered([], (0.0, 1.0)) == 0.0
    assert covered([(0.0, 4.0), (1.0, 2.0)], (0.0, 10.0)) == 4.0  # one inside another


def _run_main(module, argv: list[str], monkeypatch) -> None:
    monkeypatch.setattr("sys.argv", [module.__name__, *argv])
    module.main()


@pytest.mark.slow
def test_the_family_scripts_run_at_small_shapes(bench_on_path, monkeypatch, tmp_path) -> None:
    """The GPU stages `family` and `profile-family` end to end on tiny twins, eagerly: every row
    and configuration measured and written (a GPU session has no time to find a broken script)."""
    small = ["--small", "--eager", "--context", "32", "--new-tokens", "8"]
    profile_round = importlib.import_module("profile_round")
    _run_main(profile_round, [*small, "--family", "--runs", "1", "--out", str(tmp_path / "p")], monkeypatch)
    result = json.loads((tmp_path / "p" / "profile_round.json").read_text())
    assert [r["config"] for r in result["runs"]] == list(profile_round.FAMILY_CONFIGS)
    assert all(r["wall_ms"] > 0 and r["busy_share"] is None for r in result["runs"])  # no GPU: no share
    assert {(r["config"], r["level"]) for r in result["rows"]} >= {("xs > sm > target, T=[2, 4]", 2)}
    bench_family = importlib.import_module("bench_family")
    argv = [*small, "--passes", "1", "--batch", "1", "--only", "xs > target", "--budget", "6"]
    _run_main(bench_family, [*argv, "--out", str(tmp_path / "f")], monkeypatch)
    rows = [json.loads(line) for line in (tmp_path / "f" / "rows.jsonl").read_text().splitlines()]
    assert [r["config"] for r in rows][:2] == ["HF generate", "ours, xs > target T=[4]"]
    assert all(r["tok_s"] > 0 and "error" not in r for r in rows)
    assert "## ours, xs > target T=[4], batch 1" in (tmp_path / "f" / "profiles.txt").read_text()


@pytest.mark.triton
def test_the_split_sweep_checks_every_split_against_the_reference(bench_on_path) -> None:
    """`bench_tree_attention.py --splits` (`run_gpu.sh bench-splits`) at an interpreter's size: each
    split's output is compared with the torch reference inside the sweep (a mismatch raises)."""
    sweep = importlib.import_module("bench_tree_attention").split_sweep
    rows = sweep([(1, 128, 8)], "cpu", torch.float32)
    assert {"launcher_us", "splits_1_us", "splits_2_us"} <= set(rows[0]) and "splits_4_us" not in rows[0]
