"""Reading what a command printed without depending on its layout: its words (runs of whitespace,
line breaks included, read as one space) and its markdown tables (cells stripped)."""

from __future__ import annotations


def words(text: str) -> str:
    """``text`` with every run of whitespace read as one space: alignment is not asserted."""
    return " ".join(text.split())


def table_rows(text: str) -> list[list[str]]:
    """The cells of every markdown table row in ``text``, header rows included, separators not."""
    rows = []
    for line in text.splitlines():
        line = line.strip()
        if len(line) > 1 and line[0] == line[-1] == "|" and not set(line) <= set("|-: "):
            rows.append([cell.strip() for cell in line[1:-1].split("|")])
    return rows
