"""Publishers in a forked child: each forgets the connection it inherited.

A publisher opened before a fork (gunicorn's ``--preload``, Celery's prefork pool,
``multiprocessing`` with the fork start method) would otherwise share its socket with the
parent: both would write frames on one channel and read each other's confirms, so one
process could count as confirmed a message only the other's broker reply covered. Each
publisher that owns its connection registers here; in the child it drops what it
inherited, without closing it (the parent's connection goes on), and opens a connection
of its own at its next use.
"""

from __future__ import annotations

import os
import weakref
from typing import Protocol

__all__ = ["Inheritor", "abandon", "forget_in_children"]


class Inheritor(Protocol):
    def _forget_inherited(self) -> None: ...


_LIVE: weakref.WeakSet[Inheritor] = weakref.WeakSet()
_ABANDONED: list[object] = []
"""What children dropped, kept referenced so that no finalizer ever closes it politely
(a close would send the parent's broker a Connection.Close on the parent's socket)."""


def forget_in_children(owner: Inheritor) -> None:
    """Have ``owner`` forget its connection in any child forked while it lives."""
    _LIVE.add(owner)


def abandon(inherited: object) -> None:
    """Keep ``inherited`` (a child's copy of its parent's link) from ever being closed."""
    _ABANDONED.append(inherited)


def _after_fork_in_child() -> None:
    for owner in list(_LIVE):
        owner._forget_inherited()


if hasattr(os, "register_at_fork"):  # not on Windows
    os.register_at_fork(after_in_child=_after_fork_in_child)
