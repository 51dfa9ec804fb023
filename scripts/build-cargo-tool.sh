#!/usr/bin/env bash
# Installs one pinned tool from crates.io with `cargo install --locked` into a
# per-machine cache (like scripts/build-gotool.sh for the Go tools), so the
# compile happens once per machine.
#   scripts/build-cargo-tool.sh cargo-deny   # licences, bans, sources (deny.toml)
# The version is pinned here, not taken from the newest release, so every
# machine checks with the same rules. Prints the path of the binary on its
# last line of stdout; cargo's own progress goes to stderr.
set -euo pipefail

name=${1:-}
case "$name" in
  # 0.20 has no optional features left to drop; it is the whole tool.
  cargo-deny) version=0.20.2 ;;
  *) echo "usage: $0 cargo-deny (got '${name}')" >&2; exit 2 ;;
esac
cache_root=${CRC_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cloud-route-controller}
out="$cache_root/tools/$name-$version"

log() { printf '[%s %s] %s\n' "$name" "$(date +%H:%M:%S)" "$*" >&2; }

if [[ -x "$out/bin/$name" ]]; then
  log "reusing $out/bin/$name"
  echo "$out/bin/$name"
  exit 0
fi

# One install per machine at a time: `make test` starts one in the
# background, and a test run alone may ask for the tool meanwhile; the
# second waits for the first and reuses what it installed.
mkdir -p "$cache_root/tools"
exec 9>"$out.lock"
if ! flock -n 9; then
  log "waiting for another install of $name $version to finish"
  flock 9
fi
if [[ -x "$out/bin/$name" ]]; then
  log "reusing $out/bin/$name"
  echo "$out/bin/$name"
  exit 0
fi

# The workspace's build settings must not leak into this one: a shared
# CARGO_TARGET_DIR would hold the workspace build's lock for the whole
# install, and RUSTC_WORKSPACE_WRAPPER would run clippy, warnings denied, on
# the tool's own code.
unset CARGO_TARGET_DIR RUSTC_WORKSPACE_WRAPPER CLIPPY_ARGS RUSTC_WRAPPER
# The tool's release profile asks for fat LTO and one codegen unit: measured
# here, 4 min 30 s of CPU against 3 min 57 s without, and a long
# single-threaded last step, for a program that runs for about 1.5 s per
# `make test`. cargo's config (these variables) overrides the package's.
export CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16

tmp="$out.partial.$$"
trap 'rm -rf "$tmp"' EXIT
start=$SECONDS
log "installing $name $version from crates.io (once per machine; a few minutes on 2 cores)"
# cargo's own progress, prefixed, since it interleaves with the workspace
# build's in `make test`.
cargo install --locked "$name" --version "$version" --root "$tmp" --target-dir "$tmp/target" 2>&1 \
  | sed -u "s/^/[$name] /" >&2
rm -rf "$tmp/target" "$out"
mv "$tmp" "$out"
trap - EXIT
log "installed in $((SECONDS - start))s into $out"
echo "$out/bin/$name"
