//! Helpers shared by the `aot_*` tests (included with `#[path]`, not a test target itself).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_neuron-pc")
}

/// The tiny example job (built by `cargo test` with the other examples).
pub fn probe() -> PathBuf {
    let p = Path::new(bin())
        .parent()
        .unwrap()
        .join("examples")
        .join("aot_probe");
    assert!(
        p.exists(),
        "{} is missing: run `cargo build --example aot_probe` (cargo test builds it)",
        p.display()
    );
    p
}

/// A fresh directory for one test.
pub fn tmp(tag: &str) -> PathBuf {
    neuron_pc_test_support::paths::fresh_dir("npc-aot", tag)
}

/// `neuron-pc <args>` with the cache at `cache` and no inherited compiler flags.
pub fn npc(cache: &Path, args: &[&str], envs: &[(&str, &str)]) -> Output {
    Command::new(bin())
        .args(args)
        .env("NEURON_COMPILE_CACHE_URL", cache)
        .env_remove("NEURON_CC_FLAGS")
        .env_remove("NEURON_PC_EXTRACT_DIR")
        .envs(envs.iter().copied())
        .output()
        .unwrap()
}

pub fn json(out: &Output) -> serde_json::Value {
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(&text).unwrap_or_else(|e| {
        panic!(
            "{e}: stdout={text}\nstderr={}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

pub fn last_line(s: &str) -> &str {
    s.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("")
}

/// Keys of the graphs with `outcome`.
pub fn keys(v: &serde_json::Value, outcome: &str) -> Vec<String> {
    let mut k: Vec<String> = v["graphs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|g| g["outcome"] == outcome)
        .map(|g| g["key"].as_str().unwrap().to_string())
        .collect();
    k.sort();
    k
}

/// Keys of the complete entries (records) in a local cache directory.
pub fn entry_keys(cache: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![cache.join("entries")];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "json") {
                out.push(p.file_stem().unwrap().to_string_lossy().into_owned());
            }
        }
    }
    out.sort();
    out
}

/// Runs the probe job for real; returns (loss bits per step, metrics JSON).
pub fn run_probe(cache: &Path, args: &[&str]) -> (Vec<u64>, serde_json::Value) {
    run_probe_with(cache, args, &[])
}

/// [`run_probe`] with extra environment variables.
pub fn run_probe_with(
    cache: &Path,
    args: &[&str],
    envs: &[(&str, &str)],
) -> (Vec<u64>, serde_json::Value) {
    let out = Command::new(probe())
        .args(args)
        .envs(envs.iter().copied())
        .arg("--json")
        .env("NEURON_COMPILE_CACHE_URL", cache)
        .env_remove("NEURON_CC_FLAGS")
        .env_remove("NEURON_PC_EXTRACT_DIR")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "probe failed: {text}\n{}",
        stderr(&out)
    );
    let mut bits = Vec::new();
    let mut metrics = serde_json::Value::Null;
    for l in text.lines() {
        if let Some(m) = l.strip_prefix("METRICS ") {
            metrics = serde_json::from_str(m).unwrap();
        } else if l.starts_with('{') {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            bits.push(v["bits"].as_u64().unwrap());
        }
    }
    (bits, metrics)
}

/// Processes whose command line contains `needle`.
pub fn processes_with(needle: &str) -> Vec<u32> {
    let mut pids = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(cmd) = std::fs::read(e.path().join("cmdline")) {
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            // Zombies have an empty cmdline and are not running.
            if cmd.contains(needle) {
                pids.push(pid);
            }
        }
    }
    pids
}
