"""The fenced blocks of a docs page, found by how they start: the tests that run the
plugin migration guide's blocks compare what they print and write with what it shows."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLUGIN_GUIDE = ROOT / "docs" / "guides" / "plugin-migration.md"


def blocks(page: Path) -> list[tuple[str, str]]:
    """Each fenced block of ``page``: its language (``""`` for none) and its text."""
    found, language, lines = [], None, []
    for line in page.read_text(encoding="utf-8").splitlines():
        fence = re.match(r"^```(\S*)\s*$", line)
        if fence and language is None:
            language, lines = fence.group(1), []
        elif line.startswith("```") and language is not None:
            found.append((language, "\n".join(lines) + "\n"))
            language = None
        elif language is not None:
            lines.append(line)
    return found


def block(page: Path, language: str, starting: str) -> str:
    """The one ``language`` block of ``page`` whose text starts with ``starting``."""
    matches = [t for lang, t in blocks(page) if lang == language and t.startswith(starting)]
    assert len(matches) == 1, f"{page.name}: {len(matches)} ```{language} blocks start {starting!r}"
    return matches[0]
