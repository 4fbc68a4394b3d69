"""The run's event loop is the one DELAYQ_TEST_LOOP names, however a test makes it: a
setting that silently left every test on asyncio's loop would hide a uvloop hang."""

from __future__ import annotations

import asyncio
import threading

from tests.loops import loop_under_test


def _kind(loop: asyncio.AbstractEventLoop) -> str:
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"


async def _running() -> str:
    return _kind(asyncio.get_running_loop())


def test_asyncio_run_makes_the_named_loop() -> None:
    assert asyncio.run(_running()) == loop_under_test()


def test_a_new_loop_in_another_thread_is_the_named_loop() -> None:
    """The sync ``Bridge`` and the fault workloads run a loop of their own in a thread."""
    kinds: list[str] = []

    def in_thread() -> None:
        loop = asyncio.new_event_loop()
        try:
            kinds.append(loop.run_until_complete(_running()))
        finally:
            loop.close()

    thread = threading.Thread(target=in_thread)
    thread.start()
    thread.join(30)
    assert kinds == [loop_under_test()]


def test_a_runner_makes_the_named_loop() -> None:
    with asyncio.Runner() as runner:
        assert runner.run(_running()) == loop_under_test()
