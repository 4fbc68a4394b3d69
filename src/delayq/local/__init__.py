"""Servers started from the installed binaries, for demos and tests, without root or Docker:
a RabbitMQ node (``node``), a three-node cluster (``cluster``), Redis and PostgreSQL
(``servers``), and throwaway TLS certificates (``tls``)."""
