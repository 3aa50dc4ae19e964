//! `neuron-pc cache ...` parsing and exit codes against a local cache filled through the cache
//! crate's own API (no plugin, no job): the binary the user runs, not a copy of its module.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Output};

use neuron_pc_cache::{Cache, CacheOptions, EntryKey};

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_neuron-pc")
}

fn npc(args: &[&str]) -> Output {
    Command::new(bin())
        .args(args)
        .env_remove("NEURON_COMPILE_CACHE_URL")
        .env_remove("NEURON_CC_FLAGS")
        .env_remove("NEURON_PC_CACHE_READ_ONLY")
        .output()
        .unwrap()
}

fn code(args: &[&str]) -> i32 {
    npc(args).status.code().unwrap_or(-1)
}

fn tmp(tag: &str) -> PathBuf {
    neuron_pc_test_support::paths::fresh_path("npc-cache-cmd", tag)
}

fn key(label: &str) -> EntryKey {
    EntryKey::parse(&neuron_pc_compiler::key::sha256_hex(label.as_bytes())).unwrap()
}

fn inputs(label: &str) -> BTreeMap<String, String> {
    [("program_sha256".to_string(), label.to_string())].into()
}

#[test]
fn parsing_errors_are_usage_errors() {
    for bad in [
        &["cache"][..],
        &["cache", "prune"],
        &["cache", "show"],
        &["cache", "nope"],
        &["cache", "ls", "--bogus"],
    ] {
        assert_eq!(code(bad), 2, "{bad:?}");
    }
}

#[test]
fn commands_against_a_local_cache() {
    let root = tmp("local");
    let r = root.to_str().unwrap();
    let c = Cache::open(r, CacheOptions::default()).unwrap();
    let (a, b) = (key("cli a"), key("cli b"));
    c.put(&a, &[7; 100], "", &inputs("one"), 1.0);
    c.put(&b, &[8; 100], "", &inputs("two"), 1.0);
    let ls = npc(&["cache", "ls", "--json", "--cache", r]);
    assert!(ls.status.success());
    let listed: serde_json::Value = serde_json::from_slice(&ls.stdout).unwrap();
    assert_eq!(listed.as_array().map(Vec::len), Some(2), "{listed}");
    assert_eq!(code(&["cache", "stats", "--cache", r]), 0);
    let show = npc(&["cache", "show", a.as_str(), b.as_str(), "--cache", r]);
    assert!(show.status.success());
    assert!(String::from_utf8_lossy(&show.stdout).contains("program_sha256"));
    assert_eq!(
        code(&["cache", "show", &"0".repeat(64), "--cache", r]),
        1,
        "unknown key"
    );
    let bad = npc(&["cache", "show", "../etc/passwd", "--cache", r]);
    assert_eq!(bad.status.code(), Some(1), "invalid key");
    assert!(String::from_utf8_lossy(&bad.stderr).contains("invalid cache key"));
    assert_eq!(code(&["cache", "verify", "--cache", r]), 0);
    // Damage one entry's executable: verify fails, --fix removes it, then verify is clean.
    let exe = std::fs::read_dir(root.join("entries").join(&a.as_str()[..2]))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "exe"))
        .unwrap();
    std::fs::write(&exe, b"bad").unwrap();
    assert_eq!(code(&["cache", "verify", "--json", "--cache", r]), 1);
    assert_eq!(
        code(&["cache", "verify", "--fix", "--cache", r]),
        0,
        "everything left is sound after the fix"
    );
    assert_eq!(code(&["cache", "verify", "--cache", r]), 0);
    assert_eq!(c.list().unwrap().len(), 1);
    assert_eq!(
        code(&["cache", "prune", "--max-size", "lots", "--cache", r]),
        1
    );
    assert_eq!(
        code(&["cache", "prune", "--max-size", "0", "--cache", r]),
        0
    );
    assert!(
        c.list().unwrap().is_empty(),
        "prune to 0 removes everything"
    );
    c.put(&a, &[7; 100], "", &inputs("one"), 1.0);
    c.put_failure(&b, "boom");
    assert_eq!(code(&["cache", "clear", "--failed", "--cache", r]), 0);
    assert!(c.failure(&b).is_none() && c.list().unwrap().len() == 1);
    assert_eq!(code(&["cache", "rm", a.as_str(), "--cache", r]), 0);
    assert!(c.list().unwrap().is_empty());
    assert_eq!(
        code(&["cache", "ls", "--cache", "ftp://nope"]),
        1,
        "unknown scheme"
    );
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn the_cache_dir_of_neuron_cc_flags_is_honoured_like_the_device_does() {
    // `--cache_dir` in NEURON_CC_FLAGS names the cache for jobs; the cache commands look there
    // too when neither --cache nor NEURON_COMPILE_CACHE_URL is given.
    let root = tmp("ccflags");
    let r = root.to_str().unwrap();
    let c = Cache::open(r, CacheOptions::default()).unwrap();
    c.put(&key("cc a"), &[1; 10], "", &inputs("cc"), 1.0);
    let out = Command::new(bin())
        .args(["cache", "ls", "--json"])
        .env_remove("NEURON_COMPILE_CACHE_URL")
        .env("NEURON_CC_FLAGS", format!("--cache_dir={r}"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(listed.as_array().map(Vec::len), Some(1), "{listed}");
    let _ = std::fs::remove_dir_all(&root);
}
