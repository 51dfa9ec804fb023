#!/usr/bin/env bash
# `make demo`: the controller's main job on built-in defaults, in one command.
# Builds what it needs (the control plane once per machine, then the Rust
# binaries) and runs crates/demo, which starts a private control plane, the
# simulated cloud and the controller, creates, changes and deletes Nodes,
# and stops everything it started on exit or Ctrl-C.
# Extra arguments go to the demo, e.g. `scripts/demo.sh --nodes 50`.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/cloud-route-controller/target}
export GOTOOLCHAIN=${GOTOOLCHAIN:-local} CGO_ENABLED=0

echo "Building the control plane (the first run on a machine builds kube-apiserver and etcd, about 8 minutes) ..." >&2
CRC_CONTROLPLANE_BIN_DIR=$(scripts/build-controlplane.sh | tail -n 1)
export CRC_CONTROLPLANE_BIN_DIR
# Only what the demo runs: the controller's lab build with the simulated
# cloud alone (no AWS, OpenStack or Hetzner crates), the simulated cloud and
# the demo driver. Cargo's progress stays visible.
echo "Building the controller (memory provider only), cloud-sim and the demo driver ..." >&2
cargo build --no-default-features --features cloud-route-controller/lab \
  -p cloud-route-controller -p cloud-sim -p crc-demo \
  --bin cloud-route-controller --bin cloud-sim --bin crc-demo

bin=$CARGO_TARGET_DIR/debug
exec "$bin/crc-demo" --controller "$bin/cloud-route-controller" --cloud-sim "$bin/cloud-sim" "$@"
