"""A table of text cells: what ``delayq stats``, ``dlq list``, ``topology verify`` and
``retry-plan`` print.

The rows are built once, here in the core, with no terminal in sight; the command line
shows them as a rich table on a terminal and as :meth:`Table.plain` text everywhere else
(a pipe, a file, a test), where aligned columns split on whitespace and nothing is coloured.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["Column", "Table"]


@dataclass(frozen=True)
class Column:
    """One column: its header, right-aligned (numbers) or not, and a width the plain text
    cuts longer cells to (ending them in ``…``; a rich table folds them instead)."""

    header: str
    right: bool = False
    max_width: int | None = None


@dataclass
class Table:
    """Columns, rows of cells, and comment lines printed above and below the rows."""

    columns: Sequence[Column]
    rows: list[Sequence[str]] = field(default_factory=list)
    before: list[str] = field(default_factory=list)
    after: list[str] = field(default_factory=list)

    def add(self, *cells: str) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"a row of {len(cells)} cells for {len(self.columns)} columns")
        self.rows.append(cells)

    def plain(self) -> str:
        """Aligned text, two spaces between columns, ``# `` lines above and below."""
        cut = [
            [_cut(cell, col.max_width) for cell, col in zip(row, self.columns, strict=True)]
            for row in self.rows
        ]
        widths = [
            max([len(col.header), *(len(row[i]) for row in cut)])
            for i, col in enumerate(self.columns)
        ]
        lines = [f"# {line}" for line in self.before]
        for row in [[col.header for col in self.columns], *cut]:
            cells = [
                cell.rjust(width) if col.right else cell.ljust(width)
                for cell, width, col in zip(row, widths, self.columns, strict=True)
            ]
            lines.append("  ".join(cells).rstrip())
        lines += [f"# {line}" for line in self.after]
        return "\n".join(lines) + "\n"


def _cut(text: str, width: int | None) -> str:
    if width is None or len(text) <= width:
        return text
    return text[: width - 1] + "…"
