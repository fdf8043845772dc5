"""Plain aligned columns for the terminal, as `kubectl get` and `nomad status` print them.

The client's tables are written here rather than with rich: importing rich's console and table was a quarter of
the CPU of a whole `tfcluster status` (measured against the same command without it), and a plain table is what
people pipe into grep and awk. Colour is ANSI escapes, only on a terminal and never with NO_COLOR set
(no-color.org); rich's own views (`status --watch`, the demo) read them back with `Text.from_ansi`.
"""

from __future__ import annotations

import os
import sys
from typing import NamedTuple, Sequence, TextIO, Union

ANSI = {"red": "31", "green": "32", "yellow": "33", "blue": "34", "magenta": "35", "cyan": "36", "bold red": "1;31"}
GAP = "  "


class Painted(NamedTuple):
    """A cell's text and the colour it is shown in on a terminal ("" for none)."""
    text: str
    colour: str = ""


Cell = Union[str, Painted]


def colour_wanted(stream: TextIO = sys.stdout) -> bool:
    """Whether escapes belong in what goes to stream: a terminal that is not "dumb", and no NO_COLOR."""
    return stream.isatty() and "NO_COLOR" not in os.environ and os.environ.get("TERM") != "dumb"


def paint(text: str, colour: str, colour_on: bool) -> str:
    return f"\x1b[{ANSI[colour]}m{text}\x1b[0m" if colour_on and colour in ANSI else text


def table(headers: Sequence[str], rows: Sequence[Sequence[Cell]], title: str = "", colour_on: bool = False) -> str:
    """The rows under upper-case headers, each column as wide as its widest cell; a cell's line breaks become
    spaces so that a row stays one line. The last column is not padded: no line ends in blanks."""
    cells = [[_cell(c) for c in row] for row in rows]
    widths = [max([len(h), *(len(row[i].text) for row in cells)]) for i, h in enumerate(headers)]
    lines = [title] if title else []
    for row in [[Painted(h.upper()) for h in headers], *cells]:
        padded = [paint(c.text, c.colour, colour_on) + " " * (w - len(c.text)) for c, w in zip(row[:-1], widths)]
        lines.append(GAP.join([*padded, paint(row[-1].text, row[-1].colour, colour_on)]).rstrip())
    return "\n".join(lines)


def _cell(cell: Cell) -> Painted:
    painted = cell if isinstance(cell, Painted) else Painted(str(cell))
    return Painted(" ".join(painted.text.split("\n")), painted.colour)
