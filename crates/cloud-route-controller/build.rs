//! Records the git commit the binary is built from, for `--version`: from
//! `CRC_GIT_COMMIT` when the build names it (a container build, which has no
//! `.git`), else from `git` in the source tree, else `unknown`.

use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=CRC_GIT_COMMIT");
    let from_env = std::env::var("CRC_GIT_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty());
    let commit = from_env
        .or_else(from_git)
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=CRC_GIT_COMMIT={}", commit.trim());
}

fn from_git() -> Option<String> {
    let git = |args: &[&str]| -> Option<String> {
        let out = Command::new("git").args(args).output().ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    // Rebuild when HEAD moves: HEAD itself, the branch it names, packed refs.
    if let Some(dir) = git(&["rev-parse", "--git-dir"]) {
        let dir = Path::new(&dir);
        println!("cargo:rerun-if-changed={}", dir.join("HEAD").display());
        println!(
            "cargo:rerun-if-changed={}",
            dir.join("packed-refs").display()
        );
        if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
            println!("cargo:rerun-if-changed={}", dir.join(branch).display());
        }
    }
    git(&["rev-parse", "HEAD"]).filter(|c| !c.is_empty())
}
