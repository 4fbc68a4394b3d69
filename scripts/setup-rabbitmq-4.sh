#!/usr/bin/env bash
# Builds RabbitMQ 4.x for local nodes: a minimal Debian tree with Debian's own
# rabbitmq-server, made by debootstrap from the mirror this machine's apt already uses.
#   4.0: Debian 13 ("trixie"), rabbitmq-server 4.0.5 on Erlang 27
#   4.3: Debian testing ("forky"), rabbitmq-server 4.3.x on Erlang 29 (testing moves:
#        the version the tree holds is recorded in its mark and printed by the tests)
# Nothing is installed on the host and its apt sources are not touched: the tree is a
# folder, and delayq runs the server in it under `unshare --mount --pid` + `chroot`
# (see src/delayq/local/rabbitmq.py).
#   bash scripts/setup-rabbitmq-4.sh          # 4.0, as root; about 40-90 s, under 500 MB
#   bash scripts/setup-rabbitmq-4.sh 4.3      # 4.3, as root; about 1-2 min, about 400 MB
# The tree goes to $DELAYQ_RABBITMQ_4_ROOT (4.0; default /var/lib/delayq/rabbitmq-4.0) or
# $DELAYQ_RABBITMQ_4_3_ROOT (4.3; default /var/lib/delayq/rabbitmq-4.3); a finished tree
# is kept (its .delayq-ready mark), so running this again does nothing.
# $DELAYQ_DEBIAN_MIRROR overrides the mirror read from apt's sources.
set -euo pipefail

series=${1:-4.0}
case "$series" in
  4.0) suite=trixie; release="Debian 13"; script=""
       root=${DELAYQ_RABBITMQ_4_ROOT:-/var/lib/delayq/rabbitmq-4.0} ;;
  4.3) suite=forky; release="Debian testing"; script=/usr/share/debootstrap/scripts/sid
       root=${DELAYQ_RABBITMQ_4_3_ROOT:-/var/lib/delayq/rabbitmq-4.3} ;;
  *) echo "setup-rabbitmq-4: no server '$series' (4.0 or 4.3)" >&2; exit 2 ;;
esac
mark="$root/.delayq-ready"
if [ -f "$mark" ]; then
  echo "==> RabbitMQ $series tree ready in $root ($(cat "$mark"))"
  exit 0
fi

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# The Debian mirror apt uses here: the first URI of a deb822 .sources file or a
# one-line "deb URI suite" entry that serves the main archive (not the security one).
mirror() {
  if [ -n "${DELAYQ_DEBIAN_MIRROR:-}" ]; then echo "$DELAYQ_DEBIAN_MIRROR"; return; fi
  local found
  found=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null \
    | awk '/^URIs:/ { for (i = 2; i <= NF; i++) print $i }' | grep -v security | head -n 1 || true)
  if [ -z "$found" ]; then
    found=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
      | awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) { print $i; break } }' \
      | grep -v security | head -n 1 || true)
  fi
  if [ -z "$found" ]; then
    echo "setup-rabbitmq-4: no Debian mirror in apt's sources; set DELAYQ_DEBIAN_MIRROR" >&2
    exit 1
  fi
  echo "$found"
}

if ! command -v debootstrap >/dev/null 2>&1; then
  echo "==> installing debootstrap (apt-get)"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
fi

url=$(mirror)
building="$root.building"
as_root rm -rf "$building"
as_root mkdir -p "$(dirname "$root")"
echo "==> building a $release tree with rabbitmq-server $series in $root (debootstrap, a minute or two)"
started=$(date +%s)
# bookworm's debootstrap has no script for forky: testing bootstraps like sid
if ! as_root debootstrap --variant=minbase --include=rabbitmq-server "$suite" "$building" "$url" \
    ${script:+"$script"} >"$building.log" 2>&1; then
  echo "setup-rabbitmq-4: debootstrap failed; its last lines ($building.log):" >&2
  tail -n 15 "$building.log" >&2
  exit 1
fi
as_root rm -f "$building"/var/cache/apt/archives/*.deb
# Erlang's short node names are name@localhost: the tree resolves localhost itself.
grep -q '^127\.0\.0\.1[[:space:]].*localhost' "$building/etc/hosts" 2>/dev/null \
  || echo "127.0.0.1 localhost" | as_root tee -a "$building/etc/hosts" >/dev/null
version=$(ls "$building/usr/lib/rabbitmq/lib" | sed -n 's/^rabbitmq_server-//p' | head -n 1)
case "$version" in
  "$series".*) ;;
  *) echo "setup-rabbitmq-4: the tree holds RabbitMQ '${version:-none}', not $series.x" >&2; exit 1 ;;
esac
as_root rm -rf "$root"
as_root mv "$building" "$root"
as_root rm -f "$building.log"
echo "rabbitmq-server $version, built $(date -u +%FT%TZ)" | as_root tee "$mark" >/dev/null
echo "==> RabbitMQ $version tree ready in $root ($(( $(date +%s) - started )) s)"
