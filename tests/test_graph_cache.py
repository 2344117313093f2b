"""Compiled CPU steps kept in inductor's FX graph cache across processes (``hsd_fast/graph_cache.py``):
a later process loads the steps an earlier one compiled, a model of the same shapes with other
weights compiles its own, every run decodes HF's greedy tokens, and each process records what its
compiles took (``compile_price.py``). The processes are
``cached_decode.py`` runs sharing one cache directory (the slow tests: about 2.5 minutes of one
worker, three compiles). Also the digests that key the weights, and when a model is not cached."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hf_models import tiny_model

from hsd_fast import compile_price, graph_cache

pytestmark = pytest.mark.hf

SCRIPT = Path(__file__).with_name("cached_decode.py")


def _decode(cache_dir: Path, *seeds: int, plant: bool = False) -> list[dict]:
    """``cached_decode.py`` in a new process with inductor's cache in ``cache_dir``: a report per seed."""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache_dir), "TORCHINDUCTOR_FX_GRAPH_CACHE": "1"}
    command = [sys.executable, str(SCRIPT), *map(str, seeds), *(["--plant"] if plant else [])]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


@pytest.mark.slow
def test_a_later_process_loads_the_steps_and_other_weights_compile_their_own(tmp_path: Path) -> None:
    first = _decode(tmp_path, 0, 1)
    later = _decode(tmp_path, 0)
    for run in first + later:
        assert run["tokens"] == run["expected"], run
        assert run["bypasses"] == 0, run
    for run in first:  # seed 1: the shapes of seed 0's model, other weights: nothing to load
        assert run["misses"] > 0 and run["hits"] == 0, run
        assert run["packed"] > 0, "no weight was packed: the test does not cover what the key admits"
    assert later[0]["hits"] == first[0]["misses"] and later[0]["misses"] == 0, later
    # each process recorded what its compiles took (compile_price.py), the later one replacing seed 0's
    record = json.loads((tmp_path / compile_price.RECORD_FILE).read_text())
    assert list(record) == [first[1]["key"], later[0]["key"]] and first[0]["key"] == later[0]["key"]
    for run in (first[1], later[0]):
        assert run["compile_seconds"] > 0 and record[run["key"]] == round(run["compile_seconds"], 3), record


@pytest.mark.slow
def test_weights_keyed_on_shapes_are_caught(tmp_path: Path) -> None:
    """The planted bug: packed weights admitted, every weight keyed on its shape. Seed 1's model then
    loads seed 0's steps, with seed 0's weights in them, and leaves HF's tokens."""
    seed0, seed1 = _decode(tmp_path, 0, 1, plant=True)
    assert seed0["tokens"] == seed0["expected"] and seed0["misses"] > 0
    assert seed1["hits"] > 0 and seed1["misses"] == 0
    assert seed1["tokens"] != seed1["expected"], "a model ran with another model's weights unnoticed"


def test_a_model_digest_follows_every_weight_and_is_kept_while_none_changes() -> None:
    model, same = tiny_model("llama", layers=1, seed=0), tiny_model("llama", layers=1, seed=0)
    digest = graph_cache.model_digest(model)
    assert graph_cache.model_digest(same) == digest  # another object, the same bytes
    assert graph_cache.model_digest(tiny_model("llama", layers=1, seed=1)) != digest
    with torch.no_grad():
        model.model.norm.weight[3] += 1  # one element, in place: the version counter moves
    assert graph_cache.model_digest(model) != digest
    with torch.no_grad():
        model.model.norm.weight[3] -= 1
    assert graph_cache.model_digest(model) == digest


def test_a_packed_weight_is_named_by_its_model_and_a_frozen_one_by_its_bytes() -> None:
    model = tiny_model("llama", layers=1)
    weight = model.lm_head.weight.detach()
    packed = torch.ops.mkldnn._reorder_linear_weight(weight.clone(), 1)
    step = graph_cache.model_digest(model)
    described = graph_cache.described(packed, step)
    assert described is not None and graph_cache.model_digest(model) in described
    assert graph_cache.described(packed, None) is None  # refused, as inductor does
    frozen = weight.clone()
    frozen._is_frozen_param = True
    edited = frozen.clone()
    edited[0, 0] += 1
    edited._is_frozen_param = True
    assert graph_cache.described(frozen, step) != graph_cache.described(edited, step)
    assert graph_cache.described(weight, step) is None  # not frozen: inductor names its values


def test_large_models_and_a_full_disk_are_not_cached(monkeypatch: pytest.MonkeyPatch) -> None:
    model = tiny_model("llama", layers=1)
    assert graph_cache.cacheable(model)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    monkeypatch.setattr(graph_cache, "MAX_CACHED_WEIGHTS", weights - 1)
    assert not graph_cache.cacheable(model)
    monkeypatch.setattr(graph_cache, "MAX_CACHED_WEIGHTS", weights)
    assert graph_cache.cacheable(model)
    full = type("Usage", (), {"free": weights + graph_cache.DISK_RESERVE - 1})
    monkeypatch.setattr(graph_cache.shutil, "disk_usage", lambda path: full)
    assert not graph_cache.cacheable(model)
