"""Readers of the documentation's markdown (README.md and docs/), for the tests that hold it to the
code: a section under its heading, the rows of a table."""

from __future__ import annotations


def section(text: str, heading: str) -> str:
    """The text under the line `heading`, up to the next `## ` heading."""
    return text.split(f"\n{heading}\n", 1)[1].split("\n## ", 1)[0]


def table(text: str, header: str) -> list[list[str]]:
    """The rows of the markdown table whose header row starts with `| header |`."""
    lines = text[text.index(f"| {header} |") :].splitlines()
    rows = [[cell.strip() for cell in line.strip("|").split(" | ")] for line in lines[2:]]
    return rows[: next((i for i, line in enumerate(lines[2:]) if not line.startswith("|")), len(rows))]
