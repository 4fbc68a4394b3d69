"""PySpark is optional: delayq imports without it, and the Spark commands name the extra."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

BLOCK = "import sys; sys.modules['pyspark'] = None; sys.modules['matplotlib'] = None; "


def run(code: str) -> subprocess.CompletedProcess[str]:
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run(
        [sys.executable, "-c", BLOCK + code], capture_output=True, text=True, env=env, timeout=60
    )


def test_delayq_imports_without_pyspark() -> None:
    done = run(
        "import delayq, delayq.cli, delayq.message.bulk, delayq.observe.records, "
        "delayq.topology.fit; print('ok')"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_the_spark_commands_say_which_extra_to_install(tmp_path: Path) -> None:
    for argv in (
        ["spark", "report", str(tmp_path), "--out", str(tmp_path / "out")],
        ["spark", "schedule", str(tmp_path / "in.csv"), "--delay-col", "delay"],
    ):
        done = run(f"from delayq.cli import main; raise SystemExit(main({argv!r}))")
        assert done.returncode == 1, done.stderr
        assert "pip install 'delayq[spark]'" in done.stderr


def test_importing_delayq_spark_without_pyspark_raises_import_error_naming_the_extra() -> None:
    done = run("import delayq.spark")
    assert done.returncode == 1
    assert "MissingExtra" in done.stderr and "pip install 'delayq[spark]'" in done.stderr
