"""README.md works as pasted: every ```python block runs in a fresh namespace, the two set-up commands
are there verbatim, and every relative link points at a file (or a heading) that exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"

SET_UP = (
    "python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 && pip install . "
    "&& hsd-fast demo"
)
TESTS = (
    "python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 && "
    'pip install -e ".[test]" && python -m pytest -q -n auto --durations=15'
)


def fenced_blocks(text: str, language: str) -> list[tuple[int, str]]:
    """(first line number, code) of every ```language block of ``text``."""
    blocks = []
    for match in re.finditer(rf"^```{language}\n(.*?)^```$", text, flags=re.S | re.M):
        blocks.append((text.count("\n", 0, match.start()) + 2, match.group(1)))
    return blocks


PYTHON_BLOCKS = fenced_blocks(README.read_text(), "python")


def test_the_readme_has_python_blocks() -> None:
    assert len(PYTHON_BLOCKS) >= 3, "the quick start, the zoo and the engine over table models"


@pytest.mark.hf
@pytest.mark.parametrize(("line", "code"), PYTHON_BLOCKS, ids=[f"line {line}" for line, _ in PYTHON_BLOCKS])
def test_a_python_block_runs_as_pasted(line: int, code: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import hsd_fast.engine

    # compile="auto" (the default) compiles once a hierarchy has decoded eagerly for as long as
    # compiling it costs: on a loaded machine a block could cross that and spend minutes compiling.
    # The code runs as pasted.
    monkeypatch.setattr(hsd_fast.engine, "_compile_price", lambda runners, block_sizes: float("inf"))
    exec(compile(code, f"{README.name}, line {line}", "exec"), {"__name__": "__readme__"})


def test_the_set_up_commands_are_there_verbatim() -> None:
    commands = [code.strip() for _, code in fenced_blocks(README.read_text(), "bash")]
    assert SET_UP in commands, "the demo command changed"
    assert TESTS in commands, "the test command changed"


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_relative_links_resolve() -> None:
    text = README.read_text()
    anchors = {_anchor(h) for h in re.findall(r"^#+ (.+)$", text, flags=re.M)}
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        if (ROOT / path).exists() if path else anchor in anchors:
            continue
        broken.append(target)
    assert not broken, f"README.md links to what is not there: {broken}"
