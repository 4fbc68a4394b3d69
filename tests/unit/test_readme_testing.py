"""The README's "Testing your handlers" example is a test file that passes as it is."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import delayq

README = Path(__file__).resolve().parents[2] / "README.md"


def _example() -> str:
    text = README.read_text(encoding="utf-8")
    section = text.split("## Testing your handlers", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    assert blocks, "the section has no python example"
    return str(blocks[0])


def test_the_readme_example_passes(tmp_path: Path) -> None:
    example = tmp_path / "test_reminders.py"
    example.write_text(_example(), encoding="utf-8")
    # The delayq under test, whatever the working directory of the example run.
    source = str(Path(delayq.__file__).resolve().parents[1])
    path = os.pathsep.join(p for p in (source, os.environ.get("PYTHONPATH", "")) if p)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", str(example), "-q", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "PYTHONPATH": path},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 passed" in result.stdout
