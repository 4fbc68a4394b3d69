#!/usr/bin/env bash
# Set up a fresh Debian machine, then run the linters and the whole test suite:
# unit tests and the integration suite against a real RabbitMQ ($RABBITMQ_URL,
# else testcontainers where Docker answers, else local nodes the tests start).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
echo "==> ruff"
.venv/bin/ruff check src tests bench
echo "==> mypy --strict"
.venv/bin/mypy
echo "==> pytest"
exec .venv/bin/python -m pytest -p no:cacheprovider "$@"
