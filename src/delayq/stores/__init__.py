"""Idempotency stores: the store protocol and its operations, the in-memory and SQLite
stores (``idempotency``), Redis (``redis``, the ``redis`` extra), PostgreSQL (``postgres``,
the ``postgres`` extra), and whose keys a store keeps apart (``key_scope``)."""
