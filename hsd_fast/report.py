"""Result files: what every report records about its run, markdown tables, and the JSON + markdown
pair that benchmarks and ``hsd-fast select`` write."""

from __future__ import annotations

import datetime
import json
import platform
import subprocess
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

import torch


def device_name(device: str | torch.device) -> str:
    """The GPU's name, or the CPU's model (where the OS names it), architecture and the threads torch
    uses: a VM of the same size may sit on another CPU from one day to the next."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    model = cpu_model()
    return f"cpu ({f'{model}, ' if model else ''}{platform.machine()}, {torch.get_num_threads()} threads)"


def cpu_model() -> str | None:
    """The CPU's model name from /proc/cpuinfo (Linux), else None."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip() or None
    except OSError:
        pass
    return None


def git_commit(cwd: Path | None = None) -> str:
    """The short hash of HEAD (``+dirty`` with uncommitted changes to tracked files) of the checkout
    holding this package, or ``"unknown"`` outside git."""
    cwd = cwd or Path(__file__).resolve().parent

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True).stdout.strip()

    try:
        commit, dirty = git("rev-parse", "--short", "HEAD"), git("status", "--porcelain", "-uno")
    except OSError:
        return "unknown"
    return (commit + ("+dirty" if dirty else "")) if commit else "unknown"


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def run_metadata(device: str | torch.device, **extra: object) -> dict:
    """Date, commit, device and versions: what every result file names."""
    versions = {p: _version(p) for p in ("torch", "transformers", "triton")}
    return {
        "date": datetime.date.today().isoformat(),
        "commit": git_commit(),
        "device": device_name(device),
        "python": platform.python_version(),
        "versions": {p: v for p, v in versions.items() if v is not None},
        **extra,
    }


def format_cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(map(str, value)) + "]" if value else "-"
    return "" if value is None else str(value)


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    """A markdown table; floats get 1 decimal from 10 up, 2 below."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(format_cell(v) for v in row) + " |" for row in rows]
    return lines


def metadata_lines(meta: dict) -> list[str]:
    """``meta`` as markdown bullet lines (nested dicts inline)."""
    lines = []
    for key, value in meta.items():
        if isinstance(value, dict):
            value = ", ".join(f"{k} {v}" for k, v in value.items())
        lines.append(f"- {key}: {value}")
    return lines


def write_report(path: Path, title: str, meta: dict, sections: Sequence[str], data: dict) -> None:
    """``<path>.json`` (``meta`` and ``data``) and ``<path>.md`` (title, metadata, then ``sections``);
    ``path`` is a stem: a dot in it stays."""
    path.parent.mkdir(parents=True, exist_ok=True)
    (path.parent / f"{path.name}.json").write_text(json.dumps({"meta": meta, **data}, indent=1) + "\n")
    markdown = [f"# {title}", "", *metadata_lines(meta), "", *sections]
    (path.parent / f"{path.name}.md").write_text("\n".join(markdown).rstrip() + "\n")


def marked_section(text: str, begin: str, end: str) -> str | None:
    """The part of ``text`` between the marker lines ``begin`` and ``end`` (a generated table in a
    document), or None where a marker is missing."""
    if begin not in text or end not in text:
        return None
    return text.split(begin, 1)[1].split(end, 1)[0].strip("\n")


def write_marked_section(path: Path, begin: str, end: str, content: str) -> None:
    """Replace what stands between the markers of the document at ``path`` with ``content``."""
    text = path.read_text()
    if marked_section(text, begin, end) is None:
        raise ValueError(f"{path} has no markers ({begin} ... {end})")
    head, rest = text.split(begin, 1)
    path.write_text(f"{head}{begin}\n{content}\n{end}{rest.split(end, 1)[1]}")
