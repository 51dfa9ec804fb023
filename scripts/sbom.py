#!/usr/bin/env python3
"""A CycloneDX 1.5 JSON SBOM of one binary crate's release build.

    scripts/sbom.py --package cloud-route-controller --target x86_64-unknown-linux-gnu --output FILE

`scripts/image.sh` (`make image`) writes it beside the image and into it.
The components are what `cargo tree -e normal` lists for the package on the
target with its default features: cargo's own resolver decides, as it does
for `cargo build --release -p PACKAGE`, which crates and features are in, so
dev-dependencies (test servers, proptest, criterion) and build-dependencies
(cc, cmake) are out, and so are crates of other platforms. Each component
has its name, version, purl (`pkg:cargo/NAME@VERSION` for crates.io), SPDX
licence expression and the crates.io SHA-256 from Cargo.lock; the
dependency graph is in `dependencies`.

The output is reproducible (no timestamp unless SOURCE_DATE_EPOCH is set;
the serial number is derived from the content), so its digest in the
image's labels changes only when the dependencies do.
"""

import argparse
import datetime
import hashlib
import json
import os
import re
import subprocess
import sys
import tomllib
import uuid

# One line of `cargo tree --prefix depth --format '{p}\t{l}'`:
# "3serde_derive v1.0.229 (proc-macro)\tMIT OR Apache-2.0 (*)"
LINE = re.compile(
    r"^(?P<depth>\d+)(?P<name>[^ ]+) v(?P<version>[^ \t]+)"
    r"(?P<extra>[^\t]*)\t(?P<licence>.*?)(?P<seen> \(\*\))?$"
)


def spdx(expr):
    """Old crates write "MIT/Apache-2.0"; cargo and SPDX read that as OR."""
    expr = expr.strip()
    return re.sub(r"\s*/\s*", " OR ", expr) if expr else ""


def cargo_tree(root, package, target):
    cmd = [
        "cargo", "tree", "--locked", "-p", package, "-e", "normal",
        "--target", target, "--prefix", "depth", "--format", "{p}\t{l}",
        "--charset", "ascii", "--color", "never",
    ]
    out = subprocess.run(cmd, cwd=root, check=True, capture_output=True, text=True)
    return out.stdout.splitlines()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--package", required=True)
    ap.add_argument("--target", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("--root", default=os.path.join(os.path.dirname(__file__), ".."))
    args = ap.parse_args()
    root = os.path.abspath(args.root)

    with open(os.path.join(root, "Cargo.lock"), "rb") as f:
        lock = tomllib.load(f)
    locked = {(p["name"], p["version"]): p for p in lock["package"]}

    nodes = {}  # (name, version) -> component
    edges = {}  # (name, version) -> set of (name, version)
    parents = []  # the last key seen at each depth
    for line in cargo_tree(root, args.package, args.target):
        if not line.strip():
            continue
        m = LINE.match(line)
        if not m:
            sys.exit(f"sbom.py: cannot read this line of cargo tree: {line!r}")
        depth = int(m["depth"])
        key = (m["name"], m["version"])
        del parents[depth:]
        if depth > 0:
            edges.setdefault(parents[depth - 1], set()).add(key)
        parents.append(key)
        edges.setdefault(key, set())
        if key in nodes:
            continue
        entry = locked.get(key)
        if entry is None:
            sys.exit(f"sbom.py: {key[0]} {key[1]} is in cargo tree but not in Cargo.lock")
        source = entry.get("source", "")
        c = {"type": "library", "name": key[0], "version": key[1], "scope": "required"}
        if source.startswith("registry+https://github.com/rust-lang/crates.io-index"):
            c["purl"] = f"pkg:cargo/{key[0]}@{key[1]}"
            c["bom-ref"] = c["purl"]
        elif source:
            sys.exit(f"sbom.py: {key[0]} {key[1]} comes from {source}, not crates.io or a path")
        else:
            # A crate of this workspace: no registry, so no purl and no checksum.
            c["bom-ref"] = f"{args.package}:{key[0]}@{key[1]}"
        licence = spdx(m["licence"])
        if licence:
            c["licenses"] = [{"expression": licence}]
        if entry.get("checksum"):
            c["hashes"] = [{"alg": "SHA-256", "content": entry["checksum"]}]
        if "(proc-macro)" in m["extra"]:
            # Runs in the compiler; none of its code is in the binary.
            c["properties"] = [{"name": "cargo:target-kind", "value": "proc-macro"}]
        nodes[key] = c

    if not nodes:
        sys.exit(f"sbom.py: cargo tree listed nothing for {args.package}")
    root_key = next(iter(nodes))
    top = dict(nodes.pop(root_key))
    top["type"] = "application"
    top.pop("scope", None)
    ref = {k: c["bom-ref"] for k, c in nodes.items()}
    ref[root_key] = top["bom-ref"]

    cargo_version = subprocess.run(
        ["cargo", "--version"], check=True, capture_output=True, text=True
    ).stdout.split()[1]
    metadata = {
        "tools": {"components": [{"type": "application", "name": "cargo", "version": cargo_version}]},
        "component": top,
        "properties": [{"name": "cargo:target", "value": args.target}],
    }
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    if epoch:
        ts = datetime.datetime.fromtimestamp(int(epoch), datetime.timezone.utc)
        metadata["timestamp"] = ts.strftime("%Y-%m-%dT%H:%M:%SZ")
    components = sorted(nodes.values(), key=lambda c: (c["name"], c["version"]))
    dependencies = sorted(
        (
            {"ref": ref[k], "dependsOn": sorted(ref[d] for d in deps)}
            for k, deps in edges.items()
        ),
        key=lambda d: d["ref"],
    )
    bom = {
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        "version": 1,
        "metadata": metadata,
        "components": components,
        "dependencies": dependencies,
    }
    body = json.dumps(bom, sort_keys=True).encode()
    serial = uuid.UUID(bytes=hashlib.sha256(body).digest()[:16], version=5)
    bom = {"bomFormat": "CycloneDX", "specVersion": "1.5", "serialNumber": f"urn:uuid:{serial}", **bom}
    with open(args.output, "w") as f:
        json.dump(bom, f, indent=1)
        f.write("\n")
    print(f"{args.output}: {len(components)} components", file=sys.stderr)


if __name__ == "__main__":
    main()
