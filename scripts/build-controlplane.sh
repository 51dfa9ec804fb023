#!/usr/bin/env bash
# Builds unmodified kube-apiserver, kubectl and etcd from their Go modules
# (tools/controlplane/go.mod) into a per-machine cache keyed by versions and
# by the hash of go.sum, so the long first build happens once per machine.
# Prints the directory holding the binaries on its last line of stdout.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
mod="$root/tools/controlplane"
# Only the `require` lines carry a version; the `tool` block names the same
# module path without one, so match on the second field as well.
modver() { awk -v m="$1" '$1==m && $2 ~ /^v/ {print $2; exit}' "$mod/go.mod"; }
k8s_version=$(modver k8s.io/kubernetes)
etcd_version=$(modver go.etcd.io/etcd/server/v3)
if [[ -z "$k8s_version" || -z "$etcd_version" ]]; then
  echo "cannot read k8s.io/kubernetes or etcd server version from $mod/go.mod" >&2
  exit 1
fi
sum_hash=$(sha256sum "$mod/go.sum" | cut -c1-12)
cache_root=${CRC_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cloud-route-controller}
out="$cache_root/controlplane/k8s-$k8s_version-etcd-$etcd_version-$sum_hash"

log() { printf '[controlplane %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

if [[ -x "$out/kube-apiserver" && -x "$out/etcd" && -x "$out/kubectl" ]]; then
  log "reusing $out"
  echo "$out"
  exit 0
fi

export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-mod=readonly
minor=${k8s_version#v1.}; minor=${minor%%.*}
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$k8s_version \
 -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor \
 -X k8s.io/component-base/version.gitTreeState=clean"
tmp="$out.partial.$$"
mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT
start=$SECONDS
step() {
  local name=$1; shift
  log "step: $name (first build on 2 cores takes 10-25 minutes; later builds reuse the Go cache)"
  local t=$SECONDS
  # A heartbeat so a long compile is never silent.
  ( while sleep 60; do log "  still building $name ($((SECONDS - start))s elapsed in total)"; done ) &
  local hb=$!
  if ! (cd "$mod" && "$@"); then kill $hb 2>/dev/null; log "FAILED: $name"; exit 1; fi
  kill $hb 2>/dev/null || true
  log "  done: $name in $((SECONDS - t))s"
}
step "download Go modules" go mod download
step "etcd $etcd_version" go build -trimpath -ldflags "-s -w" -o "$tmp/etcd" go.etcd.io/etcd/server/v3
step "kube-apiserver $k8s_version" go build -trimpath -ldflags "$ldflags" -o "$tmp/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver
step "kubectl $k8s_version" go build -trimpath -ldflags "$ldflags" -o "$tmp/kubectl" k8s.io/kubernetes/cmd/kubectl
rm -rf "$out"
mv "$tmp" "$out"
trap - EXIT
log "built in $((SECONDS - start))s into $out"
echo "$out"
