"""The scripts under bench/ run against the package as it is: each imports (a function renamed or
moved in the package breaks a script that nothing else runs, and a GPU session has no time to find
out), and the host-time bench's launcher part calls the launchers with arguments they accept.
Nothing is timed: the timer is replaced by one call."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

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
