"""The profile cache fails clearly, never halfway.

- A corrupt or foreign cache file is named in a warning and moved aside; the run goes on empty.
  Entries in another format are measured again where they are used, not a KeyError.
- ``save`` writes only what changed, atomically; a write that fails is a warning (a read-only home).

Measurements are faked (tiny modules, monkeypatched measurement functions): seconds.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import pytest
import torch

import hsd_fast.profile.cache as cache_module
from hsd_fast.processors import LogitsTransform
from hsd_fast.profile.cache import MAX_REUSED_NOISE, ProfileCache, ProfileCacheWarning
from hsd_fast.profile.costs import CostProfile

COST = CostProfile((1, 2), (0.01, 0.02), (1,), (0.005,))


@pytest.fixture
def fake_measurements(monkeypatch) -> dict:
    """forward_costs and acceptance replaced by constants (the run's text by the calibration ids);
    counts the calls. The machine's speed is held still: the anchor workload, timed once per cache,
    moved past ``ANCHOR_TOLERANCE`` between two caches when other tests loaded the machine (CI: 408
    then 517 us), and the second cache timed everything again (test_latency_model_inputs tests that)."""
    calls = {"costs": 0, "alpha": 0}

    def costs(*args, **kwargs):
        calls["costs"] += 1
        return COST

    def alpha(models, *args, **kwargs):
        calls["alpha"] += 1
        return [[0.5] * len(models) for _ in models], [[0.0] * len(models) for _ in models]

    monkeypatch.setattr(cache_module, "forward_costs", costs)
    monkeypatch.setattr(cache_module, "acceptance_and_spread", alpha)
    monkeypatch.setattr(cache_module.run_text, "continued", lambda target, ids, *args, **kwargs: ids)
    monkeypatch.setattr(cache_module, "anchor_seconds", lambda device, clock=None: 1e-4)
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


def test_a_noisy_cost_entry_is_measured_again(tmp_path, fake_measurements) -> None:
    """A cost timed on a busy machine (noise above ``MAX_REUSED_NOISE``) is not reused by a later
    run; one just under the bound is."""
    path = tmp_path / "profiles.json"
    cache = ProfileCache(path)
    _measure(cache)
    keys = [key for key in cache.entries if key.startswith("cost ")]
    cache.entries[keys[0]] = {**cache.entries[keys[0]], "noise": MAX_REUSED_NOISE * 1.5}
    for key in keys[1:]:
        cache.entries[key] = {**cache.entries[key], "noise": MAX_REUSED_NOISE}
    cache.save()
    _measure(ProfileCache(path))
    assert fake_measurements == {"costs": len(keys) + 1, "alpha": 1}


def test_save_writes_only_what_changed(tmp_path, monkeypatch, fake_measurements) -> None:
    path = tmp_path / "profiles.json"
    first = ProfileCache(path)
    _measure(first)
    first.save()
    written = path.read_text()

    def no_write(*args, **kwargs):
        raise AssertionError("nothing changed, yet the cache was written")

    monkeypatch.setattr(cache_module, "write_atomically", no_write)
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
