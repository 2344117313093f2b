"""Usage errors of ``hsd-fast select``, ``bench``, ``zoo`` and ``doctor`` come before any work, name
the flag and its limit, and outputs are checked before the measuring (issue 46, items 4 and 5).

- A value that cannot work is an argparse error (exit 2), never replaced by a default: ``bench
  --passes 0``, ``--temperature nan``, ``select --trees 300``, ``doctor --device cuda`` without CUDA.
- An output that cannot be written (``select --json``, ``bench --out``, ``zoo accept --write``) is
  refused when the arguments are read, not after the run.
- A zoo manifest that is not JSON is named, with its path.

Nothing is loaded or measured: the commands' work is replaced by a function that fails the test.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch

from hsd_fast import zoo
from hsd_fast.bench.scenarios import SCENARIOS
from hsd_fast.cli import main
from hsd_fast.cli_args import output_folder, unwritable
from hsd_fast.tree import MAX_NODES


def _refuse(*args, **kwargs):
    raise AssertionError("ran past the argument checks")


@pytest.fixture
def nothing_runs(monkeypatch) -> None:
    monkeypatch.setattr("hsd_fast.select_command.run", _refuse)
    monkeypatch.setattr("hsd_fast.select_command.load_model", _refuse)
    monkeypatch.setattr("hsd_fast.doctor.load_model", _refuse)
    monkeypatch.setattr("hsd_fast.zoo.build.measure_acceptance", _refuse)
    monkeypatch.setattr(zoo, "load", _refuse)
    for name in SCENARIOS:
        monkeypatch.setitem(SCENARIOS, name, _refuse)
    monkeypatch.setattr("hsd_fast.bench.command.checkpoints_scenario", _refuse)


def _usage_error(argv: list[str], capsys) -> str:
    """What a usage error printed: exit status 2, as argparse's own errors."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    return capsys.readouterr().err


@pytest.fixture
def a_file(tmp_path):
    path = tmp_path / "FILE"
    path.write_text("")
    return path


# ----------------------------------------------------------------------------------------- bench
BENCH_ERRORS = [
    (["--passes", "0"], "--passes", ">= 1"),
    (["--prompts-per-set", "0"], "--prompts-per-set", ">= 1"),
    (["--max-new-tokens", "0"], "--max-new-tokens", ">= 1"),
    (["--max-new-tokens", "-5"], "--max-new-tokens", ">= 1"),
    (["--batch", "1", "0"], "--batch", ">= 1"),
    (["--temperature", "nan"], "--temperature", "finite number > 0"),
    (["--temperature", "inf"], "--temperature", "finite number > 0"),
    (["--do-sample", "--temperature", "0"], "--temperature", "finite number > 0"),
]


@pytest.mark.parametrize(
    ("args", "flag", "limit"), BENCH_ERRORS, ids=[" ".join(a) for a, _, _ in BENCH_ERRORS]
)
def test_bench_refuses_bad_values_instead_of_defaulting(args, flag, limit, nothing_runs, capsys) -> None:
    err = _usage_error(["bench", "--scenario", "tiny", *args], capsys)
    assert flag in err and limit in err


@pytest.mark.parametrize("where", ["the file", "under the file"])
def test_bench_checks_out_before_measuring(where, a_file, nothing_runs, capsys) -> None:
    out = a_file if where == "the file" else a_file / "results"
    err = _usage_error(["bench", "--scenario", "tiny", "--out", str(out)], capsys)
    assert "--out" in err and str(a_file) in err


# ---------------------------------------------------------------------------------------- select
@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--scenario", "twin", "--target", "s"], "--scenario twin and --target: a scenario brings its own"),
        (["--drafts", "xxs"], "--drafts: name their target too (--target)"),
        (["--target", "s", "--drafts", "nowhere"], "--drafts nowhere: neither a checkpoint directory nor"),
        (["--target", "s", "--drafts", "xxs", "xxs"], "--drafts: name each draft once"),
        (["--target", "s", "--drafts", "exit9"], "--drafts exit9: the target s has 6 layers"),
        (["--target", "exit2"], "--target exit2: an exit is a draft level"),
        (["--scenario", "tiny", "--text", "licenses"], "the tiny scenario's random models have no tokenizer"),
        (["--prompts", "missing.txt"], "--prompts missing.txt: no such file"),
    ],
)
def test_bench_refuses_models_and_text_that_cannot_work(args, says, nothing_runs, capsys) -> None:
    assert says in _usage_error(["bench", *args], capsys)


def test_bench_refuses_two_prompt_sets_of_one_name(tmp_path, nothing_runs, capsys) -> None:
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "notes.txt").write_text("text")
    files = [str(tmp_path / "a" / "notes.txt"), str(tmp_path / "b" / "notes.txt")]
    assert "two prompt sets of one name" in _usage_error(["bench", "--prompts", *files], capsys)


def test_select_trees_names_the_flag_and_the_limit(nothing_runs, capsys) -> None:
    err = _usage_error(["select", "--trees", "4", str(MAX_NODES + 44)], capsys)
    assert "--trees" in err and str(MAX_NODES) in err
    err = _usage_error(["select", "--max-T", "65"], capsys)
    assert "--max-T" in err and "64" in err


def test_select_checks_json_before_selecting(a_file, tmp_path, nothing_runs, capsys) -> None:
    err = _usage_error(["select", "--json", str(a_file / "r.json")], capsys)
    assert "--json" in err and str(a_file) in err
    (tmp_path / "r.md").mkdir()  # the markdown half's place is taken by a folder
    err = _usage_error(["select", "--json", str(tmp_path / "r")], capsys)
    assert "--json" in err and str(tmp_path / "r.md") in err


# ------------------------------------------------------------------------------------------- zoo
@pytest.fixture
def zoo_copy(tmp_path):
    """A zoo folder holding a copy of the committed manifest (no models: nothing is loaded)."""
    copy = tmp_path / "zoo"
    copy.mkdir()
    shutil.copy(zoo.zoo_dir() / "manifest.json", copy / "manifest.json")
    return copy


def test_zoo_accept_write_checks_the_zoo_before_measuring(zoo_copy, nothing_runs, capsys) -> None:
    (zoo_copy / "README.md").mkdir()  # unwritable as a file, even to root
    err = _usage_error(["zoo", "--zoo-dir", str(zoo_copy), "accept", "--write"], capsys)
    assert "--write" in err and str(zoo_copy / "README.md") in err


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root writes read-only files")
def test_zoo_accept_write_to_a_read_only_zoo(zoo_copy, nothing_runs, capsys) -> None:
    zoo_copy.chmod(0o555)
    (zoo_copy / "manifest.json").chmod(0o444)
    try:
        err = _usage_error(["zoo", "--zoo-dir", str(zoo_copy), "accept", "--write"], capsys)
    finally:
        zoo_copy.chmod(0o755)
    assert "--write" in err and str(zoo_copy) in err


@pytest.mark.parametrize("action", ["info", "accept"])
def test_a_corrupt_manifest_is_named(action, zoo_copy, nothing_runs, monkeypatch) -> None:
    manifest = zoo_copy / "manifest.json"
    manifest.write_text('{"models": {"xxs": ')
    with pytest.raises(SystemExit) as info:
        main(["zoo", "--zoo-dir", str(zoo_copy), action])
    assert isinstance(info.value.code, str) and str(manifest) in info.value.code  # exit status 1
    monkeypatch.setenv("HSD_FAST_ZOO", str(zoo_copy))
    for read in (zoo.manifest, zoo.names):
        with pytest.raises(ValueError, match=r"manifest\.json"):
            read()
    manifest.write_text(json.dumps(["not", "a", "manifest"]))
    with pytest.raises(ValueError, match="not a JSON object"):
        zoo.names()


# ---------------------------------------------------------------------------------------- doctor
@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_doctor_refuses_cuda_without_cuda(nothing_runs, capsys) -> None:
    err = _usage_error(["doctor", "--target", "xxs", "--no-families", "--device", "cuda"], capsys)
    assert "--device" in err and "CUDA is not available" in err


def test_doctor_refuses_what_is_no_device(nothing_runs, capsys) -> None:
    err = _usage_error(["doctor", "--target", "xxs", "--no-families", "--device", "gpu0"], capsys)
    assert "--device" in err


# ------------------------------------------------------------------------------- the check itself
def test_unwritable_says_why(tmp_path, a_file) -> None:
    assert unwritable(tmp_path / "new" / "deeper" / "r.json") is None  # folders are created
    assert unwritable(a_file) is None  # overwritten
    assert "is a file" in unwritable(a_file / "r.json")
    assert "is a folder" in unwritable(tmp_path)
    assert "is a file" in unwritable(a_file, folder=True)
    assert output_folder(str(tmp_path / "results")) == tmp_path / "results"
