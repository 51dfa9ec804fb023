//! The fuzz targets of `fuzz/` on stable Rust: every checked-in seed, then
//! a few thousand inputs per target mutated from the seeds by a seeded RNG
//! (bit flips, truncation, splicing, inserted bytes), so CI exercises the
//! parsers without nightly or libFuzzer. `CRC_FUZZ_ITERATIONS` raises the
//! count; the real coverage-guided run is documented in RELIABILITY.md.

#[path = "../../../fuzz/src/targets.rs"]
mod targets;

use std::path::PathBuf;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

type Target = fn(&[u8]);

const TARGETS: [(&str, Target); 6] = [
    ("memory_config", targets::memory_config),
    ("hcloud_config", targets::hcloud_config),
    ("openstack_config", targets::openstack_config),
    ("ccm_configs", targets::ccm_configs),
    ("cidrs", targets::cidrs),
    ("sim_answers", targets::sim_answers),
];

fn seeds(target: &str) -> Vec<Vec<u8>> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/seeds")
        .join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("seed entry").path())
        .collect();
    files.sort();
    let seeds: Vec<Vec<u8>> = files
        .iter()
        .map(|f| std::fs::read(f).expect("seed"))
        .collect();
    assert!(!seeds.is_empty(), "no seeds for {target}");
    seeds
}

/// Tokens that make mutations reach deeper than random bytes would.
const DICTIONARY: &[&[u8]] = &[
    b":",
    b"{",
    b"}",
    b"[",
    b"]",
    b",",
    b"\"",
    b"\n",
    b"/",
    b"::",
    b".",
    b"-",
    b"0",
    b"255",
    b"4294967296",
    b"1e309",
    b"-1",
    b"null",
    b"true",
    b"~",
    b"!!",
    b"&a",
    b"*a",
    b"= ",
    b"[[x]]",
    b"\\u0000",
    b"\xff",
    b"/128",
    b"/0",
];

fn mutate(rng: &mut StdRng, seeds: &[Vec<u8>]) -> Vec<u8> {
    let mut d = seeds[rng.random_range(0..seeds.len())].clone();
    for _ in 0..rng.random_range(1..5) {
        match rng.random_range(0..6) {
            0 if !d.is_empty() => {
                let i = rng.random_range(0..d.len());
                d[i] ^= 1 << rng.random_range(0..8);
            }
            1 if !d.is_empty() => {
                let at = rng.random_range(0..=d.len());
                d.truncate(at);
            }
            2 => {
                let other = &seeds[rng.random_range(0..seeds.len())];
                let cut = rng.random_range(0..=other.len());
                let at = rng.random_range(0..=d.len());
                d.truncate(at);
                d.extend_from_slice(&other[cut..]);
            }
            3 => {
                let tok = DICTIONARY[rng.random_range(0..DICTIONARY.len())];
                let at = rng.random_range(0..=d.len());
                d.splice(at..at, tok.iter().copied());
            }
            4 if !d.is_empty() => {
                let a = rng.random_range(0..d.len());
                let b = rng.random_range(a..=d.len());
                d.drain(a..b);
            }
            _ => {
                let at = rng.random_range(0..=d.len());
                d.insert(at, rng.random());
            }
        }
    }
    d
}

fn run(name: &str, target: Target, input: &[u8]) {
    if std::panic::catch_unwind(|| target(input)).is_err() {
        panic!(
            "fuzz target {name} failed on {:?} (bytes {input:02x?}); add it to fuzz/seeds/{name}/ once fixed",
            String::from_utf8_lossy(input)
        );
    }
}

#[test]
fn fuzz_targets_replay_seeds_and_seeded_mutations() {
    let iterations: usize = std::env::var("CRC_FUZZ_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3000);
    for (name, target) in TARGETS {
        let seeds = seeds(name);
        for s in &seeds {
            run(name, target, s);
        }
        let mut rng = StdRng::seed_from_u64(0x5eed_f022);
        for _ in 0..iterations {
            let input = mutate(&mut rng, &seeds);
            run(name, target, &input);
        }
        eprintln!("{name}: {} seeds and {iterations} mutations", seeds.len());
    }
}
