"""The profile cache and the command line fail clearly, never halfway (issue 20, class C).

- A corrupt or foreign cache file is named in a warning and moved aside; the run goes on empty.
  Entries in another format are measured again where they are used, not a KeyError.
- ``save`` writes only what changed, atomically; a write that fails is a warning (a read-only home).
- Arguments that cannot work are argparse errors before anything is loaded; ``--json`` takes the
  report's stem and refuses a ``.md`` path (the markdown half would overwrite it); the demo refuses
  more tokens than the zoo models have positions, naming the limit, before decoding.

Models and measurements are faked (tiny modules, monkeypatched measurement functions): seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import types
import warnings
from pathlib import Path

import pytest
import torch

import hsd_fast.profile.cache as cache_module
from hsd_fast import zoo
from hsd_fast.cli import main
from hsd_fast.cli_args import report_stem
from hsd_fast.processors import LogitsTransform
from hsd_fast.profile.cache import ProfileCache, ProfileCacheWarning
from hsd_fast.profile.costs import CostProfile

COST = CostProfile((1, 2), (0.01, 0.02), (1,), (0.005,))


@pytest.fixture
def fake_measurements(monkeypatch) -> dict:
    """forward_costs and acceptance replaced by constants (the run's text by the calibration ids);
    counts the calls."""
    calls = {"costs": 0, "alpha": 0}

    def costs(*args, **kwargs):
        calls["costs"] += 1
        return COST

    def alpha(models, *args, **kwargs):
        calls["alpha"] += 1
        return [[0.5] * len(models) for _ in models]

    monkeypatch.setattr(cache_module, "forward_costs", costs)
    monkeypatch.setattr(cache_module, "acceptance", alpha)
    monkeypatch.setattr(cache_module.run_text, "continued", lambda target, ids, **kwargs: ids)
    return calls


def _models() -> list[torch.nn.Module]:
    """Two distinct models, the same ones (the same cache keys) at every call."""
    models = [torch.nn.Linear(2, 2), torch.nn.Linear(2, 3)]
    with torch.no_grad():
        for m in models:
            for p in m.parameters():
                p.copy_(torch.arange(p.numel()).reshape(p.shape))
    return models


def _measure(cache: ProfileCache) -> None:
    for model in _models():
        cache.costs(model, 8)
    cache.acceptance(_models(), torch.arange(6).reshape(2, 3), LogitsTransform(), greedy=True, progress=False)


def _asides(path: Path) -> list[Path]:
    return sorted(path.parent.glob(f"{path.name}.corrupt-*"))


@pytest.mark.parametrize(
    "content",
    [
        b'{"entries": {"cost x": [1, 2',
        b"\xff\xfe\x00garbage",
        b"[1, 2, 3]",
        b'{"costs": {}}',
        b'{"entries": 5}',
    ],
    ids=["truncated", "binary", "a-list", "no-entries", "entries-not-a-dict"],
)
def test_corrupt_or_foreign_cache_is_moved_aside(tmp_path, content, fake_measurements) -> None:
    path = tmp_path / "profiles.json"
    path.write_bytes(content)
    with pytest.warns(ProfileCacheWarning, match=str(path)):
        cache = ProfileCache(path)
    assert cache.entries == {} and not path.exists()
    (aside,) = _asides(path)
    assert aside.read_bytes() == content  # kept, for whoever wants to look
    _measure(cache)
    cache.save()
    assert len(json.loads(path.read_text())["entries"]) == 3  # two costs, one pair's acceptance


def test_corrupt_fallback_is_skipped_and_left_alone(tmp_path) -> None:
    fallback, path = tmp_path / "committed.json", tmp_path / "profiles.json"
    fallback.write_text("{not json")
    path.write_text(json.dumps({"entries": {"alpha a b greedy h": 0.5}}))
    with pytest.warns(ProfileCacheWarning, match="committed.json"):
        cache = ProfileCache(path, fallbacks=[fallback])
    assert cache.entries == {"alpha a b greedy h": 0.5}
    assert fallback.read_text() == "{not json" and not _asides(fallback)


def test_entries_of_another_format_are_measured_again(tmp_path, fake_measurements) -> None:
    """An older version's cost entry (no draft fields) or a hand-edited rate under a key that is
    looked up: measured again and replaced, not a KeyError."""
    cache = ProfileCache(tmp_path / "profiles.json")
    _measure(cache)
    assert fake_measurements == {"costs": 2, "alpha": 1}
    for key in cache.entries:
        cache.entries[key] = {"spans": [1], "seconds": [0.1]} if key.startswith("cost ") else "0.5"
    cache.save()
    reread = ProfileCache(tmp_path / "profiles.json")
    _measure(reread)
    assert fake_measurements == {"costs": 4, "alpha": 2}
    assert reread.costs(_models()[0], 8) == COST


@pytest.mark.parametrize(
    ("bad_seconds", "bad_rate"), [(-1.0, 1.5), (float("nan"), -3), (float("inf"), float("nan"))]
)
def test_entries_out_of_range_are_measured_again(tmp_path, fake_measurements, bad_seconds, bad_rate) -> None:
    """A negative, NaN or infinite time, or a rate outside [0, 1], is no measurement: measured
    again, never fitted into a zero cost or handed to the selector."""
    path = tmp_path / "profiles.json"
    cache = ProfileCache(path)
    _measure(cache)
    for key, entry in cache.entries.items():
        cache.entries[key] = {**entry, "seconds": [bad_seconds] * 2} if key.startswith("cost ") else bad_rate
    cache.save()
    reread = ProfileCache(path)
    _measure(reread)
    assert fake_measurements == {"costs": 4, "alpha": 2}
    assert reread.costs(_models()[0], 8) == COST


def test_a_cost_entry_without_its_noise_is_measured_again(tmp_path, fake_measurements) -> None:
    """Entries without ``noise`` come from a version that timed steps before they settled (compiled
    ones held compilation times): measured again, not handed to the selector."""
    path = tmp_path / "profiles.json"
    cache = ProfileCache(path)
    _measure(cache)
    for key, entry in cache.entries.items():
        if key.startswith("cost "):
            cache.entries[key] = {field: value for field, value in entry.items() if field != "noise"}
    cache.save()
    _measure(ProfileCache(path))
    assert fake_measurements == {"costs": 4, "alpha": 1}


def test_save_writes_only_what_changed(tmp_path, monkeypatch, fake_measurements) -> None:
    path = tmp_path / "profiles.json"
    first = ProfileCache(path)
    _measure(first)
    first.save()
    written = path.read_text()

    def no_write(*args, **kwargs):
        raise AssertionError("nothing changed, yet the cache was written")

    monkeypatch.setattr(cache_module.tempfile, "mkstemp", no_write)
    again = ProfileCache(path)
    _measure(again)  # everything found in the file
    again.save()
    assert fake_measurements == {"costs": 2, "alpha": 1} and path.read_text() == written


def test_save_is_atomic_and_a_failed_write_is_a_warning(tmp_path, monkeypatch, fake_measurements) -> None:
    path = tmp_path / "profiles.json"
    path.write_text(json.dumps({"entries": {}}))
    cache = ProfileCache(path)
    _measure(cache)

    def failing_replace(src, dst):
        assert Path(src).parent == Path(dst).parent  # the temporary file sits next to the cache
        assert len(json.loads(Path(src).read_text())["entries"]) == 3  # complete before the swap
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(cache_module.os, "replace", failing_replace)
    with pytest.warns(ProfileCacheWarning, match="cannot save the profile cache"):
        cache.save()
    assert json.loads(path.read_text()) == {"entries": {}}  # the old file, untouched
    assert sorted(os.listdir(tmp_path)) == ["profiles.json"]  # no temporary file left behind


def test_unwritable_cache_directory_is_a_warning(tmp_path, fake_measurements) -> None:
    """A home where the cache cannot be created (its directory is a file here: refused even to
    root): nothing measured, nothing said; something measured, a warning."""
    blocker = tmp_path / "home"
    blocker.write_text("")
    path = blocker / ".cache" / "profiles.json"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ProfileCache(path).save()
    cache = ProfileCache(path)
    _measure(cache)
    with pytest.warns(ProfileCacheWarning, match="cannot save"):
        cache.save()


# --------------------------------------------------------------------------- the command line
@pytest.fixture
def nothing_runs(monkeypatch):
    """A usage error must come before any model is loaded or any command runs."""

    def refuse(*args, **kwargs):
        raise AssertionError("ran past the argument checks")

    monkeypatch.setattr("hsd_fast.select_command.run", refuse)
    monkeypatch.setattr("hsd_fast.select_command._load", refuse)
    monkeypatch.setattr("hsd_fast.zoo_demo.main", refuse)
    monkeypatch.setattr("hsd_fast.demo.main", refuse)
    monkeypatch.setattr(zoo, "load", refuse)


def _usage_error(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    return capsys.readouterr().err


SELECT_ERRORS = [
    (["--max-T", "0"], "--max-T: expected an integer >= 1, got 0"),
    (["--max-T", "two"], "--max-T: expected an integer >= 1, got 'two'"),
    (["--context", "0"], "--context: expected an integer >= 1"),
    (["--context", "5000"], "max_position_embeddings (1024)"),
    (["--prompt-len", "-3"], "--prompt-len: expected an integer >= 1"),
    (["--max-new-tokens", "0"], "--max-new-tokens: expected an integer >= 1"),
    (["--measure", "--max-new-tokens", "1"], "--max-new-tokens must be >= 2"),
    (["--measure", "--prompt-len", "500"], "calibration windows of 128 tokens"),
    (["--measure", "--prompt-len", "100", "--max-new-tokens", "1000"], "max_position_embeddings (1024)"),
    (["--temperature", "0"], "--temperature: expected a finite number > 0"),
    (["--temperature", "nan"], "--temperature: expected a finite number > 0"),
    (["--top-k", "-1"], "--top-k: expected an integer >= 0"),
    (["--trees", "0"], "--trees: expected an integer >= 1"),
    (["--batch", "0"], "--batch: expected an integer >= 1"),
    (["--top-p", "1.5"], "--top-p: expected a number in (0, 1]"),
    (["--json", "report.md"], "would be overwritten by the markdown report"),
    (["--cache", "x.json", "--no-cache"], "not allowed with argument"),
    (["--device", "gpu0"], "--device: not a device"),
    (["--target", "lookup"], "cannot be the target"),
    (["--candidates", "lookup", "xxs", "lookup"], "name the lookup level once"),
    (["--target", "giant"], "--target giant: neither a checkpoint directory nor a zoo model"),
    (["--candidates", "xxs", "tiny"], "--candidates tiny: neither a checkpoint directory nor a zoo model"),
]


@pytest.mark.parametrize(("args", "message"), SELECT_ERRORS, ids=[" ".join(a) for a, _ in SELECT_ERRORS])
def test_select_refuses_nonsense_up_front(args, message, nothing_runs, capsys) -> None:
    assert message in _usage_error(["select", *args], capsys)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_select_refuses_cuda_without_cuda(nothing_runs, capsys) -> None:
    assert "CUDA is not available" in _usage_error(["select", "--device", "cuda"], capsys)


@pytest.mark.parametrize(
    "args",
    [
        ["--max-new-tokens", "0"],
        ["--threads", "0"],
        ["--tables", "--T", "2", "0"],
        ["--tables", "--samples", "0"],
    ],
    ids=["max-new-tokens", "threads", "T", "samples"],
)
def test_demo_refuses_nonsense_up_front(args, nothing_runs, capsys) -> None:
    assert "expected an integer >= 1" in _usage_error(["demo", *args], capsys)


@pytest.mark.hf
def test_demo_refuses_more_tokens_than_positions(nothing_runs, capsys) -> None:
    """Before any model is loaded (the tokenizer counts the prompt), naming the limit."""
    err = _usage_error(["demo", "--max-new-tokens", "5000"], capsys)
    assert "max_position_embeddings (1024)" in err and "--max-new-tokens <=" in err
    assert "empty" in _usage_error(["demo", "--prompt", ""], capsys)


def test_report_stem() -> None:
    assert report_stem("out/select") == Path("out/select")
    assert report_stem("out/select.json") == Path("out/select")
    assert report_stem("out/run.v2") == Path("out/run.v2")
    for bad in ("select.md", "out/", "."):
        with pytest.raises(argparse.ArgumentTypeError, match=r"markdown|directory"):
            report_stem(bad)


@pytest.mark.parametrize(("given", "stem"), [("r.json", "r"), ("r", "r"), ("run.v2", "run.v2")])
def test_select_writes_both_halves_of_the_report(given, stem, tmp_path, monkeypatch, capsys) -> None:
    """A select run with faked models and selection, its cache in a home where nothing can be
    written: nothing was measured, so nothing is written and nothing fails."""
    names = zoo.names()
    pick = types.SimpleNamespace(
        chain=[0, len(names) - 1],
        drafts=(),
        tree=None,
        T=[2],
        predicted_latency=0.01,
        predicted_tokens_per_second=100.0,
        speedup_over_ar=1.5,
        speedup_over_best_single=1.0,
        runner_ups=[],
    )

    def fake_select(target, candidates, calibration, *, cache, tree_sizes, **kwargs):
        assert tree_sizes == [4, 8]
        cache.save()  # as select_hierarchy does
        return pick

    monkeypatch.setattr("hsd_fast.select_command._load", lambda *args: torch.nn.Linear(2, 2))
    monkeypatch.setattr("hsd_fast.hierarchy.select_hierarchy", fake_select)
    blocker = tmp_path / "home"
    blocker.write_text("")
    out = tmp_path / "out"
    argv = [
        "select",
        "--cache",
        str(blocker / "profiles.json"),
        "--json",
        str(out / given),
        "--trees",
        "4",
        "8",
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error", ProfileCacheWarning)
        assert main(argv) == 0
    assert sorted(p.name for p in out.iterdir()) == [f"{stem}.json", f"{stem}.md"]
    assert json.loads((out / f"{stem}.json").read_text())["rows"][0]["T"] == [2]
    assert (out / f"{stem}.md").read_text().startswith("# hsd-fast select")
    assert "| 0 |" in capsys.readouterr().out
