#!/usr/bin/env bash
# The main job: set up a fresh Debian machine, then run `delayq demo`, which
# provisions a seconds-long ladder, publishes a few dozen delayed messages and
# shows each one arriving (requested delay, tier, actual arrival).
# Uses $RABBITMQ_URL when set, else a throwaway local node.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ -n "${RABBITMQ_URL:-}" ]; then
  exec .venv/bin/delayq demo "$@"
else
  exec .venv/bin/delayq demo --local-node "$@"
fi
