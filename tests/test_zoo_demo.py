"""`hsd-fast demo` over the committed zoo, eager and short: the output equals the target's, and
`--adapt` lists the hierarchies the run used."""

from __future__ import annotations

import pytest

from hsd_fast import zoo_demo

pytestmark = pytest.mark.hf


def test_the_adaptive_demo_equals_the_target_and_lists_its_hierarchies(capsys) -> None:
    assert zoo_demo.main(max_new_tokens=24, compile=False, adapt=True) == 0  # 1: the outputs differ
    out = capsys.readouterr().out
    assert "eager, adaptive" in out and "equals the target's own greedy output" in out
    assert "hierarchies used" in out and "  from round    0: " in out
