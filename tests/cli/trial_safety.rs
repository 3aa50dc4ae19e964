//! A trial run (`neuron-pc compile`) never writes the user's files: a real
//! checkpoint survives it byte for byte, the trial's `--resume` reads it, and the real resume
//! afterwards continues from the real step with the real losses.

use neuron_pc_test_support::process::run_alone;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use neuron_pc::compile::CacheConfig;
use neuron_pc::state_dict::StateDict;
use neuron_pc::{DeviceConfig, HostTensor, LazyDevice};

/// A model small enough for debug builds (as `tests/jobs/text_encoder.rs`).
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
    "--val-every",
    "1000",
];

fn job() -> PathBuf {
    neuron_pc_test_support::paths::example_binary(
        env!("CARGO_BIN_EXE_neuron-pc"),
        "train_text_encoder",
    )
}

fn tmp(tag: &str) -> PathBuf {
    neuron_pc_test_support::paths::fresh_dir("npc-trial", tag)
}

fn ok(out: Output, what: &str) -> (String, String) {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{what} failed:\n{stdout}\n{stderr}");
    (stdout, stderr)
}

/// Runs the example for real; returns stdout.
fn train(cache: &Path, args: &[&str]) -> String {
    let out = Command::new(job())
        .args(SMALL)
        .args(args)
        .env("NEURON_COMPILE_CACHE_URL", cache)
        .env_remove("NEURON_CC_FLAGS")
        .env_remove("NEURON_PC_EXTRACT_DIR")
        .output()
        .unwrap();
    ok(out, &format!("{args:?}")).0
}

fn losses(stdout: &str) -> Vec<(u64, f64)> {
    stdout
        .lines()
        .filter(|l| l.starts_with("{\"step\""))
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (v["step"].as_u64().unwrap(), v["loss"].as_f64().unwrap())
        })
        .collect()
}

#[test]
fn a_trial_run_leaves_a_real_checkpoint_alone_and_the_resume_continues_from_it() {
    let dir = tmp("ckpt");
    let cache = dir.join("cache");
    let ck = dir.join("ck");
    let ck_s = ck.to_str().unwrap();
    let metrics = dir.join("metrics.json");
    train(
        &cache,
        &["--steps", "20", "--ckpt-dir", ck_s, "--ckpt-every", "10"],
    );
    let saved = ck.join("step-00000020");
    let last = saved.join("model-00001-of-00001.safetensors");
    let before = std::fs::read(&last).unwrap();
    let mtime = std::fs::metadata(&last).unwrap().modified().unwrap();
    let manifest = std::fs::read_to_string(saved.join("manifest.json")).unwrap();
    assert!(manifest.contains("\"step\": 20"), "{manifest}");
    let real_step20 = StateDict::load(&last).unwrap();
    assert_eq!(real_step20.metadata["format"], "pt");
    // The reference: the same checkpoint, kept out of the trial's way.
    let ck_ref = dir.join("ck-ref");
    std::fs::create_dir_all(ck_ref.join("step-00000020")).unwrap();
    for f in std::fs::read_dir(&saved).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(
            &f,
            ck_ref.join("step-00000020").join(f.file_name().unwrap()),
        )
        .unwrap();
    }
    std::fs::write(&metrics, "real metrics").unwrap();

    // The trial saves at steps 30 and 32 (and would have written zeros over step 20's file).
    let job = job();
    let mut trial: Vec<&str> = vec!["compile", "--json", "--", job.to_str().unwrap()];
    trial.extend(SMALL);
    trial.extend([
        "--steps",
        "32",
        "--ckpt-dir",
        ck_s,
        "--ckpt-every",
        "10",
        "--resume",
    ]);
    trial.extend(["--metrics-file", metrics.to_str().unwrap()]);
    let out = Command::new(env!("CARGO_BIN_EXE_neuron-pc"))
        .args(&trial)
        .env("NEURON_COMPILE_CACHE_URL", &cache)
        .env_remove("NEURON_CC_FLAGS")
        .output()
        .unwrap();
    let (stdout, stderr) = ok(out, "neuron-pc compile");
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert!(report["found"].as_u64().unwrap() >= 1, "{report}");
    // The trial's --resume read the real checkpoint (the job's stdout is in the log).
    assert!(
        stderr.contains("resumed from") && stderr.contains("at step 20"),
        "{stderr}"
    );
    let skipped: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("not writing checkpoint"))
        .collect();
    assert_eq!(
        skipped.len(),
        1,
        "one line per path, however often it saves:\n{stderr}"
    );
    assert!(
        skipped[0].contains(&ck.display().to_string()),
        "{}",
        skipped[0]
    );
    assert!(skipped[0].contains("left as it was"), "{}", skipped[0]);
    assert!(
        stderr.contains("not writing") && stderr.contains("metrics.json"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read(&last).unwrap(),
        before,
        "the checkpoint's bytes changed"
    );
    assert_eq!(std::fs::metadata(&last).unwrap().modified().unwrap(), mtime);
    assert_eq!(std::fs::read_to_string(&metrics).unwrap(), "real metrics");
    let mut names: Vec<_> = std::fs::read_dir(&ck)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["step-00000010", "step-00000020"],
        "no checkpoint of the trial's steps 30 and 32, no stray files"
    );

    // The real resume continues from step 20 with the losses of resuming from the copy.
    let args = [
        "--steps",
        "30",
        "--resume",
        "--loss-log",
        "--ckpt-every",
        "0",
    ];
    let resumed = train(&cache, &[&args[..], &["--ckpt-dir", ck_s]].concat());
    assert!(
        resumed.contains("resumed from") && resumed.contains("at step 20"),
        "{resumed}"
    );
    let reference = train(
        &cache,
        &[&args[..], &["--ckpt-dir", ck_ref.to_str().unwrap()]].concat(),
    );
    let (got, want) = (losses(&resumed), losses(&reference));
    assert_eq!(got.len(), 10, "{resumed}");
    assert_eq!(got[0].0, 21);
    assert_eq!(got, want);
    // and they are real: a model trained 20 steps is well below chance's ln 8 = 2.08
    assert!(
        got.iter().all(|(_, l)| l.is_finite() && *l < 2.0),
        "{got:?}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// In-process: once a device of a trial run exists, no save reaches the disk, an existing
/// file keeps its bytes and a new path is not created. (This test owns its process's trial
/// state: it runs alone in a process of its own.)
#[test]
fn in_extract_mode_every_save_path_is_skipped() {
    // alone in a process of its own: a trial-run device marks the whole process as a trial
    // run, and other tests' saves would be skipped
    if !run_alone(module_path!(), "in_extract_mode_every_save_path_is_skipped") {
        return;
    }
    let dir = tmp("inproc");
    let existing = dir.join("existing.safetensors");
    let mut sd = StateDict::default();
    sd.tensors.insert(
        "w".into(),
        HostTensor::from_slice(&[1.0f32, 2.0], &[2]).unwrap(),
    );
    sd.save(&existing).unwrap();
    let before = std::fs::read(&existing).unwrap();
    assert!(!neuron_pc::trial::is_trial_run());

    let dev = LazyDevice::new(DeviceConfig {
        cache: CacheConfig::disabled(),
        extract_dir: Some(dir.join("extract")),
        trace: Some(dir.join("timeline.json")),
        ..DeviceConfig::default()
    })
    .unwrap();
    assert!(dev.is_trial_run() && neuron_pc::trial::is_trial_run());
    let w = dev
        .tensor(&HostTensor::from_slice(&[3.0f32, 4.0], &[2]).unwrap())
        .unwrap();
    let w2 = w.mul_scalar(2.0).unwrap();
    dev.mark_step().unwrap();
    let mut zeros = StateDict::default();
    zeros.tensors.insert("w".into(), w2.to_host().unwrap());
    assert_eq!(zeros.tensors["w"].to_vec::<f32>().unwrap(), vec![0.0, 0.0]);
    zeros.save(&existing).unwrap();
    assert_eq!(std::fs::read(&existing).unwrap(), before);
    let fresh = dir.join("sub").join("new.safetensors");
    zeros.save(&fresh).unwrap();
    assert!(!fresh.exists() && !dir.join("sub").exists());
    // Loading (a trial's --resume) still works.
    assert_eq!(StateDict::load(&existing).unwrap(), sd);
    drop((w, w2));
    drop(dev);
    // The timeline goes to a new file (`neuron-pc compile --trace` merges it), never over one.
    let timeline = dir.join("timeline.json");
    assert!(
        timeline.exists(),
        "a trial's timeline is written to a new path"
    );
    std::fs::write(&timeline, "a real run's timeline").unwrap();
    let dev = LazyDevice::new(DeviceConfig {
        cache: CacheConfig::disabled(),
        extract_dir: Some(dir.join("extract")),
        trace: Some(timeline.clone()),
        ..DeviceConfig::default()
    })
    .unwrap();
    drop(dev);
    assert_eq!(
        std::fs::read_to_string(&timeline).unwrap(),
        "a real run's timeline"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
