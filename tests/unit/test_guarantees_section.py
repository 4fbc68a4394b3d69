"""The docs' "Guarantees and their limits" (docs/concepts/guarantees.md) points at tests
that exist.

Each promise names the test that proves it; a renamed or deleted test would leave
a promise pointing at nothing, so this fails first.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _section() -> str:
    return (ROOT / "docs" / "concepts" / "guarantees.md").read_text(encoding="utf-8")


def _functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }


def test_every_test_the_guarantees_name_exists() -> None:
    refs = re.findall(r"`(tests/[\w/]+\.py)(?:::(\w+))?", _section())
    assert len(refs) >= 12, refs
    for path, name in refs:
        file = ROOT / path
        assert file.is_file(), f"the guarantees name {path}, which does not exist"
        if name:
            assert name in _functions(file), f"the guarantees name {path}::{name}, not found"


def test_every_promise_names_a_proof() -> None:
    rows = [line for line in _section().splitlines() if line.startswith("| **")]
    assert len(rows) >= 10
    for row in rows:
        assert "`tests/" in row.rsplit("|", 2)[-2], f"no test named for: {row[:80]}"
