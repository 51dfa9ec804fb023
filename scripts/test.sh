#!/usr/bin/env bash
# The project's test command (`make test`, `.ci/run`): builds what the tests
# need (the control plane once per machine, the Rust workspace), starts one
# local control plane for all integration tests, and runs lint, unit,
# property, integration and end-to-end tests. Servers it starts are stopped
# on exit, whatever happens.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/cloud-route-controller/target}
export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-never}
export GOTOOLCHAIN=local CGO_ENABLED=0
start=$SECONDS
step() { printf '\n==> [%ss] %s\n' "$((SECONDS - start))" "$*"; }

step "control-plane binaries (kube-apiserver, etcd, kubectl; built once per machine)"
bin_dir=$(scripts/build-controlplane.sh | tail -n 1)
export CRC_CONTROLPLANE_BIN_DIR=$bin_dir

cleanup() {
  if [[ -n "${CRC_STATE_DIR:-}" ]]; then
    scripts/controlplane.sh down >/dev/null 2>&1 || true
    rm -rf "$CRC_STATE_DIR"
  fi
  scripts/neutron.sh stop >/dev/null 2>&1 || true
  scripts/moto.sh stop >/dev/null 2>&1 || true
}
trap cleanup EXIT

step "formatting and lints"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings

step "build"
cargo build --workspace --all-targets --locked

step "local control plane for the integration tests"
# A private state directory, so a developer's own `make controlplane` is left alone.
CRC_STATE_DIR=$(mktemp -d)
export CRC_STATE_DIR
eval "$(scripts/controlplane.sh up | grep '^export ')"

step "Rust tests (unit, property, virtual-time, integration, end-to-end)"
cargo test --workspace --locked --no-fail-fast

step "Go tests (upstream baseline)"
(cd tools/upstream-route-controller && go test ./...)

step "all tests passed in $((SECONDS - start))s"
