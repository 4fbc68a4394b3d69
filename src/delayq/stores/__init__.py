"""Idempotency stores: the store protocol and its operations (``base``), the in-memory
(``memory``) and SQLite (``sqlite``) stores, Redis (``redis``, the ``redis`` extra),
PostgreSQL (``postgres``, the ``postgres`` extra), and whose keys a store keeps apart
(``key_scope``)."""
