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
        ["spark", "cancel", str(tmp_path / "in.csv"), "--store", "redis://h/0", "--id-col", "id"],
    ):
        done = run(f"from delayq.cli import main; raise SystemExit(main({argv!r}))")
        assert done.returncode == 1, done.stderr
        assert "pip install 'delayq[spark]'" in done.stderr


def test_importing_delayq_spark_without_pyspark_raises_import_error_naming_the_extra() -> None:
    done = run("import delayq.spark")
    assert done.returncode == 1
    assert "MissingExtra" in done.stderr and "pip install 'delayq[spark]'" in done.stderr


def collect(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``pytest --collect-only`` as in a ``[test]`` install: no PySpark, no matplotlib."""
    (tmp_path / "sitecustomize.py").write_text(BLOCK)
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(root / "src"), str(root)])
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q",
         *args],
        capture_output=True, text=True, env=env, cwd=root, timeout=120,
    )


def test_the_fault_suite_collects_without_pyspark(tmp_path: Path) -> None:
    done = collect(tmp_path, "-m", "faults")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "tests/faults/test_faults.py::" in done.stdout
    assert "tests/spark left out: PySpark is not installed" in done.stdout


def test_asking_for_the_spark_tests_without_pyspark_fails_naming_the_extra(
    tmp_path: Path,
) -> None:
    done = collect(tmp_path, "-m", "spark", "tests/spark")
    assert done.returncode != 0
    assert "pip install 'delayq[spark]'" in done.stdout + done.stderr
