#!/usr/bin/env bash
# Builds one unmodified Go tool the tests need from its Go module, pinned in
# tools/<name>/go.mod and go.sum, into a per-machine cache keyed by the
# tool's version and the hash of go.sum (like scripts/build-controlplane.sh),
# so the build happens once per machine.
#   scripts/build-gotool.sh helm      # helm.sh/helm/v3/cmd/helm
#   scripts/build-gotool.sh promtool  # github.com/prometheus/prometheus/cmd/promtool
#   scripts/build-gotool.sh azure-wire-check  # the project's own tools/azure-wire-check
#     (a local module on the official Azure SDK for Go; its cache key also
#     covers go.mod and the sources, since they are not pinned elsewhere)
# Prints the path of the binary on its last line of stdout.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
name=${1:-}
case "$name" in
  helm) module=helm.sh/helm/v3 ;;
  promtool) module=github.com/prometheus/prometheus ;;
  azure-wire-check) module="" ;;
  *) echo "usage: $0 helm|promtool|azure-wire-check (got '${name}')" >&2; exit 2 ;;
esac
mod="$root/tools/$name"
modver() { awk -v m="$1" '$1==m && $2 ~ /^v/ {print $2; exit}' "$mod/go.mod"; }
if [[ -n "$module" ]]; then
  version=$(modver "$module")
  if [[ -z "$version" ]]; then
    echo "cannot read the version of $module from $mod/go.mod" >&2
    exit 1
  fi
  sum_hash=$(sha256sum "$mod/go.sum" | cut -c1-12)
else
  version=local
  sum_hash=$(cd "$mod" && cat go.mod go.sum ./*.go | sha256sum | cut -c1-12)
fi
cache_root=${CRC_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cloud-route-controller}
out="$cache_root/tools/$name-$version-$sum_hash"

log() { printf '[%s %s] %s\n' "$name" "$(date +%H:%M:%S)" "$*" >&2; }

if [[ -x "$out/$name" ]]; then
  log "reusing $out/$name"
  echo "$out/$name"
  exit 0
fi

# One build per machine at a time: `make test` starts one in the
# background, and a test may ask for the tool meanwhile; the second waits
# for the first and reuses what it built.
mkdir -p "$cache_root/tools"
exec 9>"$out.lock"
if ! flock -n 9; then
  log "waiting for another build of $name $version to finish"
  flock 9
fi
if [[ -x "$out/$name" ]]; then
  log "reusing $out/$name"
  echo "$out/$name"
  exit 0
fi

export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-mod=readonly
case "$name" in
  helm)
    # The same version stamps helm's own Makefile sets: the version and the
    # Kubernetes version `helm template` and `helm lint` assume.
    k8s=$(awk '$1=="k8s.io/client-go" && $2 ~ /^v/ {print $2; exit}' "$mod/go.mod")
    k8s=${k8s#v}; k8s_major=$(( ${k8s%%.*} + 1 )); k8s_minor=$(cut -d. -f2 <<<"$k8s")
    pkg=helm.sh/helm/v3/cmd/helm
    ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$version \
 -X helm.sh/helm/v3/internal/version.gitTreeState=clean \
 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=$k8s_major \
 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$k8s_minor \
 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=$k8s_major \
 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$k8s_minor"
    ;;
  promtool)
    pkg=github.com/prometheus/prometheus/cmd/promtool
    ldflags="-s -w -X github.com/prometheus/common/version.Version=$version \
 -X github.com/prometheus/common/version.Branch=release"
    ;;
  azure-wire-check)
    pkg=.
    ldflags="-s -w"
    ;;
esac

tmp="$out.partial.$$"
mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT
start=$SECONDS
label=$pkg; [[ $pkg == . ]] && label="tools/$name"
log "building $label $version (once per machine; a few minutes on 2 cores)"
# A heartbeat so a long compile is never silent.
( while sleep 60; do log "  still building ($((SECONDS - start))s elapsed)"; done ) &
hb=$!
trap 'kill $hb 2>/dev/null || true; rm -rf "$tmp"' EXIT
(cd "$mod" && go mod download && go build -trimpath -ldflags "$ldflags" -o "$tmp/$name" "$pkg")
kill $hb 2>/dev/null || true
rm -rf "$out"
mv "$tmp" "$out"
trap - EXIT
log "built in $((SECONDS - start))s into $out"
echo "$out/$name"
