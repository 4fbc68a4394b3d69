"""Reading what a Spark job wrote, in the tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_errors(path: Path) -> list[dict[str, Any]]:
    """The lines of a JSON errors output (a folder of ``part-*`` files), parsed."""
    return [
        json.loads(line) for part in path.glob("part-*") for line in part.read_text().splitlines()
    ]
