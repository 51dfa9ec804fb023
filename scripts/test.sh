#!/usr/bin/env bash
# The project's test command (`make test`, `.ci/run`): builds what the tests
# need (the control plane once per machine, the Rust workspace), starts one
# local control plane for all integration tests, and runs lint, unit,
# property, integration and end-to-end tests. The deploy tests' tools
# (podman from apt when missing; helm and promtool from their Go modules,
# once per machine) and the Azure wire check (tools/azure-wire-check, on
# the official Azure SDK for Go) are prepared alongside the Rust build. Servers and
# builds it starts are stopped on exit, whatever happens.
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

tools_pid=""
cleanup() {
  if [[ -n "$tools_pid" ]]; then
    kill -- "-$tools_pid" 2>/dev/null || kill "$tools_pid" 2>/dev/null || true
  fi
  if [[ -n "${CRC_STATE_DIR:-}" ]]; then
    scripts/controlplane.sh down >/dev/null 2>&1 || true
    rm -rf "$CRC_STATE_DIR"
  fi
  scripts/neutron.sh stop >/dev/null 2>&1 || true
  scripts/moto.sh stop >/dev/null 2>&1 || true
}
trap cleanup EXIT

step "tools for the tests: podman, helm, promtool and azure-wire-check (the Go tools built once per machine, in the background)"
# podman builds and unpacks the container image (tests/container_image.rs).
if ! command -v podman >/dev/null; then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    t=$SECONDS
    echo "installing podman with apt-get ..."
    apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q podman >/dev/null
    echo "podman installed in $((SECONDS - t))s"
  else
    reason="podman is not installed and this is not a root shell with apt-get"
    printf '\n!!!!!!!! %s: the container image test will be SKIPPED !!!!!!!!\n\n' "$reason" >&2
    export CRC_SKIP_IMAGE_TEST=$reason
  fi
fi
# helm and promtool compile while cargo builds (cargo alone leaves a core idle
# much of the time); their progress lines are prefixed [helm ...] / [promtool ...]
# / [azure-wire-check ...].
set -m
( scripts/build-gotool.sh helm >/dev/null && scripts/build-gotool.sh promtool >/dev/null \
  && scripts/build-gotool.sh azure-wire-check >/dev/null ) &
tools_pid=$!
set +m

step "formatting and lints"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings

step "build"
cargo build --workspace --all-targets --locked

step "waiting for helm, promtool and azure-wire-check"
if ! wait "$tools_pid"; then
  tools_pid=""
  echo "FAILED: building helm, promtool or azure-wire-check (see the [helm]/[promtool]/[azure-wire-check] lines above)" >&2
  exit 1
fi
tools_pid=""

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
