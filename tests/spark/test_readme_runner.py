"""The docs' Spark blocks run in this worker's session (``rx.run_in_session``): as a
reader's program would, or they fail with their line, and the session outlives them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests import readme_examples as rx

DOC = rx.ROOT / "docs" / "guides" / "spark.md"


def _block(source: str) -> rx.Block:
    return rx.Block(DOC, 100, source)


def test_a_block_runs_in_its_folder_for_python_and_the_jvm(spark: Any, tmp_path: Path) -> None:
    block = _block(
        "import os\n"
        "from delayq.spark import local_session\n"
        "spark = local_session()\n"
        "assert spark.sparkContext.appName == 'delayq-tests'   # the shared session\n"
        "assert __name__ == '__main__'\n"
        "open('here.txt', 'w').write(os.environ['DELAYQ_URL'])\n"
        "spark.createDataFrame([(1,)], 'n int').write.json('out/rows')\n"
        "print('printed')\n"
        "spark.stop()                     # a reader's program may stop its session\n"
    )
    url = "amqp://guest:guest@127.0.0.1:5999/"
    assert rx.run_in_session(block, tmp_path, {rx.AMQP: url}, spark) is None
    assert (tmp_path / "here.txt").read_text() == url
    assert list((tmp_path / "out" / "rows").glob("part-*.json"))
    assert not (Path.cwd() / "out" / "rows").exists()
    assert spark.range(3).count() == 3  # the stop did nothing: the session is shared


def test_a_failing_block_fails_with_its_line_and_output(spark: Any, tmp_path: Path) -> None:
    block = _block("print('before')\nx = 1\nraise ValueError('the example is wrong')\n")
    message = rx.run_in_session(block, tmp_path, {}, spark)
    assert message is not None
    assert message.startswith("docs/guides/spark.md:100: the README's python block raised")
    assert "ValueError: the example is wrong" in message
    assert "line 3" in message and "before" in message
    assert "  103 | raise ValueError" in message  # the block, numbered as in the file


def test_a_block_that_exits_non_zero_fails(spark: Any, tmp_path: Path) -> None:
    assert rx.run_in_session(_block("import sys\nsys.exit(0)\n"), tmp_path, {}, spark) is None
    message = rx.run_in_session(_block("import sys\nsys.exit(3)\n"), tmp_path, {}, spark)
    assert message is not None and "exited with 3" in message
