"""The repository stands on its own: no file cites notes kept outside it, and every Python package in
the source tree is listed for installation (a regular install would silently miss it otherwise)."""

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Spelled in pieces so that this file does not cite them itself.
OUTSIDE_NOTES = ["DESIGN" + ".md", "FACTS" + ".md", "ZOO_NOTES" + ".md", "../" + "shared"]


def _tracked_and_new_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    return [ROOT / name for name in listed if (ROOT / name).is_file()]


def test_no_file_cites_notes_outside_the_repository() -> None:
    citing = []
    for path in _tracked_and_new_files():
        if path.suffix in {".safetensors", ".npz", ".png"}:
            continue
        text = path.read_text(errors="replace")
        citing += [f"{path.relative_to(ROOT)}: {note}" for note in OUTSIDE_NOTES if note in text]
    assert not citing, "cite docs/design.md instead:\n" + "\n".join(citing)


def test_every_package_is_installed() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    found = {".".join(init.parent.relative_to(ROOT).parts) for init in ROOT.glob("hsd_fast/**/__init__.py")}
    for name, directory in setuptools["package-dir"].items():
        if (ROOT / directory / "__init__.py").is_file():
            found.add(name)
    assert found <= listed, f"packages missing from pyproject.toml: {sorted(found - listed)}"
