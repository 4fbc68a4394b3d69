"""The ``>>>`` examples in delayq's docstrings run and show what they say (examples that
need a broker or a server are marked ``# doctest: +SKIP`` on every line that needs it).

pytest's ``--doctest-modules`` is not part of the run (``testpaths`` is ``tests``), so
this module runs them: one test per module of ``src/delayq``."""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import os
import pkgutil

import pytest

import delayq

MODULES = sorted(
    info.name
    for info in pkgutil.walk_packages(delayq.__path__, prefix="delayq.")
    if info.name != "delayq.__main__"  # runs the CLI on import
)


def test_the_modules_and_their_examples_were_found() -> None:
    assert {
        "delayq.topology.cascade",
        "delayq.durations",
        "delayq.sync.publisher",
        "delayq.spark",
    } <= set(MODULES)
    cascade = importlib.import_module("delayq.topology.cascade")
    assert sum(len(t.examples) for t in doctest.DocTestFinder().find(cascade)) >= 3


@pytest.mark.parametrize("name", ["delayq", *MODULES])
def test_the_docstring_examples_run(name: str) -> None:
    if name.startswith("delayq.spark"):
        if importlib.util.find_spec("pyspark") is None:
            if os.environ.get("CI"):
                pytest.fail("the spark extra is not installed: scripts/setup.sh --test installs it")
            pytest.skip("the spark extra is not installed (pip install -e '.[spark]')")
    module = importlib.import_module(name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    failures: list[str] = []
    for test in finder.find(module, name):
        runner.run(test, out=failures.append)
    assert not failures, "\n".join(failures)
