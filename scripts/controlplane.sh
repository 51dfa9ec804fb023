#!/usr/bin/env bash
# Starts (up) or stops (down) a local etcd + kube-apiserver on loopback for the
# demo, benchmarks and manual work. `up` prints shell export lines, so
#   eval "$(scripts/controlplane.sh up)"
# points kubectl and the cluster tests at it. `status` prints them again.
# `restart-apiserver` restarts kube-apiserver alone (same port, data kept).
# The binaries come from scripts/build-controlplane.sh (built once per machine).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/cloud-route-controller/target}

case "${1:-}" in
  up | down | status | restart-apiserver) ;;
  *) echo "usage: $0 up|down|status|restart-apiserver" >&2; exit 2 ;;
esac

# Build output (cargo's progress) goes to stderr so stdout stays eval-able.
cargo build --manifest-path "$root/Cargo.toml" -p test-cluster --bin crc-controlplane >&2
exec "$CARGO_TARGET_DIR/debug/crc-controlplane" "$1"
