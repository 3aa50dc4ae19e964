//! The example training job (`examples/train_text_encoder.rs`) end to end, in a small
//! configuration: it learns, a killed run resumes with the same losses, and after
//! `neuron-pc compile` a real run compiles nothing and computes what a just-in-time run does.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A model small enough for debug builds: vocabulary 512, 8 classes (chance 0.125).
const SMALL: &[&str] = &[
    "--vocab",
    "512",
    "--embed",
    "32",
    "--seq-len",
    "16",
    "--mlp",
    "64,64",
    "--classes",
    "8",
    "--batch-size",
    "32",
    "--lr",
    "5e-3",
    "--warmup",
    "10",
];

fn job() -> PathBuf {
    neuron_pc_test_support::paths::example_binary(
        env!("CARGO_BIN_EXE_neuron-pc"),
        "train_text_encoder",
    )
}

fn tmp(tag: &str) -> PathBuf {
    neuron_pc_test_support::paths::fresh_dir("npc-train", tag)
}

fn command(cache: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(job());
    c.args(SMALL)
        .args(args)
        .env("NEURON_COMPILE_CACHE_URL", cache)
        .env_remove("NEURON_CC_FLAGS")
        .env_remove("NEURON_PC_EXTRACT_DIR");
    c
}

/// What one run printed: `(step, loss)` pairs, validation accuracies, and the metrics JSON.
struct Run {
    losses: Vec<(u64, f64)>,
    accuracies: Vec<f64>,
    metrics: serde_json::Value,
    /// The step of a `resumed from ... at step N` line.
    resumed_at: Option<u64>,
}

fn parse(stdout: &str) -> Run {
    let mut losses = Vec::new();
    let mut accuracies = Vec::new();
    let mut resumed_at = None;
    // `--json` prints the metrics last, over several lines
    let metrics = match stdout.find("\n{\n") {
        Some(at) => serde_json::from_str(&stdout[at..]).unwrap(),
        None => serde_json::Value::Null,
    };
    for line in stdout.lines() {
        if line.starts_with("{\"step\"") {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            losses.push((v["step"].as_u64().unwrap(), v["loss"].as_f64().unwrap()));
        } else if let Some(rest) = line.strip_prefix("resumed from ") {
            resumed_at = rest.rsplit(' ').next().and_then(|s| s.parse().ok());
        } else if let Some(rest) = line.split("validation accuracy ").nth(1) {
            accuracies.push(rest.split_whitespace().next().unwrap().parse().unwrap());
        }
    }
    Run {
        losses,
        accuracies,
        metrics,
        resumed_at,
    }
}

fn run(cache: &Path, args: &[&str]) -> Run {
    let out = command(cache, args).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{args:?} failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    parse(&stdout)
}

#[test]
fn a_short_run_learns_the_task() {
    let cache = tmp("learn");
    let r = run(
        &cache,
        &[
            "--steps",
            "100",
            "--val-every",
            "50",
            "--loss-log",
            "--json",
        ],
    );
    assert_eq!(r.losses.len(), 100);
    let first: f64 = r.losses[..5].iter().map(|l| l.1).sum::<f64>() / 5.0;
    let last: f64 = r.losses[95..].iter().map(|l| l.1).sum::<f64>() / 5.0;
    // ln(8) = 2.08 at the start; a model that learns nothing stays there
    assert!(first > 1.5, "initial loss {first}");
    assert!(last < 0.5, "loss after 100 steps {last}");
    assert_eq!(r.accuracies.len(), 2);
    assert!(
        r.accuracies[1] >= 0.85,
        "validation accuracy {:?} (chance 0.125)",
        r.accuracies
    );
    // training and validation: two graphs for the whole run
    assert_eq!(r.metrics["compiles"], 2, "{}", r.metrics);
    std::fs::remove_dir_all(&cache).unwrap();
}

#[test]
fn a_killed_run_resumes_from_its_checkpoint_with_the_same_losses() {
    let cache = tmp("resume-cache");
    let common = [
        "--steps",
        "40",
        "--ckpt-every",
        "10",
        "--val-every",
        "1000",
        "--loss-log",
    ];
    let straight_dir = tmp("straight");
    let mut args = common.to_vec();
    args.extend(["--ckpt-dir", straight_dir.to_str().unwrap()]);
    let straight = run(&cache, &args);
    assert_eq!(straight.losses.len(), 40);

    // The same job, killed (SIGKILL: no clean-up) once it has printed step 25.
    let dir = tmp("killed");
    let mut args = common.to_vec();
    args.extend(["--ckpt-dir", dir.to_str().unwrap(), "--resume"]);
    let mut child = command(&cache, &args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut before = Vec::new();
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        before.extend(parse(&line).losses);
        if before.last().is_some_and(|l| l.0 == 25) {
            child.kill().unwrap();
            break;
        }
    }
    child.wait().unwrap();
    assert_eq!(before.len(), 25, "the job ended before step 25");

    let resumed = run(&cache, &args);
    // It restarts after the newest complete checkpoint, step 20's, or step 10's when step 20's
    // was still being written in the background at the kill, and recomputes from there.
    let from = resumed.resumed_at.expect("a resume line");
    assert!(from == 20 || from == 10, "resumed at {from}");
    let steps: Vec<u64> = resumed.losses.iter().map(|l| l.0).collect();
    assert_eq!(steps, (from + 1..=40).collect::<Vec<_>>());
    assert_eq!(&before[..], &straight.losses[..25]);
    assert_eq!(
        &resumed.losses[..],
        &straight.losses[from as usize..],
        "resumed losses differ from the uninterrupted run"
    );
    // Both runs end with the same weights and optimizer state, byte for byte.
    let last = "step-00000040/model-00001-of-00001.safetensors";
    let a = std::fs::read(straight_dir.join(last)).unwrap();
    let b = std::fs::read(dir.join(last)).unwrap();
    assert!(a == b, "final checkpoints differ");

    // A checkpoint of another model is refused with the tensors that do not match.
    let mut wrong: Vec<&str> = SMALL.to_vec();
    let classes = wrong.iter().position(|a| *a == "--classes").unwrap();
    wrong[classes + 1] = "9";
    let out = Command::new(job())
        .args(&wrong)
        .args(&args)
        .env("NEURON_COMPILE_CACHE_URL", &cache)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("does not match") && err.contains("proj.weight: file has f32[8, 64]"),
        "{err}"
    );
    assert_eq!(std::fs::read(dir.join(last)).unwrap(), b);
    for d in [cache, straight_dir, dir] {
        std::fs::remove_dir_all(d).unwrap();
    }
}

#[test]
fn after_neuron_pc_compile_a_real_run_compiles_nothing_and_matches_jit() {
    let cache = tmp("aot-cache");
    let job = job();
    let mut trial: Vec<&str> = vec!["compile", "--json", "--"];
    trial.push(job.to_str().unwrap());
    trial.extend(SMALL);
    trial.extend(["--steps", "3", "--val-every", "3"]);
    let out = Command::new(env!("CARGO_BIN_EXE_neuron-pc"))
        .args(&trial)
        .env("NEURON_COMPILE_CACHE_URL", &cache)
        .env_remove("NEURON_CC_FLAGS")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["compiled"], 2, "{report}");

    let args = ["--steps", "30", "--val-every", "15", "--loss-log", "--json"];
    let real = run(&cache, &args);
    assert_eq!(real.metrics["compiles"], 0, "{}", real.metrics);
    assert_eq!(real.metrics["disk_hits"], 2, "{}", real.metrics);
    let jit_cache = tmp("jit-cache");
    let jit = run(&jit_cache, &args);
    assert_eq!(jit.metrics["compiles"], 2);
    assert_eq!(real.losses.len(), 30);
    assert_eq!(real.losses, jit.losses);
    assert_eq!(real.accuracies, jit.accuracies);
    for d in [cache, jit_cache] {
        std::fs::remove_dir_all(d).unwrap();
    }
}

#[test]
fn with_two_devices_the_job_trains_data_parallel_and_says_so() {
    let cache = tmp("dp");
    let args = ["--steps", "20", "--val-every", "20", "--loss-log"];
    let one = run(&cache, &args);
    let out = command(&cache, &args)
        .args(["--devices", "2"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("data-parallel: 2 replica(s), global batch 32, 16 per replica"),
        "{stdout}"
    );
    assert!(stdout.contains("samples/s global"), "{stdout}");
    // the same global batches: the same losses up to float reassociation
    let two = parse(&stdout);
    assert_eq!(two.losses.len(), 20);
    for ((s, a), (_, b)) in two.losses.iter().zip(&one.losses) {
        assert!((a - b).abs() <= 1e-4 * b.abs(), "step {s}: {a} vs {b}");
    }
    // ZeRO-1 over the two replicas: the same losses, half the optimizer state per replica
    let zero1 = run(
        &cache,
        &[&args[..], &["--devices", "2", "--zero1", "--json"]].concat(),
    );
    for ((s, a), (_, b)) in zero1.losses.iter().zip(&one.losses) {
        assert!(
            (a - b).abs() <= 1e-4 * b.abs(),
            "zero1 step {s}: {a} vs {b}"
        );
    }
    let plain = run(&cache, &[&args[..], &["--devices", "2", "--json"]].concat());
    let (z, p) = (
        zero1.metrics["optimizer_state_bytes"].as_u64().unwrap(),
        plain.metrics["optimizer_state_bytes"].as_u64().unwrap(),
    );
    assert!(
        p > 0 && z * 2 >= p && z * 2 <= p + 64,
        "zero1 {z} vs plain {p} bytes"
    );
    // the environment variable works too, and a batch that does not split is one clear line
    let out = command(&cache, &["--steps", "1"])
        .env("NEURON_PC_DEVICES", "3")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("does not split over 3 replicas"),
        "{stderr}"
    );
    std::fs::remove_dir_all(&cache).unwrap();
}
