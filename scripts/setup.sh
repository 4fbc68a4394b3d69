#!/usr/bin/env bash
# Installs what delayq's demo and tests need on a fresh Debian machine:
# Debian's rabbitmq-server (the demo and the tests start throwaway nodes from it;
# no system service is needed), with --test also redis-server and postgresql
# (the idempotency-store tests start throwaway servers from them) and openssl
# (the TLS tests make throwaway certificates with it) and a Java runtime (the
# Spark tests run a local PySpark session) and RabbitMQ 4.0 and 4.3 in Debian 13 and
# Debian testing trees (scripts/setup-rabbitmq-4.sh: the broker-facing tests run on 3.10,
# 4.0 and 4.3), and a
# virtualenv in .venv with delayq, its test tools, the spark and the docs extras. Safe to run again: it
# skips what is already there.
#   bash scripts/setup.sh          # for the demo
#   bash scripts/setup.sh --test   # for the tests
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

if [ ! -x /usr/lib/rabbitmq/bin/rabbitmq-server ]; then
  echo "==> installing rabbitmq-server (apt-get)"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rabbitmq-server >/dev/null
fi

with_test_servers=no
[ "${1:-}" = "--test" ] && with_test_servers=yes

if [ $with_test_servers = yes ] && ! command -v redis-server >/dev/null 2>&1 \
    && [ ! -x /usr/bin/redis-server ]; then
  echo "==> installing redis-server (apt-get)"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
fi

if [ $with_test_servers = yes ] && ! command -v openssl >/dev/null 2>&1; then
  echo "==> installing openssl (apt-get)"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssl >/dev/null
fi

if [ $with_test_servers = yes ] && ! compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null; then
  echo "==> installing postgresql (apt-get)"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
fi

if [ $with_test_servers = yes ] && ! command -v java >/dev/null 2>&1; then
  echo "==> installing a Java runtime for PySpark (apt-get default-jre-headless)"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq default-jre-headless >/dev/null
fi

if [ $with_test_servers = yes ]; then
  # RabbitMQ 4.0.5 and 4.3.x beside the installed 3.10.8: the broker-facing suites run on
  # each (scripts/test.sh).
  bash scripts/setup-rabbitmq-4.sh 4.0
  bash scripts/setup-rabbitmq-4.sh 4.3
fi

if [ $with_test_servers = yes ] && ! command -v wrk >/dev/null 2>&1; then
  # The load generator of bench/webapp.py (a documented command the tests run).
  echo "==> installing wrk (apt-get)"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null
fi

if [ $with_test_servers = yes ]; then
  # Producers and a consumer in JavaScript speak the wire contract (tests/node).
  if ! command -v npm >/dev/null 2>&1; then
    echo "==> installing nodejs and npm (apt-get)"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
  fi
  echo "==> installing amqplib for tests/node (npm ci)"
  npm ci --prefix tests/node --no-audit --no-fund --silent
fi

if [ ! -x .venv/bin/python ]; then
  echo "==> creating .venv"
  if ! python3 -m venv .venv 2>/dev/null; then
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
    python3 -m venv .venv
  fi
fi
if [ $with_test_servers = yes ]; then
  echo "==> installing delayq, its test tools, the spark and docs extras into .venv (pip)"
  .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test,spark,docs]'
else
  echo "==> installing delayq and its test tools into .venv (pip)"
  .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'
fi
