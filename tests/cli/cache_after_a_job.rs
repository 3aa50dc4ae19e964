//! `neuron-pc cache` on a cache a real job filled: listing, verifying, a corrupted entry that
//! the next run refuses to load and replaces, and pruning.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_neuron-pc")
}

fn job(cache: &Path) -> Output {
    let exe = Path::new(bin())
        .parent()
        .unwrap()
        .join("examples")
        .join("train_text_encoder");
    assert!(
        exe.exists(),
        "{} is missing: cargo test builds it",
        exe.display()
    );
    Command::new(exe)
        .args(["--steps", "3", "--val-every", "3", "--loss-log", "--json"])
        .args(["--vocab", "256", "--embed", "16", "--seq-len", "8"])
        .args(["--mlp", "32", "--classes", "4", "--batch-size", "8"])
        .env("NEURON_COMPILE_CACHE_URL", cache)
        .env_remove("NEURON_CC_FLAGS")
        .output()
        .unwrap()
}

fn npc(cache: &Path, args: &[&str]) -> Output {
    Command::new(bin())
        .args(args)
        .arg("--cache")
        .arg(cache)
        .env_remove("NEURON_COMPILE_CACHE_URL")
        .output()
        .unwrap()
}

fn stdout_json(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn losses_and_compiles(out: &Output) -> (Vec<String>, u64) {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let losses = text
        .lines()
        .filter(|l| l.starts_with("{\"step\""))
        .map(str::to_string)
        .collect();
    let at = text.find("\n{\n").expect("metrics JSON");
    let m: serde_json::Value = serde_json::from_str(&text[at..]).unwrap();
    (losses, m["compiles"].as_u64().unwrap())
}

fn tmp(tag: &str) -> PathBuf {
    neuron_pc_test_support::paths::fresh_dir("npc-cachecli", tag)
}

#[test]
fn list_verify_repair_and_prune_a_cache_a_job_filled() {
    let cache = tmp("c");
    let (losses, compiles) = losses_and_compiles(&job(&cache));
    assert_eq!((losses.len(), compiles), (3, 2));

    let ls = stdout_json(&npc(&cache, &["cache", "ls", "--json"]));
    let entries = ls.as_array().unwrap();
    assert_eq!(entries.len(), 2, "{ls}");
    let mut keys: Vec<(u64, String)> = entries
        .iter()
        .map(|e| {
            assert!(e["compile_ms"].as_f64().unwrap() > 0.0);
            (
                e["executable_size"].as_u64().unwrap(),
                e["key"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    keys.sort();
    let (big_size, big) = keys[1].clone();

    let show = stdout_json(&npc(&cache, &["cache", "show", &big, "--json"]));
    assert_eq!(show["verified"], true, "{show}");
    assert_eq!(show["record"]["executable_size"], big_size);
    let diff = stdout_json(&npc(&cache, &["cache", "show", &big, &keys[0].1, "--json"]));
    let differing: Vec<&str> = diff["differs_from_other"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["input"].as_str().unwrap())
        .collect();
    assert!(differing == ["program_sha256"], "{diff}");

    let ok = npc(&cache, &["cache", "verify"]);
    assert_eq!(ok.status.code(), Some(0));

    // Flip bytes in the middle of the larger executable.
    let exe = std::fs::read_dir(cache.join("entries").join(&big[..2]))
        .unwrap()
        .map(|e| e.unwrap().path())
        // the entry's own file: two entries may share the two-character directory
        .find(|p| {
            p.extension().is_some_and(|x| x == "exe")
                && p.file_name()
                    .is_some_and(|n| n.to_string_lossy().contains(&big))
        })
        .unwrap();
    let mut bytes = std::fs::read(&exe).unwrap();
    let mid = bytes.len() / 2;
    for b in &mut bytes[mid..mid + 64] {
        *b ^= 0x5a;
    }
    std::fs::write(&exe, bytes).unwrap();
    let bad = npc(&cache, &["cache", "verify", "--json"]);
    assert_eq!(bad.status.code(), Some(1));
    let report = stdout_json(&bad);
    assert_eq!(report["bad"].as_array().unwrap().len(), 1, "{report}");
    assert!(report["bad"][0].to_string().contains(&big), "{report}");

    // The job never runs the damaged executable: it compiles that graph again, computes the
    // same losses, and the fresh entry verifies.
    let (again, compiles) = losses_and_compiles(&job(&cache));
    assert_eq!(compiles, 1);
    assert_eq!(again, losses);
    assert_eq!(npc(&cache, &["cache", "verify"]).status.code(), Some(0));

    let stats = stdout_json(&npc(&cache, &["cache", "stats", "--json"]));
    assert_eq!(stats["stats"]["entries"], 2, "{stats}");
    let pruned = npc(&cache, &["cache", "prune", "--max-size", "1K"]);
    assert!(pruned.status.success());
    let stats = stdout_json(&npc(&cache, &["cache", "stats", "--json"]));
    assert_eq!(stats["stats"]["entries"], 0, "{stats}");

    let bad_size = npc(&cache, &["cache", "prune", "--max-size", "lots"]);
    assert_eq!(bad_size.status.code(), Some(1));
    let err = String::from_utf8_lossy(&bad_size.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("--max-size"), "{err}");
    std::fs::remove_dir_all(&cache).unwrap();
}
