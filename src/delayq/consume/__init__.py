"""Consuming, without I/O: the decisions, one delivery flow and the consumers' shared part.

:mod:`delayq.consume.delivery` decides a delivery's fate (decode, idempotency key, retry
or dead letter); :mod:`delayq.consume.retry` holds the retry policies;
:mod:`delayq.consume.handlers` checks what a handler may be;
:mod:`delayq.consume.flow` is the sans-I/O delivery flow every consumer drives;
:mod:`delayq.consume.base` holds the consumers' one constructor. The adapters in
:mod:`delayq.sync` and :mod:`delayq.aio` (and the memory consumers in
:mod:`delayq.testing`) add only their I/O.
"""
