"""Fixed-width tables of the benchmarks' figures: one header line, one line per row, columns joined by one space.

    from _table import Col, print_table
    print_table([Col("work", "9"), Col("gpu ms", "8.4f"), Col("added", "+7.2f", suffix="%")],
                [("light", 1.23456, 0.5)])
    # work        gpu ms    added
    # light       1.2346   +0.50%

A column's ``spec`` is the format spec of its cells (as in an f-string); its title is as wide as a cell (the suffix
included) and aligned the same way: numbers and ``>`` columns to the right, text to the left.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass

_SPEC = re.compile(r"^(?:.?[<>^=])?[+\- ]?z?#?0?(\d*)")


@dataclass(frozen=True)
class Col:
    title: str
    spec: str  # format spec of a cell, e.g. "13" (text), ">16", "5d", "8.4f", "+7.2f"
    suffix: str = ""  # written after each cell, e.g. "%"

    def head(self) -> str:
        width = int(_SPEC.match(self.spec).group(1) or 0) + len(self.suffix)
        explicit = re.match(r"^.?([<>^])", self.spec)
        align = explicit.group(1) if explicit else (">" if self.spec[-1:] in "bcdeEfFgGnoxX%" and self.spec else "<")
        return format(self.title, f"{align}{width}")

    def cell(self, value) -> str:
        return format(value, self.spec) + self.suffix


def table_lines(cols: list[Col], rows) -> list[str]:
    """The header line and one line per row (a row: one value per column)."""
    return [" ".join(c.head() for c in cols)] + [" ".join(c.cell(v) for c, v in zip(cols, row)) for row in rows]


def print_table(cols: list[Col], rows, *, file=None) -> None:
    for line in table_lines(cols, rows):
        print(line, file=file or sys.stdout)
