"""What ``compile="auto"`` pays for a compile (``hsd_fast/compile_price.py``): the record of what the
last process that compiled a hierarchy spent, its key (the levels' weights, the block sizes), and the
engine's decision with and without it. No step is compiled here (the decision is intercepted);
``test_graph_cache.py`` checks that real compiles write the record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hf_models import tiny_model

from hsd_fast import compile_price, engine, graph_cache
from hsd_fast.engine import run_hsd
from hsd_fast.hf_runner import HFRunner
from hsd_fast.lookup import LookupDraft

pytestmark = pytest.mark.hf

PROMPT = [5, 9, 11, 40, 3, 17]


@pytest.fixture
def record_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty inductor cache directory (where the record lives), and no seconds spent yet."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(compile_price, "_SPENT", {})
    return tmp_path


def _runner(seed: int) -> HFRunner:
    return HFRunner(tiny_model("llama", layers=1, seed=seed), 96)


def test_the_key_names_the_weights_the_levels_and_the_block_sizes(monkeypatch) -> None:
    target, draft = _runner(0), _runner(1)
    key = compile_price.hierarchy_key([draft, target], (3,))
    assert compile_price.hierarchy_key([_runner(1), _runner(0)], (3,)) == key  # other objects, same bytes
    assert compile_price.hierarchy_key([_runner(2), target], (3,)) != key  # other weights
    assert compile_price.hierarchy_key([draft, target], (4,)) != key
    assert compile_price.hierarchy_key([target], ()) != compile_price.hierarchy_key(
        [LookupDraft(), target], (3,)
    )
    assert compile_price.hierarchy_key([object(), target], (3,)) is None  # a level without a model
    monkeypatch.setattr(graph_cache, "MAX_CACHED_WEIGHTS", 0)  # not kept by inductor's cache: never recorded
    assert compile_price.hierarchy_key([draft, target], (3,)) is None


def test_a_process_records_its_total_and_replaces_what_an_earlier_one_wrote(record_dir: Path) -> None:
    assert compile_price.recorded_seconds("a") is None
    compile_price.add_spent("a", 40.0)
    compile_price.add_spent("b", 5.0)
    compile_price.add_spent("a", 2.5)  # a later run of this process compiled one more shape
    assert compile_price.recorded_seconds("a") == 42.5
    assert compile_price.recorded_seconds("b") == 5.0
    compile_price._SPENT.clear()  # a later process
    compile_price.add_spent("a", 9.0)
    assert compile_price.recorded_seconds("a") == 9.0
    assert list(json.loads((record_dir / compile_price.RECORD_FILE).read_text())) == ["b", "a"]  # newest last


def test_an_unreadable_record_is_no_record_and_the_oldest_entries_go(record_dir: Path, monkeypatch) -> None:
    path = record_dir / compile_price.RECORD_FILE
    path.write_text("{not json")
    assert compile_price.recorded_seconds("a") is None
    path.write_text(json.dumps({"a": "soon", "b": -1}))
    assert compile_price.recorded_seconds("a") is None and compile_price.recorded_seconds("b") is None
    monkeypatch.setattr(compile_price, "MAX_RECORDED", 2)
    for key in "xyz":
        compile_price.add_spent(key, 1.0)
    assert list(json.loads(path.read_text())) == ["y", "z"]


def test_auto_compiles_after_the_recorded_price(record_dir: Path, monkeypatch, compile_decisions) -> None:
    """Without a record, ``auto`` waits for ``AUTO_COMPILE_AFTER_SECONDS`` of eager decoding; with one
    for this hierarchy, for what it says (at most that); a record of another model's hierarchy of the
    same shapes does not count."""
    target, same_shapes = _runner(0), _runner(3)

    def compiles(runner: HFRunner) -> bool:
        compile_decisions.clear()
        run_hsd(
            [LookupDraft(), runner], [torch.tensor(PROMPT)], block_sizes=[3], max_new_tokens=8, greedy=True
        )
        return any(compile_decisions)

    for runner in (target, same_shapes):
        assert not compiles(runner)  # nothing decoded yet
        assert not compiles(runner)  # a little, far below the default price
    compile_price.add_spent(compile_price.hierarchy_key([LookupDraft(), same_shapes], (3,)), 1e-9)
    assert not compiles(target)  # the record is of the other weights
    assert compiles(same_shapes)
    monkeypatch.setattr(engine, "AUTO_COMPILE_AFTER_SECONDS", 1e-9)  # the default caps a record
    compile_price.add_spent(compile_price.hierarchy_key([LookupDraft(), target], (3,)), 3600.0)
    assert compiles(target)
