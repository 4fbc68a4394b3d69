"""The README's "Testing your handlers" examples are test files that pass as they are."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import delayq

README = Path(__file__).resolve().parents[2] / "README.md"


def _examples() -> list[str]:
    text = README.read_text(encoding="utf-8")
    section = text.split("## Testing your handlers", 1)[1].split("\n## ", 1)[0]
    return [str(b) for b in re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)]


@pytest.mark.parametrize(("index", "tests"), [(0, 4), (1, 1)])
def test_the_readme_example_passes(tmp_path: Path, index: int, tests: int) -> None:
    examples = _examples()
    assert len(examples) == 2
    example = tmp_path / f"test_example_{index}.py"
    example.write_text(examples[index], encoding="utf-8")
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
    assert f"{tests} passed" in result.stdout
