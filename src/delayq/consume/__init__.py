"""Consuming, without I/O: one delivery flow and the consumers' shared part.

:mod:`delayq.consume.flow` is the sans-I/O delivery flow every consumer drives;
:mod:`delayq.consume.base` holds the consumers' one constructor. The adapters in
:mod:`delayq.sync` and :mod:`delayq.aio` (and the memory consumers in
:mod:`delayq.testing`) add only their I/O.
"""
