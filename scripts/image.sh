#!/usr/bin/env bash
# `make image`: builds the container image offline, without pulling a base
# image. The root filesystem holds only the controller binary, the shared
# libraries it links (from ldd, with the dynamic loader), the CA bundle, an
# /etc/passwd and /etc/group naming the non-root user 65532,
# /etc/nsswitch.conf and the SBOM; there is no shell. podman assembles it `FROM scratch`
# on the vfs storage driver (no overlay mounts, no container runs).
# The SBOM (CycloneDX JSON, scripts/sbom.py: the release build's crates with
# versions, licences and crates.io checksums) is written beside the image
# (--sbom, default $CARGO_TARGET_DIR/image/cloud-route-controller-v<version>.cdx.json)
# and into it at /usr/share/doc/cloud-route-controller/sbom.cdx.json, and the
# labels io.github.cloud-route-controller.sbom.* carry its path and sha256.
#   scripts/image.sh                      # release build, tag cloud-route-controller:v<version>
#   scripts/image.sh --binary PATH --tag NAME:TAG [--podman-root DIR] [--sbom FILE]
# The Containerfile at the repository root is the same image built the usual
# way (Rust toolchain stage + distroless runtime), for machines that can pull.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/cloud-route-controller/target}

version=$(awk -F'"' '/^version = / {print $2; exit}' Cargo.toml)
source_url=$(awk -F'"' '/^repository = / {print $2; exit}' Cargo.toml)
binary=""
tag="cloud-route-controller:v$version"
sbom="$CARGO_TARGET_DIR/image/cloud-route-controller-v$version.cdx.json"
sbom_in_image=/usr/share/doc/cloud-route-controller/sbom.cdx.json
podman_root=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --binary) binary=${2:?--binary needs a path}; shift 2 ;;
    --tag) tag=${2:?--tag needs NAME:TAG}; shift 2 ;;
    --sbom) sbom=${2:?--sbom needs a file path}; shift 2 ;;
    --podman-root)
      dir=${2:?--podman-root needs a directory}
      # runroot: podman refuses paths longer than 50 characters.
      podman_root=(--root "$dir/root" --runroot "$dir/rr"); shift 2 ;;
    *) echo "usage: $0 [--binary PATH] [--tag NAME:TAG] [--podman-root DIR] [--sbom FILE] (unknown: $1)" >&2; exit 2 ;;
  esac
done
if [[ -z "$version" || -z "$source_url" ]]; then
  echo "cannot read version and repository from Cargo.toml" >&2; exit 1
fi
if ! command -v podman >/dev/null; then
  echo "podman is not installed: apt-get update && apt-get install -y podman" >&2; exit 1
fi
if ! python3 -c 'import tomllib' 2>/dev/null; then
  echo "scripts/sbom.py (the image's SBOM) needs Python 3.11 or newer as python3" >&2; exit 1
fi
ca_bundle=/etc/ssl/certs/ca-certificates.crt
if [[ ! -s "$ca_bundle" ]]; then
  echo "no CA bundle at $ca_bundle: apt-get install -y ca-certificates" >&2; exit 1
fi
if [[ -z "$binary" ]]; then
  echo "Building the release binary (all providers) ..." >&2
  cargo build --release --locked -p cloud-route-controller
  binary=$CARGO_TARGET_DIR/release/cloud-route-controller
fi
if [[ ! -x "$binary" ]]; then
  echo "not an executable: $binary" >&2; exit 1
fi

# The SBOM lists what the release build of this source compiles in (default
# features, this host's target), whichever binary --binary names.
host=$(rustc -vV | sed -n 's/^host: //p')
mkdir -p "$(dirname "$sbom")"
python3 scripts/sbom.py --package cloud-route-controller --target "$host" --output "$sbom"
sbom_sha256=$(sha256sum "$sbom" | cut -d' ' -f1)

ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
rootfs=$ctx/rootfs
mkdir -p "$rootfs/usr/local/bin" "$rootfs/etc/ssl/certs" "$rootfs/tmp"
install -m 0755 "$binary" "$rootfs/usr/local/bin/cloud-route-controller"
# Every library ldd resolves, and the loader, at the paths the binary asks for.
libs=$(ldd "$binary" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}')
if [[ -z "$libs" ]]; then
  echo "ldd found no libraries for $binary (a static binary needs none; check ldd's output):" >&2
  ldd "$binary" >&2 || true
fi
for lib in $libs; do
  mkdir -p "$rootfs$(dirname "$lib")"
  cp -L "$lib" "$rootfs$lib"
done
cp -L "$ca_bundle" "$rootfs/etc/ssl/certs/ca-certificates.crt"
install -D -m 0644 "$sbom" "$rootfs$sbom_in_image"
printf 'root:x:0:0:root:/:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/:/sbin/nologin\n' >"$rootfs/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$rootfs/etc/group"
printf 'hosts: files dns\n' >"$rootfs/etc/nsswitch.conf"
chmod 1777 "$rootfs/tmp"

cat >"$ctx/Containerfile" <<CONTAINERFILE
FROM scratch
COPY rootfs/ /
ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/cloud-route-controller"]
LABEL org.opencontainers.image.title="cloud-route-controller" \\
      org.opencontainers.image.version="$version" \\
      org.opencontainers.image.source="$source_url" \\
      org.opencontainers.image.licenses="Apache-2.0" \\
      org.opencontainers.image.description="A Kubernetes cloud route controller" \\
      io.github.cloud-route-controller.sbom.path="$sbom_in_image" \\
      io.github.cloud-route-controller.sbom.sha256="$sbom_sha256" \\
      io.github.cloud-route-controller.sbom.format="CycloneDX 1.5 JSON"
CONTAINERFILE

echo "Assembling $tag from $binary ($(wc -w <<<"$libs") shared libraries) ..." >&2
podman "${podman_root[@]}" --storage-driver vfs build --quiet --pull=never --network=none \
  --tag "$tag" --file "$ctx/Containerfile" "$ctx" >/dev/null
echo "built $tag; its SBOM: $sbom (sha256 $sbom_sha256, in the image at $sbom_in_image)" >&2
echo "$tag"
