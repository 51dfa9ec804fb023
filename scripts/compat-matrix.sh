#!/usr/bin/env bash
# The compatibility matrix of docs/compatibility.md (`make compat`): the
# end-to-end route tests against the oldest, a middle and the newest
# Kubernetes minor the page claims, each on an unmodified kube-apiserver built
# from its Go modules. The newest is the control plane `make test` uses
# (tools/controlplane); an older one gets a module of its own under the cache
# (its go.mod made here from k8s.io/kubernetes's own, its staging modules at
# the matching v0 version) and shares that control plane's etcd. Builds are
# cached per machine; the first build of each older version takes 10-25
# minutes on 2 cores, the tests about 5 minutes per version.
#
#   scripts/compat-matrix.sh [--write] [--build-only] [VERSION ...]
#
# VERSION is a k8s.io/kubernetes tag (default: the three of the page).
# --write puts the result table into docs/compatibility.md between its
# `<!-- matrix:begin -->` and `<!-- matrix:end -->` lines.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/cloud-route-controller/target}
export GOTOOLCHAIN=local CGO_ENABLED=0
cache=${CRC_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cloud-route-controller}
log() { printf '[compat %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

write=0
build_only=0
versions=()
for a in "$@"; do
  case $a in
    --write) write=1 ;;
    --build-only) build_only=1 ;;
    v1.*) versions+=("$a") ;;
    *) echo "usage: $0 [--write] [--build-only] [v1.MINOR.PATCH ...]" >&2; exit 2 ;;
  esac
done
[[ ${#versions[@]} -gt 0 ]] || versions=(v1.33.13 v1.35.4 v1.37.2)

# The end-to-end route tests on the real API server: every cloud's
# emulator or fake, the election, `plan`. Each starts a control plane of its
# own from CRC_CONTROLPLANE_BIN_DIR.
targets=(e2e_hcloud e2e_aws e2e_gce e2e_azure e2e_openstack leader_election plan_command)

log "the newest control plane (tools/controlplane), whose etcd every version shares"
main_dir=$(scripts/build-controlplane.sh | tail -n 1)
main_version=$(awk '$1=="k8s.io/kubernetes" && $2 ~ /^v/ {print $2; exit}' tools/controlplane/go.mod)

# Builds kube-apiserver and kubectl of $1 into a directory beside etcd; prints it.
build_version() {
  local v=$1 minor patch dir mod
  if [[ $v == "$main_version" ]]; then echo "$main_dir"; return; fi
  minor=${v#v1.}; minor=${minor%%.*}; patch=${v##*.}
  dir="$cache/controlplane/compat-k8s-$v"
  if [[ -x "$dir/kube-apiserver" && -x "$dir/kubectl" && -x "$dir/etcd" ]]; then
    log "reusing $dir"; echo "$dir"; return
  fi
  mod="$cache/compat/k8s-$v"
  mkdir -p "$mod"
  log "$v: its module ($mod), staging modules at v0.$minor.$patch"
  local upstream_mod
  upstream_mod=$(curl -fsSL "${GOPROXY_URL:-https://proxy.golang.org}/k8s.io/kubernetes/@v/$v.mod")
  {
    echo "module github.com/cloud-route-controller/cloud-route-controller/tools/controlplane-$v"
    echo
    echo "go 1.26.0"
    echo
    echo "replace ("
    # k8s.io/kubernetes points its staging modules at ./staging; a module
    # that requires it must name their published versions itself.
    sed -n 's|^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*|\1|p' <<<"$upstream_mod" \
      | sort -u | while read -r m; do echo "	$m => $m v0.$minor.$patch"; done
    echo ")"
    echo
    echo "require k8s.io/kubernetes $v"
    echo
    echo "tool ("
    echo "	k8s.io/kubernetes/cmd/kube-apiserver"
    echo "	k8s.io/kubernetes/cmd/kubectl"
    echo ")"
  } >"$mod/go.mod"
  local t=$SECONDS
  ( while sleep 60; do log "  still preparing or building $v ($((SECONDS - t))s)"; done ) &
  local hb=$!
  local ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$v \
 -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor \
 -X k8s.io/component-base/version.gitTreeState=clean"
  local tmp="$dir.partial.$$"
  mkdir -p "$tmp"
  if ! ( cd "$mod" && go mod tidy >&2 \
      && go build -trimpath -ldflags "$ldflags" -o "$tmp/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver >&2 \
      && go build -trimpath -ldflags "$ldflags" -o "$tmp/kubectl" k8s.io/kubernetes/cmd/kubectl >&2 ); then
    kill $hb 2>/dev/null; rm -rf "$tmp"; log "FAILED: building $v"; return 1
  fi
  kill $hb 2>/dev/null || true
  cp "$main_dir/etcd" "$tmp/etcd"
  rm -rf "$dir"; mv "$tmp" "$dir"
  log "$v built in $((SECONDS - t))s"
  echo "$dir"
}

if [[ $build_only -eq 1 ]]; then
  for v in "${versions[@]}"; do build_version "$v" >/dev/null; done
  exit 0
fi

log "building the test binaries (the lab build, as make test)"
bins=()
for t in "${targets[@]}"; do
  bins+=("$(cargo test --locked --features cloud-route-controller/lab -p cloud-route-controller --test "$t" --no-run --message-format=json \
    | T="$t" python3 -c 'import json, os, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("executable") and m["target"]["name"] == os.environ["T"]:
        print(m["executable"])')")
done

rows=()
status=0
for v in "${versions[@]}"; do
  if ! dir=$(build_version "$v"); then
    rows+=("| $v | not built (see the log) | | | |"); status=1; continue
  fi
  "$dir/kube-apiserver" --version >&2
  passed=0 failed=0 failures=() t=$SECONDS
  for i in "${!targets[@]}"; do
    out=$(mktemp)
    log "$v: tests/${targets[$i]}.rs"
    if ( cd crates/cloud-route-controller \
        && env -u CRC_TEST_KUBECONFIG -u CRC_TEST_ETCD_URL CRC_CONTROLPLANE_BIN_DIR="$dir" \
           "${bins[$i]}" --test-threads 2 ) >"$out" 2>&1; then :; else failures+=("${targets[$i]}"); fi
    p=$(sed -n 's/^test result: .* \([0-9]*\) passed; \([0-9]*\) failed.*/\1 \2/p' "$out" | tail -n 1)
    [[ -n $p ]] || p="0 1"
    passed=$((passed + ${p% *})); failed=$((failed + ${p#* }))
    grep -E '^test .* FAILED$|^failures:$' "$out" >&2 || true
    rm -f "$out"
  done
  [[ ${#failures[@]} -eq 0 ]] || status=1
  rows+=("| $v | $passed | $failed | ${failures[*]:-none} | $(( (SECONDS - t) / 60 )) min |")
done

table=$(printf '%s\n' \
  "| kube-apiserver | tests passed | failed | failing files | took |" \
  "|---|--:|--:|---|--:|" "${rows[@]}")
echo "$table"
if [[ $write -eq 1 ]]; then
  TABLE="$table" DATE=$(date -u +%Y-%m-%d) TARGETS="${targets[*]}" python3 - <<'PY'
import os, pathlib, re
page = pathlib.Path("docs/compatibility.md")
text = page.read_text()
body = (f"Last run {os.environ['DATE']} (`make compat`), tests/{{{', '.join(os.environ['TARGETS'].split())}}}.rs:\n\n"
        + os.environ["TABLE"] + "\n")
new, n = re.subn(r"(<!-- matrix:begin -->\n).*?(<!-- matrix:end -->)", lambda m: m.group(1) + body + m.group(2), text, flags=re.S)
if n != 1:
    raise SystemExit("docs/compatibility.md has no <!-- matrix:begin --> ... <!-- matrix:end --> block")
page.write_text(new)
PY
  log "wrote the table into docs/compatibility.md"
fi
exit $status
