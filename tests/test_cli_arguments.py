"""The command line refuses arguments that cannot work before anything is loaded, and writes its
reports where it is told.

- Arguments that cannot work are argparse errors (exit 2) naming the flag and the limit, before any
  model is loaded or any command runs; the demo refuses more tokens than the zoo models have
  positions, naming the limit, before decoding.
- ``--json`` takes the report's stem and refuses a ``.md`` path (the markdown half would overwrite
  it); a select run whose profile cache cannot be written still writes both halves of its report.

Models and the selection are faked: seconds.
"""

from __future__ import annotations

import argparse
import json
import types
import warnings
from pathlib import Path

import pytest
import torch
from printed import table_rows

from hsd_fast import zoo
from hsd_fast.cli import main
from hsd_fast.cli_args import report_stem
from hsd_fast.early_exit import EarlyExit
from hsd_fast.lookup import LookupDraft
from hsd_fast.other_tokenizer import OtherTokenizerDraft
from hsd_fast.profile.cache import ProfileCacheWarning
from hsd_fast.select_levels import candidate_levels, default_candidates, level_name, named_models


@pytest.fixture
def nothing_runs(monkeypatch):
    """A usage error must come before any model is loaded or any command runs."""

    def refuse(*args, **kwargs):
        raise AssertionError("ran past the argument checks")

    monkeypatch.setattr("hsd_fast.select_command.run", refuse)
    monkeypatch.setattr("hsd_fast.select_command.load_model", refuse)
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
    (["--target", "exit2"], "--target exit2: an exit is a draft level made of the target's layers"),
    (["--candidates", "exit0"], "--candidates exit0: the target s has 6 layers: exits are exit1..exit5"),
    (["--target", "sx", "--candidates", "exit6"], "the target sx has 6 layers: exits are exit1..exit5"),
    (["--target", "sx", "--candidates", "exit2", "exit2"], "name each exit once"),
    (["--candidates", "xs4k", "xxs4k"], "at most one draft with another tokenizer than s's (xs4k, xxs4k)"),
    (["--candidates", "xs4k", "--adapt"], "--adapt: an adaptive run takes no draft with another tokenizer"),
    (
        ["--target", "xs4k"],
        "--target xs4k: the default drafts, the zoo's family, are on the shared tokenizer",
    ),
]


@pytest.mark.parametrize(("args", "message"), SELECT_ERRORS, ids=[" ".join(a) for a, _ in SELECT_ERRORS])
def test_select_refuses_nonsense_up_front(args, message, nothing_runs, capsys) -> None:
    assert message in _usage_error(["select", *args], capsys)


def test_select_offers_a_targets_trained_exits_by_default() -> None:
    """The default candidates: the lookup level and the smaller family models; a target trained for
    early exits (``sx``, 6 layers) adds its shallower half. ``exitK`` names no model to load."""
    assert default_candidates("s") == ["lookup", "xxs", "xs", "sm"]  # s: no exit loss
    smaller = ["lookup", "xxs", "xs", "sm"]  # not s: as large as sx
    assert default_candidates("sx") == [*smaller, "exit1", "exit2", "exit3"]
    assert named_models("sx", ["lookup", "xxs", "exit2"]) == ["xxs", "sx"]
    assert named_models(None, None) == ["xxs", "xs", "sm", "s"]


@pytest.mark.hf
def test_select_refuses_two_directories_on_other_tokenizers(tmp_path, capsys) -> None:
    """A checkpoint directory's tokenizer is known only once loaded: two on another vocabulary than
    the target's are refused then, before any profiling (a hierarchy has one tokenizer boundary)."""
    for name in ("a", "b"):
        zoo.load("xxs4k").save_pretrained(tmp_path / name)
        zoo.load_tokenizer("xxs4k").save_pretrained(tmp_path / name)
    with pytest.raises(SystemExit, match="at most one draft with another tokenizer than s's"):
        main(["select", "--candidates", str(tmp_path / "a"), str(tmp_path / "b"), "--no-cache"])


def test_select_without_a_zoo_says_so(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HSD_FAST_ZOO", str(tmp_path))  # an empty folder: no manifest
    with pytest.raises(SystemExit, match=r"hsd-fast select: no zoo manifest at .*hsd-fast zoo build"):
        main(["select", "--no-cache"])


def test_picked_levels_are_named_as_the_user_names_them() -> None:
    target, draft = zoo.load("sx"), zoo.load("xs4k")
    models = {"xs4k": draft, "sx": target}
    bridged = OtherTokenizerDraft(draft, zoo.load_tokenizer("xs4k"), zoo.load_tokenizer("sx"))
    assert level_name(bridged, models) == "xs4k"  # the bridge is how it drafts, not what it is
    assert level_name(EarlyExit(target, 2), models) == "exit2"
    assert level_name(EarlyExit(target, 2, reuse=False), models) == "exit2 (recompute)"
    assert level_name(LookupDraft(), models) == level_name("lookup", models) == "lookup"
    levels = candidate_levels(["lookup", "exit3", "xs4k"], models, "sx")
    assert levels == ["lookup", EarlyExit(target, 3), draft]


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
        no_draft_reason=None,
        fewer_drafts_reason=None,
        cost_noise=0.0,
    )

    def fake_select(target, candidates, calibration, *, cache, tree_sizes, **kwargs):
        assert tree_sizes == [4, 8]
        cache.save()  # as select_hierarchy does
        return pick

    monkeypatch.setattr("hsd_fast.select_command.load_model", lambda *args: torch.nn.Linear(2, 2))
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
    header, first = table_rows(capsys.readouterr().out)[:2]
    assert header[0] == "#" and first[0] == "0"  # the pick, ranked first


def _parsers(parser: argparse.ArgumentParser, name: str):
    """``parser`` and every sub-command's parser below it, with their command lines."""
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from _parsers(sub, f"{name} {sub_name}")


def test_every_option_of_every_command_says_what_it_does() -> None:
    """`hsd-fast X --help` lists no option without a line of help (a bare `--max-T MAX_T` tells a
    user nothing); the sub-commands' own help is checked too."""
    from hsd_fast.cli import build_parser

    parser, commands = build_parser()
    assert set(commands) == {"demo", "select", "zoo", "bench", "doctor"}
    bare = []
    for name, p in _parsers(parser, "hsd-fast"):
        for action in p._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            if isinstance(action, argparse._SubParsersAction):
                bare += [f"{name} {c.dest}" for c in action._choices_actions if not c.help]
            elif not action.help:
                bare.append(f"{name} {'/'.join(action.option_strings) or action.dest}")
    assert bare == []
