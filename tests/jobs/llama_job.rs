//! Running the LLM example (`examples/train_llama`) as a user does, for `tests/jobs/train_llama.rs`
//! and `tests/jobs/train_llama_data.rs`.
#![allow(dead_code)] // each test binary uses a different part

use std::path::{Path, PathBuf};
use std::process::Command;

/// A model and batch small enough for debug builds.
pub const SMALL: &[&str] = &[
    "--hidden",
    "32",
    "--intermediate",
    "64",
    "--batch-size",
    "16",
];

pub fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

pub fn job() -> PathBuf {
    neuron_pc_test_support::paths::example_binary(env!("CARGO_BIN_EXE_neuron-pc"), "train_llama")
}

pub fn tmp(tag: &str) -> PathBuf {
    neuron_pc_test_support::paths::fresh_dir("npc-llama-job", tag)
}

pub fn command(cache: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(job());
    c.args(args)
        .env("NEURON_COMPILE_CACHE_URL", cache)
        // tokenized rows beside the compile cache, not in the user's ~/.cache
        .env(neuron_pc::data::DATA_CACHE_ENV, cache.join("packed"))
        .env_remove("NEURON_CC_FLAGS")
        .env_remove("NEURON_PC_DEVICES")
        .env_remove("NEURON_PC_EXTRACT_DIR");
    c
}

/// What one run printed: its stdout, `(step, loss)` pairs and the `--json` metrics.
pub struct Run {
    pub stdout: String,
    pub losses: Vec<(u64, f64)>,
    pub metrics: serde_json::Value,
}

pub fn run(cache: &Path, args: &[&str]) -> Run {
    run_command(command(cache, args), args)
}

/// [`run`] of a command the caller has adjusted (an environment variable set or removed).
pub fn run_command(mut c: Command, args: &[&str]) -> Run {
    parse_output(c.output().unwrap(), args)
}

/// What a finished run of `args` printed; it must have succeeded.
pub fn parse_output(out: std::process::Output, args: &[&str]) -> Run {
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{args:?} failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let metrics = match stdout.find("\n{\n") {
        Some(at) => serde_json::from_str(&stdout[at..]).unwrap(),
        None => serde_json::Value::Null,
    };
    let losses = stdout
        .lines()
        .filter(|l| l.starts_with("{\"step\""))
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (v["step"].as_u64().unwrap(), v["loss"].as_f64().unwrap())
        })
        .collect();
    Run {
        stdout,
        losses,
        metrics,
    }
}

pub fn mean(losses: &[(u64, f64)]) -> f64 {
    losses.iter().map(|l| l.1).sum::<f64>() / losses.len() as f64
}

/// `neuron-pc compile --json -- train_llama SMALL.. args..` into `cache`: its report.
pub fn precompile(cache: &Path, args: &[&str]) -> serde_json::Value {
    precompile_with(cache, &[], args)
}

/// [`precompile`] with `flags` of `neuron-pc compile` itself (`--world-size 2`). The trial
/// sees no launcher's variables and no store but those the flags give it.
pub fn precompile_with(cache: &Path, flags: &[&str], args: &[&str]) -> serde_json::Value {
    let job = job();
    let mut trial: Vec<&str> = vec!["compile", "--json"];
    trial.extend(flags);
    trial.extend(["--", job.to_str().unwrap()]);
    trial.extend(SMALL);
    trial.extend(args);
    let mut c = Command::new(env!("CARGO_BIN_EXE_neuron-pc"));
    for v in LAUNCHER_VARS {
        c.env_remove(v);
    }
    let out = c
        .args(&trial)
        .env("NEURON_COMPILE_CACHE_URL", cache)
        .env_remove("NEURON_CC_FLAGS")
        .env_remove("NEURON_PC_DEVICES")
        .env_remove("NEURON_PC_STORE")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A launcher's variables, which a job started by a test must not inherit from the test's own
/// environment (the tests may run under torchrun or Slurm).
pub const LAUNCHER_VARS: &[&str] = &[
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "SLURM_PROCID",
];

/// Fails with one line on stderr naming `needle`.
pub fn fails_with(cache: &Path, args: &[&str], needle: &str) {
    let out = command(cache, args).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{args:?} succeeded");
    assert!(stderr.contains(needle), "{args:?}: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}
