#!/usr/bin/env bash
# The real-API-server benchmark (`make bench`): upstream's route controller
# (watch gate off and on) and this project's periodic, watch and incremental
# modes, each against a fresh local etcd + kube-apiserver, under the same Node
# scenario. Arguments are passed to real-api-bench (e.g. --nodes 5000,
# --cloud-latency-ms 100, --controllers incremental); `real-api-bench --help`
# lists them. Results: $BENCH_OUT/results.{md,json} (default under the cache).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/cloud-route-controller/target}
out=${BENCH_OUT:-$HOME/.cache/cloud-route-controller/bench/results-$(date +%Y%m%d-%H%M%S)}

log() { printf '[bench %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

log "building the upstream baseline"
upstream=$("$root/tools/upstream-route-controller/build.sh" | tail -n 1)
log "building cloud-route-controller and real-api-bench (release)"
# Two invocations: built together, Cargo would unify features and compile
# provider-aws's `testing` proxy (real-api-bench needs it) into the
# controller binary.
# The lab build: the benchmark's default cloud is the simulated one.
cargo build --release --manifest-path "$root/Cargo.toml" -p cloud-route-controller --features lab
cargo build --release --manifest-path "$root/Cargo.toml" -p real-api-bench
# The control-plane binaries are built (or found in the cache) on first use
# by real-api-bench itself, through scripts/build-controlplane.sh.

log "results go to $out"
"$CARGO_TARGET_DIR/release/real-api-bench" \
  --upstream-bin "$upstream" \
  --controller-bin "$CARGO_TARGET_DIR/release/cloud-route-controller" \
  --out-dir "$out" \
  "$@"
log "wrote $out/results.md and $out/results.json"
