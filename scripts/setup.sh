#!/usr/bin/env bash
# Installs what delayq's demo and tests need on a fresh Debian machine:
# Debian's rabbitmq-server (the tests and the demo start throwaway nodes from it;
# no system service is needed) and a virtualenv in .venv with delayq and its
# test tools. Safe to run again: it skips what is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

if [ ! -x /usr/lib/rabbitmq/bin/rabbitmq-server ]; then
  echo "==> installing rabbitmq-server (apt-get)"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rabbitmq-server >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
  echo "==> creating .venv"
  if ! python3 -m venv .venv 2>/dev/null; then
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
    python3 -m venv .venv
  fi
fi
echo "==> installing delayq and its test tools into .venv (pip)"
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'
