"""Your own models and your own text: ``hsd-fast bench --target DIR --drafts DIR ... [--text SET ...]
[--prompts FILE ...]`` and ``hsd-fast select --target DIR`` with a checkpoint on another tokenizer than
the zoo's.

The text a run calibrates and measures on is put in the target's own ids: the zoo's calibration
windows decoded and encoded again (``zoo.calibration.calibration_in``), the machine's text sets and a
user's files encoded by the target's tokenizer (``bench.scenarios.on_text``). Ids of another
vocabulary are another text (or ids past the embedding: ``select --target DIR`` on a 4,096-entry
tokenizer raised IndexError before).
"""

from __future__ import annotations

import json

import pytest
import torch

from hsd_fast import zoo
from hsd_fast.bench import scenarios
from hsd_fast.bench.text_sets import TextSet
from hsd_fast.cli import main
from hsd_fast.zoo.calibration import calibration_in, read_calibration

pytestmark = pytest.mark.hf

TEXT = "The quick brown fox jumps over the lazy dog; a tokenizer cuts this text into ids of its own. " * 40


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Two zoo models on the zoo's 4,096-entry tokenizer saved as checkpoint directories with it: a
    target (``xs4k``) and its draft (``xxs4k``), as a user's models on a tokenizer of their own."""
    root = tmp_path_factory.mktemp("checkpoints")
    for name in ("xs4k", "xxs4k"):
        zoo.load(name).save_pretrained(root / name)
        zoo.load_tokenizer(name).save_pretrained(root / name)
    return root / "xs4k", root / "xxs4k"


def test_the_zoo_calibration_is_the_same_text_in_another_tokenizers_ids() -> None:
    """In the shared tokenizer the committed windows as they are; in another, every window encodes
    the same text (decoded, it starts that window's text), all of one width."""
    shared, other = zoo.load_tokenizer(), zoo.load_tokenizer("xs4k")
    committed = read_calibration(zoo.zoo_dir())
    same = calibration_in(zoo.zoo_dir(), shared)
    assert all(torch.equal(same[k], committed[k]) for k in committed)
    encoded = calibration_in(zoo.zoo_dir(), other)
    assert encoded.keys() == committed.keys()
    for source, rows in encoded.items():
        assert rows.dtype == torch.long and int(rows.max()) < len(other)
        for ids, window in zip(rows, committed[source], strict=True):
            text = shared.decode(window, skip_special_tokens=True)
            assert text.startswith(other.decode(ids)), source
        assert rows.shape[1] > 32  # a window of 128 shared ids is more than 32 ids of the 4k tokenizer


def test_a_text_file_is_a_prompt_set_in_the_targets_ids(tmp_path) -> None:
    """``on_text``: a file's prompts and calibration windows, decoded by the target's tokenizer, are
    the file's text; every prompt is ``PROMPT_TOKENS`` long; the set is named by the file's stem."""
    path = tmp_path / "my text.txt"
    path.write_text(TEXT)
    tokenizer = zoo.load_tokenizer("xs4k")
    scenario = scenarios.Scenario(
        "mine", "a test", torch.nn.Linear(1, 1), {}, {}, torch.empty(0), {}, tokenizer
    )
    scenarios.on_text(scenario, [TextSet.of_file(path)], prompts_per_set=3)
    prompts = scenario.prompt_sets["my text"]
    assert len(prompts) == 3 and all(len(p) == scenarios.PROMPT_TOKENS for p in prompts)
    assert scenario.calibration.shape == (scenarios.CALIBRATION_PER_SET, scenarios.CALIBRATION_TOKENS)
    for ids in [*prompts, *scenario.calibration]:
        assert tokenizer.decode(ids) in TEXT
    assert str(path) in scenario.description


def test_a_file_too_short_is_named(tmp_path) -> None:
    path = tmp_path / "short.txt"
    path.write_text("too short")
    scenario = scenarios.Scenario(
        "mine", "", torch.nn.Linear(1, 1), {}, {}, torch.empty(0), {}, zoo.load_tokenizer()
    )
    with pytest.raises(ValueError, match=r"text set 'short' \(.*short.txt\): \d+ tokens, fewer than"):
        scenarios.on_text(scenario, [TextSet.of_file(path)], prompts_per_set=2)


@pytest.mark.slow
def test_bench_measures_your_checkpoints_on_your_text(checkpoints, tmp_path) -> None:
    """``hsd-fast bench --target DIR --drafts DIR --prompts FILE``: a target and draft on a tokenizer of
    their own, measured on a user's file beside HF's ways (generate, assisted with the draft, prompt
    lookup): every greedy output is the target's."""
    target, draft = checkpoints
    path = tmp_path / "notes.txt"
    path.write_text(TEXT)
    out = tmp_path / "out"
    argv = ["bench", "--target", str(target), "--drafts", str(draft), "--prompts", str(path), "--quick"]
    argv += ["--max-new-tokens", "12", "--prompts-per-set", "1", "--out", str(out)]
    assert main([*argv, "--cache", str(tmp_path / "cache.json")]) == 0
    report = json.loads((out / "e2e_checkpoints_on_notes_cpu.json").read_text())
    rows = report["rows"]
    assert {r["prompt_set"] for r in rows} == {"notes"}
    assert {"hf", "hf assisted", "hf lookup", "ours"} <= {r["family"] for r in rows}
    assert any(str(draft) in r["config"] for r in rows if r["family"] == "hf assisted")
    assert all(r["same_output"] is True for r in rows), [r["config"] for r in rows if not r["same_output"]]
    assert str(path) in report["meta"]["models"]


@pytest.mark.slow
def test_select_calibrates_a_checkpoint_on_another_tokenizer_in_its_own_ids(checkpoints, tmp_path) -> None:
    """``hsd-fast select --target DIR`` on a 4,096-entry tokenizer: profiled and measured on the zoo's
    calibration text in its ids (the zoo's own ids raised IndexError in the embedding)."""
    target, draft = checkpoints
    report = tmp_path / "select.json"
    argv = ["select", "--target", str(target), "--candidates", "lookup", str(draft), "--max-T", "2"]
    argv += ["--context", "32", "--no-cache", "--measure", "--max-new-tokens", "8", "--prompt-len", "16"]
    assert main([*argv, "--json", str(report)]) == 0
    rows = json.loads(report.read_text())["rows"]
    assert {tuple(r["chain"]) for r in rows} >= {(str(target),)}
    assert all(r["measured_tok_s"] > 0 for r in rows)


def test_a_target_without_a_tokenizer_beyond_the_zoos_ids_is_named(checkpoints, tmp_path, capsys) -> None:
    """A checkpoint directory without tokenizer files is taken to be on the zoo's tokenizer, which it
    cannot be when it embeds fewer ids: said before any profiling."""
    bare = tmp_path / "bare"
    zoo.load("xxs4k").save_pretrained(bare)
    with pytest.raises(SystemExit, match="has no tokenizer files, and its 4096 embeddings are fewer"):
        main(["select", "--target", str(bare), "--candidates", "lookup", "--no-cache"])
