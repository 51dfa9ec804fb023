#!/usr/bin/env bash
# Builds the upstream route-controller baseline (this directory's Go module)
# into a per-machine cache. The cache key hashes go.sum together with go.mod
# and the non-test Go sources, so dependency and code changes both rebuild.
# Prints the binary's path on its last line of stdout; progress goes to stderr.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cache_root=${CRC_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cloud-route-controller}
key=$(cd "$here" && { cat go.sum go.mod; find . -name '*.go' ! -name '*_test.go' -print0 | sort -z | xargs -0 cat; } | sha256sum | cut -c1-12)
out="$cache_root/bench/upstream-$key"
bin="$out/upstream-route-controller"

log() { printf '[upstream-baseline %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

if [[ -x "$bin" ]]; then
  log "reusing $bin"
  echo "$bin"
  exit 0
fi

export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-mod=readonly
start=$SECONDS
tmp="$out.partial.$$"
mkdir -p "$tmp"
( while sleep 60; do log "  still building ($((SECONDS - start))s elapsed)"; done ) &
hb=$!
trap 'kill $hb 2>/dev/null || true; rm -rf "$tmp"' EXIT

log "step: download Go modules"
(cd "$here" && go mod download)
log "step: build upstream-route-controller (first build on 2 cores takes about 5 minutes; later builds reuse the Go cache)"
(cd "$here" && go build -trimpath -ldflags "-s -w" -o "$tmp/upstream-route-controller" .)
rm -rf "$out"
mv "$tmp" "$out"
log "built in $((SECONDS - start))s: $bin"
echo "$bin"
