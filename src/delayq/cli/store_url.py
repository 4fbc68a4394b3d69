"""A store named on the command line: ``--store URL`` for ``delayq cancel``,
``delayq reschedule`` and ``delayq spark cancel`` (see :mod:`delayq.stores.url` for the
forms accepted)."""

from __future__ import annotations

from delayq.stores.url import STORE_FORMS, open_store

__all__ = ["STORE_FORMS", "open_store"]
