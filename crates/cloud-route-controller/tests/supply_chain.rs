//! What ships is accounted for: `deny.toml` at the repository root, checked
//! with cargo-deny (`cargo deny check licenses bans sources`), passes for
//! the workspace as it is, and fails for a dependency whose licence is not
//! on its allow-list.
//!
//! cargo-deny comes from `CRC_CARGO_DENY` (`scripts/test.sh` sets it), else
//! from `scripts/build-cargo-tool.sh cargo-deny`, which installs it from
//! crates.io into the per-machine cache on first use (minutes, once).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::TempDir;

fn cargo_deny() -> PathBuf {
    if let Ok(path) = std::env::var("CRC_CARGO_DENY")
        && !path.is_empty()
    {
        return PathBuf::from(path);
    }
    let out = Command::new(common::repo().join("scripts/build-cargo-tool.sh"))
        .arg("cargo-deny")
        .output()
        .expect("run scripts/build-cargo-tool.sh cargo-deny");
    assert!(
        out.status.success(),
        "scripts/build-cargo-tool.sh cargo-deny failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .expect("the script prints the binary's path")
        .to_string();
    PathBuf::from(path)
}

/// `cargo deny check <checks>` on `manifest` with the repository's deny.toml.
fn check(manifest: &Path, extra: &[&str], checks: &[&str]) -> Output {
    Command::new(cargo_deny())
        .args(["--color", "never", "--manifest-path"])
        .arg(manifest)
        .arg("--config")
        .arg(common::repo().join("deny.toml"))
        .args(extra)
        .arg("check")
        .args(checks)
        .output()
        .expect("run cargo-deny")
}

fn text(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn the_workspace_passes_the_licence_ban_and_source_check() {
    let out = check(
        &common::repo().join("Cargo.toml"),
        &["--locked"],
        &["licenses", "bans", "sources"],
    );
    let all = text(&out);
    assert!(out.status.success(), "{all}");
    assert!(
        all.contains("bans ok") && all.contains("licenses ok") && all.contains("sources ok"),
        "{all}"
    );
}

/// A workspace of two path crates: `app`, private like the project's own
/// test crates, and `planted`, publishable and therefore checked as a
/// third-party crate would be, under `licence`.
fn planted_workspace(dir: &Path, licence: &str) -> PathBuf {
    let write = |rel: &str, body: &str| {
        let path = dir.join(rel);
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("mkdir");
        std::fs::write(&path, body).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    };
    write(
        "Cargo.toml",
        r#"[package]
name = "app"
version = "0.1.0"
edition = "2024"
license = "Apache-2.0"
publish = false

[dependencies]
planted = { path = "planted", version = "0.1.0" }

[workspace]
"#,
    );
    write("src/main.rs", "fn main() {}\n");
    write(
        "planted/Cargo.toml",
        &format!(
            "[package]\nname = \"planted\"\nversion = \"0.1.0\"\nedition = \"2024\"\nlicense = \"{licence}\"\n"
        ),
    );
    write("planted/src/lib.rs", "");
    dir.join("Cargo.toml")
}

#[test]
fn a_dependency_under_a_licence_outside_the_allow_list_fails_the_check() {
    let dir = TempDir::new("deny-gpl");
    let manifest = planted_workspace(dir.path(), "GPL-3.0-only");
    let out = check(&manifest, &["--offline"], &["licenses"]);
    let all = text(&out);
    assert!(!out.status.success(), "a GPL-3.0-only crate passed:\n{all}");
    assert!(
        all.contains("GPL-3.0-only") && all.contains("rejected") && all.contains("planted"),
        "the failure does not name the crate and its licence:\n{all}"
    );
    assert!(all.contains("licenses FAILED"), "{all}");
}

#[test]
fn the_same_dependency_under_an_allowed_licence_passes_the_check() {
    // The control for the test above: the only difference is the licence.
    let dir = TempDir::new("deny-mit");
    let manifest = planted_workspace(dir.path(), "MIT OR Apache-2.0");
    let out = check(&manifest, &["--offline"], &["licenses"]);
    let all = text(&out);
    assert!(out.status.success(), "{all}");
    assert!(all.contains("licenses ok"), "{all}");
}

#[test]
fn a_licence_allowed_for_one_crate_only_fails_on_another() {
    // ar_archive_writer's LLVM exception is allowed for that crate alone.
    let dir = TempDir::new("deny-llvm");
    let manifest = planted_workspace(dir.path(), "Apache-2.0 WITH LLVM-exception");
    let out = check(&manifest, &["--offline"], &["licenses"]);
    let all = text(&out);
    assert!(
        !out.status.success() && all.contains("LLVM-exception") && all.contains("planted"),
        "{all}"
    );
}

/// What `cargo tree -e normal` shows the release binary made of (default
/// features, this package only): the crate names, and the features turned on.
fn release_tree(extra: &[&str]) -> String {
    let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(common::repo())
        .args([
            "tree",
            "--locked",
            "-p",
            "cloud-route-controller",
            "-e",
            "normal,features",
            "--prefix",
            "none",
        ])
        .args(extra)
        .output()
        .expect("run cargo tree");
    assert!(out.status.success(), "cargo tree failed:\n{}", text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The released binary links the engine and the real clouds, and nothing
/// that exists for testing: no simulator, no cloud-sim, no fault-injecting
/// memory cloud, no provider's `testing` feature (fakes, proxies, servers).
#[test]
fn the_release_binary_links_no_simulator_no_cloud_sim_and_no_testing_feature() {
    let lab_only = [
        "simulator",
        "cloud-sim",
        "provider-memory",
        "test-server",
        "test-cluster",
    ];
    let release = release_tree(&[]);
    for line in release.lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        assert!(
            !lab_only.contains(&name),
            "the release binary links {name}: {line}"
        );
        assert!(
            !line.contains("feature \"testing\""),
            "the release binary turns on a testing feature: {line}"
        );
    }
    for real in ["route-controller", "provider-aws", "provider-gce", "kube"] {
        assert!(
            release.lines().any(|l| l.starts_with(&format!("{real} v"))),
            "the release binary lacks {real}"
        );
    }
    // The check can fail: the lab build links what the release must not.
    let lab = release_tree(&["--features", "lab"]);
    for name in ["simulator", "cloud-sim", "provider-memory"] {
        assert!(
            lab.lines().any(|l| l.starts_with(&format!("{name} v"))),
            "the lab build lacks {name}"
        );
    }
}
