"""The command line over the committed zoo: `zoo info`, `zoo accept`, `select` (with `--measure`)."""

import json

import pytest

from hsd_fast import zoo
from hsd_fast.cli import main

pytestmark = pytest.mark.hf


def test_zoo_info_prints_the_card(capsys) -> None:
    assert main(["zoo", "info"]) == 0
    out = capsys.readouterr().out
    assert all(f"| {name} |" in out for name in zoo.names())


def test_zoo_accept_prints_symmetric_matrices(capsys) -> None:
    assert main(["zoo", "accept"]) == 0
    out = capsys.readouterr().out
    assert "greedy:" in out and "sum_min_t1:" in out
    assert out.count("| 1.000 |") >= 2 * len(zoo.names())  # the diagonal, twice


def test_select_prints_and_measures_the_best_hierarchies(tmp_path, capsys) -> None:
    report = tmp_path / "select.json"
    args = ["select", "--cache", str(tmp_path / "cache.json"), "--json", str(report)]
    assert main([*args, "--measure", "--max-new-tokens", "8", "--prompt-len", "16", "--max-T", "4"]) == 0
    rows = json.loads(report.read_text())["rows"]
    target = zoo.names()[-1]
    assert all(r["chain"][-1] == target for r in rows)
    assert rows[0]["predicted_tok_s"] == max(r["predicted_tok_s"] for r in rows)
    assert any(len(r["chain"]) == 1 for r in rows) and any(len(r["chain"]) == 2 for r in rows)
    assert all(r["measured_tok_s"] > 0 and r["measured_over_predicted_latency"] > 0 for r in rows)
    assert report.with_suffix(".md").read_text().count("\n| ") == len(rows) + 1
    assert "measured tok/s" in capsys.readouterr().out
    # a second run is answered from the cache it wrote
    cached = json.loads((tmp_path / "cache.json").read_text())["entries"]
    assert sum(k.startswith("cost ") for k in cached) == len(zoo.names())


def test_select_refuses_unknown_models() -> None:
    with pytest.raises(ValueError, match="no zoo model 'giant'"):
        main(["select", "--target", "giant", "--no-cache"])
