"""The project's layout, as the docs draw it, matches the tree: one line per package."""

from __future__ import annotations

import re
from pathlib import Path

import delayq

ROOT = Path(__file__).resolve().parents[2]
SRC = Path(delayq.__file__).parent
PAGES = (ROOT / "docs" / "project" / "layout.md", ROOT / "README.md")


def _layout_block() -> str:
    for page in PAGES:
        if not page.exists():
            continue
        text = page.read_text()
        found = re.search(r"```\n(src/delayq/\n.*?)```", text, re.S)
        if found:
            return found.group(1)
    raise AssertionError(f"no layout drawing (a block starting 'src/delayq/') in {PAGES}")


def _packages() -> list[str]:
    return sorted(p.parent.name for p in SRC.glob("*/__init__.py"))


def test_every_package_has_its_line() -> None:
    block = _layout_block()
    starts = re.findall(r"^  (\w+)/ ", block, re.M)
    assert sorted(starts) == _packages()


def test_every_module_of_a_package_is_named_on_its_line() -> None:
    block = _layout_block()
    for package in _packages():
        entry = re.search(rf"^  {package}/ (.*?)(?=^  \S|\Z)", block, re.M | re.S)
        assert entry is not None, package
        words = set(re.findall(r"\w+", entry.group(1)))
        modules = {p.stem for p in (SRC / package).glob("*.py") if p.stem != "__init__"}
        if package in {"sync", "aio", "cli", "spark"}:
            continue  # described by what they offer, their modules listed in the API reference
        missing = sorted(m for m in modules if m not in words)
        assert not missing, f"{package}/: {missing} not on its line"


def test_no_top_level_module_is_forgotten() -> None:
    block = _layout_block()
    words = set(re.findall(r"[\w]+\.py", block))
    modules = {p.name for p in SRC.glob("*.py")}
    assert modules - {"__main__.py", "py.typed"} <= words
