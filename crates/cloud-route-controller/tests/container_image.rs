//! The container image of `scripts/image.sh` (`make image`): built offline
//! with podman from the binary the tests run, its config says non-root,
//! entrypoint the binary, version and source labels; unpacked, its root
//! holds no shell and nothing but the binary, its libraries, the CA bundle
//! and user/NSS files; and the binary runs from that root (chroot, as user
//! 65532, everything read-only) with `--version` and a `plan` against the
//! local control plane. The SBOM it writes beside the image is the one in
//! the image and in its labels, and lists the release build's crates as
//! Cargo.lock pins them, without the test-only ones.
//!
//! Needs podman (`apt-get install -y podman`; `scripts/test.sh` installs it
//! when missing) and root for chroot. `podman run` does not work in the
//! project's VMs (crun fails on rlimits and cgroups), so the image is
//! unpacked and run with chroot instead.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{TempDir, run};
use serde_json::Value;
use test_cluster::{TestCluster, TestNode};

const ENTRYPOINT: &str = "/usr/local/bin/cloud-route-controller";
const SBOM_IN_IMAGE: &str = "/usr/share/doc/cloud-route-controller/sbom.cdx.json";
const SBOM_LABEL: &str = "io.github.cloud-route-controller.sbom";

/// `[workspace.package] repository` of the root Cargo.toml.
fn workspace_repository() -> String {
    let text = std::fs::read_to_string(common::repo().join("Cargo.toml")).expect("Cargo.toml");
    let t: toml::Table = text.parse().expect("Cargo.toml is TOML");
    t["workspace"]["package"]["repository"]
        .as_str()
        .expect("a workspace repository")
        .to_string()
}

/// Whether to run: podman must be there unless the run says loudly why not.
fn podman_available() -> bool {
    let found = Command::new("podman")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if found {
        return true;
    }
    match std::env::var("CRC_SKIP_IMAGE_TEST") {
        Ok(why) if !why.is_empty() => {
            eprintln!(
                "\n!!!!!!!! SKIPPED: the container image test ({why}) !!!!!!!!\n\
                 !!!!!!!! install podman (apt-get update && apt-get install -y podman) to run it !!!!!!!!\n"
            );
            false
        }
        _ => panic!(
            "podman is not installed: apt-get update && apt-get install -y podman \
             (scripts/test.sh does this), or set CRC_SKIP_IMAGE_TEST=<reason> to skip this test"
        ),
    }
}

/// podman on a private vfs store under `dir`, removed with it (the same
/// layout as `scripts/image.sh --podman-root`; podman refuses a runroot
/// longer than 50 characters, hence the short names).
fn podman(dir: &Path) -> Command {
    let mut cmd = Command::new("podman");
    cmd.arg("--root")
        .arg(dir.join("root"))
        .arg("--runroot")
        .arg(dir.join("rr"))
        .args(["--storage-driver", "vfs"]);
    cmd
}

fn blob(oci: &Path, digest: &str) -> PathBuf {
    let hex = digest
        .strip_prefix("sha256:")
        .unwrap_or_else(|| panic!("not a sha256 digest: {digest}"));
    oci.join("blobs/sha256").join(hex)
}

fn json_file(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path:?}: {e}"))
}

/// Every file and symlink under `root`, as absolute paths inside it.
fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
    for e in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{dir:?}: {e}")) {
        let e = e.expect("dir entry");
        let path = e.path();
        let ty = e.file_type().expect("file type");
        if ty.is_dir() {
            walk(root, &path, out);
        } else {
            let rel = path.strip_prefix(root).expect("under root");
            out.push(format!("/{}", rel.display()));
        }
    }
}

/// Runs the image's entrypoint from the unpacked root as the image's user.
fn chroot(rootfs: &Path, user: &str, args: &[&str]) -> std::process::Output {
    Command::new("chroot")
        .arg(format!("--userspec={user}"))
        .arg(rootfs)
        .arg(ENTRYPOINT)
        .args(args)
        .env_clear()
        // For finding chroot itself; the root it enters has no other programs.
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("SSL_CERT_FILE", "/etc/ssl/certs/ca-certificates.crt")
        .output()
        .expect("run chroot")
}

fn sha256_hex(path: &Path) -> String {
    run(Command::new("sha256sum").arg(path))
        .split_whitespace()
        .next()
        .expect("sha256sum prints a digest")
        .to_string()
}

/// Cargo.lock's packages as (name, version) -> checksum (None for the
/// workspace's own crates).
fn cargo_lock() -> std::collections::BTreeMap<(String, String), Option<String>> {
    let text = std::fs::read_to_string(common::repo().join("Cargo.lock")).expect("Cargo.lock");
    let lock: toml::Table = text.parse().expect("Cargo.lock is TOML");
    lock["package"]
        .as_array()
        .expect("packages")
        .iter()
        .map(|p| {
            let s = |k: &str| p.get(k).and_then(|v| v.as_str()).map(str::to_string);
            (
                (s("name").expect("name"), s("version").expect("version")),
                s("checksum"),
            )
        })
        .collect()
}

/// Checks an SBOM written by `scripts/sbom.py` against Cargo.lock: every
/// component is a locked crate with its checksum, the release build's own
/// dependencies are there, and crates that only tests or build scripts use
/// are not.
fn check_sbom(sbom: &Value) {
    assert_eq!(sbom["bomFormat"], "CycloneDX");
    assert_eq!(sbom["specVersion"], "1.5");
    assert_eq!(
        sbom["metadata"]["component"]["name"],
        "cloud-route-controller"
    );
    assert_eq!(
        sbom["metadata"]["component"]["version"],
        env!("CARGO_PKG_VERSION")
    );
    let lock = cargo_lock();
    let components = sbom["components"].as_array().expect("components");
    let mut names = std::collections::BTreeSet::new();
    for c in components {
        let name = c["name"].as_str().expect("a name");
        let version = c["version"].as_str().expect("a version");
        names.insert(name.to_string());
        let checksum = lock
            .get(&(name.to_string(), version.to_string()))
            .unwrap_or_else(|| panic!("{name} {version} is not in Cargo.lock"));
        assert!(
            c["licenses"][0]["expression"]
                .as_str()
                .is_some_and(|l| !l.is_empty()),
            "no licence for {name} {version}: {c}"
        );
        match checksum {
            Some(sum) => {
                assert_eq!(c["purl"], format!("pkg:cargo/{name}@{version}"), "{c}");
                assert_eq!(c["hashes"][0]["alg"], "SHA-256", "{c}");
                assert_eq!(
                    c["hashes"][0]["content"].as_str(),
                    Some(sum.as_str()),
                    "{c}"
                );
            }
            None => assert!(c.get("purl").is_none(), "a workspace crate has a purl: {c}"),
        }
    }
    // What the binary is made of, at the versions Cargo.lock pins.
    for name in [
        "tokio",
        "kube",
        "k8s-openapi",
        "rustls",
        "aws-sdk-ec2",
        "mimalloc",
    ] {
        let locked: Vec<&String> = lock
            .keys()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| v)
            .collect();
        let listed: Vec<&str> = components
            .iter()
            .filter(|c| c["name"] == name)
            .filter_map(|c| c["version"].as_str())
            .collect();
        assert_eq!(
            listed,
            locked.iter().map(|v| v.as_str()).collect::<Vec<_>>(),
            "{name}: the SBOM's versions are not Cargo.lock's"
        );
    }
    for name in ["route-core", "route-controller", "provider-aws"] {
        assert!(names.contains(name), "{name} is missing from the SBOM");
    }
    // Test-only (dev-dependencies, the providers' `testing` feature) and
    // build-only crates: each is in Cargo.lock, so its absence here means
    // something.
    for name in [
        "proptest",
        "criterion",
        "test-cluster",
        "test-server",
        "cc",
        "cmake",
    ] {
        assert!(
            lock.keys().any(|(n, _)| n == name),
            "{name} is no longer in Cargo.lock; pick another test-only crate"
        );
        assert!(
            !names.contains(name),
            "the SBOM lists {name}, which does not ship"
        );
    }
    let deps = sbom["dependencies"].as_array().expect("dependencies");
    assert_eq!(
        deps.len(),
        components.len() + 1,
        "one entry per component and the root"
    );
}

#[test]
fn the_sbom_lists_the_release_builds_crates_at_their_locked_versions_and_no_test_only_crate() {
    let dir = TempDir::new("sbom");
    let out = dir.path().join("sbom.cdx.json");
    let host = run(Command::new("rustc").arg("-vV"))
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_string))
        .expect("rustc -vV names the host");
    run(Command::new("python3")
        .arg(common::repo().join("scripts/sbom.py"))
        .args([
            "--package",
            "cloud-route-controller",
            "--target",
            &host,
            "--output",
        ])
        .arg(&out));
    check_sbom(&json_file(&out));
}

#[tokio::test]
async fn the_image_is_non_root_shell_free_labelled_and_its_binary_runs_from_the_unpacked_root() {
    if !podman_available() {
        return;
    }
    let dir = TempDir::new("image");
    let store = dir.path().to_path_buf();
    let tag = format!(
        "localhost/cloud-route-controller-test:{}",
        std::process::id()
    );
    let binary = common::binary();
    let sbom = dir.path().join("sbom.cdx.json");

    // 1. Build it as `make image` does, from the binary the tests use.
    let out = run(Command::new(common::repo().join("scripts/image.sh"))
        .arg("--binary")
        .arg(&binary)
        .args(["--tag", &tag])
        .arg("--podman-root")
        .arg(&store)
        .arg("--sbom")
        .arg(&sbom));
    assert_eq!(out.lines().last(), Some(tag.as_str()), "{out}");
    check_sbom(&json_file(&sbom));

    // 2. Its config, as podman reports it.
    let inspect: Value =
        serde_json::from_str(&run(podman(&store).args(["image", "inspect", &tag])))
            .expect("podman image inspect is JSON");
    let config = &inspect[0]["Config"];
    assert_eq!(config["User"], "65532:65532", "{config}");
    assert_eq!(config["Entrypoint"], serde_json::json!([ENTRYPOINT]));
    let labels = &config["Labels"];
    assert_eq!(
        labels["org.opencontainers.image.version"],
        env!("CARGO_PKG_VERSION")
    );
    assert_eq!(
        labels["org.opencontainers.image.source"].as_str(),
        Some(workspace_repository().as_str())
    );
    assert_eq!(labels[format!("{SBOM_LABEL}.path")], SBOM_IN_IMAGE);
    assert_eq!(
        labels[format!("{SBOM_LABEL}.sha256")].as_str(),
        Some(sha256_hex(&sbom).as_str()),
        "the label's digest is not the SBOM's written beside the image"
    );

    // 3. Unpack it from a `podman save` OCI layout: the config there says
    //    the same, and the layers make the root filesystem.
    let oci = dir.path().join("oci");
    run(podman(&store)
        .args(["save", "--format", "oci-dir", "-o"])
        .arg(&oci)
        .arg(&tag));
    let index = json_file(&oci.join("index.json"));
    let manifest = json_file(&blob(
        &oci,
        index["manifests"][0]["digest"]
            .as_str()
            .expect("a manifest"),
    ));
    let image_config = json_file(&blob(
        &oci,
        manifest["config"]["digest"].as_str().expect("a config"),
    ));
    assert_eq!(image_config["config"]["User"], "65532:65532");
    assert_eq!(
        image_config["config"]["Entrypoint"],
        serde_json::json!([ENTRYPOINT])
    );
    let rootfs = dir.path().join("rootfs");
    std::fs::create_dir_all(&rootfs).expect("mkdir rootfs");
    let layers = manifest["layers"].as_array().expect("layers");
    assert!(!layers.is_empty());
    for layer in layers {
        let digest = layer["digest"].as_str().expect("layer digest");
        run(Command::new("tar")
            .arg("-xf")
            .arg(blob(&oci, digest))
            .arg("-C")
            .arg(&rootfs));
    }

    // 4. No shell, nothing but what the binary needs.
    let mut files = Vec::new();
    walk(&rootfs, &rootfs, &mut files);
    for f in &files {
        let name = f.rsplit('/').next().unwrap_or("");
        assert!(
            !["sh", "bash", "dash", "ash", "busybox", "env"].contains(&name),
            "the image has a shell or launcher: {f}"
        );
        let allowed = f == ENTRYPOINT
            || f.starts_with("/lib")
            || f.starts_with("/usr/lib")
            || [
                "/etc/ssl/certs/ca-certificates.crt",
                "/etc/passwd",
                "/etc/group",
                "/etc/nsswitch.conf",
                SBOM_IN_IMAGE,
            ]
            .contains(&f.as_str());
        assert!(allowed, "unexpected file in the image: {f}\nall: {files:?}");
    }
    assert_eq!(
        std::fs::read(rootfs.join(&ENTRYPOINT[1..])).expect("the binary"),
        std::fs::read(&binary).expect("the built binary"),
        "the image's binary is not the one it was built from"
    );
    assert!(
        files.iter().any(|f| f.contains("libc.so")),
        "no libc: {files:?}"
    );
    assert_eq!(
        std::fs::read(rootfs.join(&SBOM_IN_IMAGE[1..])).expect("the SBOM in the image"),
        std::fs::read(&sbom).expect("the SBOM beside the image"),
        "the image's SBOM is not the one written beside it"
    );

    // 5. A kubeconfig for the local control plane inside the root, then all
    //    of it read-only to the image's user: the binary must not need to
    //    write anywhere (readOnlyRootFilesystem).
    let c = TestCluster::acquire()
        .await
        .expect("the local control plane");
    std::fs::copy(c.kubeconfig_path(), rootfs.join("etc/kubeconfig")).expect("copy kubeconfig");
    run(Command::new("chmod").args(["-R", "a+rX,a-w"]).arg(&rootfs));

    let out = chroot(&rootfs, "65532:65532", &["--version"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains(env!("CARGO_PKG_VERSION")),
        "--version from the image: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );

    c.create_node(
        &TestNode::new("image-0")
            .pod_cidrs(["10.244.77.0/24"])
            .internal_ip("10.0.77.10"),
    )
    .await
    .expect("create Node");
    let out = chroot(
        &rootfs,
        "65532:65532",
        &[
            "plan",
            "--kubeconfig",
            "/etc/kubeconfig",
            "--cluster-cidr",
            "10.244.0.0/16",
            "--cloud-provider",
            "memory",
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "plan from the image failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.lines().any(|l| l.contains("10.244.77.0/24")
            && l.contains("image-0")
            && l.contains("Missing")),
        "plan from the image does not list the Node's missing route:\n{stdout}"
    );

    // The store is private; drop the image so the temporary directory goes.
    let _ = podman(&store).args(["rmi", "--force", &tag]).output();
    let _ = Command::new("chmod")
        .args(["-R", "u+w"])
        .arg(dir.path())
        .output();
}

#[test]
fn the_containerfile_builds_the_same_image_as_the_offline_path() {
    // The Containerfile cannot be built here (no base image can be pulled),
    // so what it promises is checked against what scripts/image.sh makes.
    let text =
        std::fs::read_to_string(common::repo().join("Containerfile")).expect("Containerfile");
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .collect();
    let has = |l: &str| lines.contains(&l);
    assert!(
        has(&format!("ARG VERSION={}", env!("CARGO_PKG_VERSION"))),
        "Containerfile's VERSION is not the workspace version"
    );
    assert!(has("USER 65532:65532"));
    assert!(has(&format!("ENTRYPOINT [\"{ENTRYPOINT}\"]")));
    assert!(has("ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"));
    assert!(
        text.contains(&format!(
            "org.opencontainers.image.source=\"{}\"",
            workspace_repository()
        )),
        "the source label is not the workspace repository"
    );
    assert!(text.contains("org.opencontainers.image.version=\"${VERSION}\""));
    // Two stages: a build stage, and a runtime without a shell.
    let froms: Vec<&&str> = lines.iter().filter(|l| l.starts_with("FROM ")).collect();
    assert_eq!(froms.len(), 2, "{froms:?}");
    assert!(has(
        "ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian12:nonroot"
    ));
    assert!(text.contains("cargo build --release --locked -p cloud-route-controller"));
}
