//! The persistent cache seen from the lazy device, across fresh processes, and the trial run.

use neuron_pc_test_support::process::{run_alone, test_path};
use std::process::Command;

use neuron_pc::{DeviceConfig, HostTensor, LazyDevice, Metrics};

const CHILD: &str = "NEURON_PC_TEST_CHILD";

/// The training-like loop both processes run; prints its results and metrics as JSON.
fn child_loop() {
    let dev = LazyDevice::from_env().unwrap();
    let w = dev
        .tensor(
            &HostTensor::from_slice(
                &(0..64).map(|i| i as f32 / 64.0).collect::<Vec<_>>(),
                &[8, 8],
            )
            .unwrap(),
        )
        .unwrap();
    for step in 0..4 {
        let x = dev
            .tensor(&HostTensor::from_slice(&vec![step as f32 * 0.1; 8 * 8], &[8, 8]).unwrap())
            .unwrap();
        let y = x.matmul(&w).unwrap().tanh().unwrap().add(&w).unwrap();
        w.assign(&y).unwrap();
        dev.mark_step().unwrap();
    }
    let bits: Vec<u32> = w
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect();
    println!("RESULT {}", serde_json::to_string(&bits).unwrap());
    println!("METRICS {}", serde_json::to_string(&dev.metrics()).unwrap());
}

fn run_child(test: &str, envs: &[(&str, &str)]) -> (Vec<u32>, Metrics, String) {
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            &test_path(module_path!(), test),
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .envs(envs.iter().copied())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "child failed:\n{stdout}\n{stderr}");
    let field = |tag: &str| {
        stdout
            .lines()
            .find_map(|l| l.find(tag).map(|i| &l[i + tag.len()..]))
            .unwrap_or_else(|| panic!("no {tag} in {stdout}"))
            .to_string()
    };
    (
        serde_json::from_str(&field("RESULT ")).unwrap(),
        serde_json::from_str(&field("METRICS ")).unwrap(),
        stderr,
    )
}

fn tmp(tag: &str) -> std::path::PathBuf {
    neuron_pc_test_support::paths::fresh_path("npc", tag)
}

#[test]
fn a_second_process_compiles_nothing_and_gets_identical_results() {
    if std::env::var(CHILD).is_ok() {
        return child_loop();
    }
    let cache = tmp("second-run");
    let url = cache.to_str().unwrap();
    let name = "a_second_process_compiles_nothing_and_gets_identical_results";
    let (first, m1, _) = run_child(name, &[("NEURON_COMPILE_CACHE_URL", url)]);
    let (second, m2, _) = run_child(name, &[("NEURON_COMPILE_CACHE_URL", url)]);
    assert_eq!(m1.compiles, 1, "{m1:?}");
    assert_eq!(m2.compiles, 0, "{m2:?}");
    assert_eq!(m2.disk_hits, 1, "{m2:?}");
    assert_eq!(first, second, "results must be bit-identical");
    // A different optimization level is a different key: it compiles again.
    let (third, m3, _) = run_child(
        name,
        &[
            ("NEURON_COMPILE_CACHE_URL", url),
            ("NEURON_CC_FLAGS", "--optlevel O1"),
        ],
    );
    assert_eq!(m3.compiles, 1, "{m3:?}");
    assert_eq!(third.len(), first.len());
    std::fs::remove_dir_all(&cache).unwrap();
}

#[test]
fn a_corrupt_cache_entry_is_a_miss_not_a_wrong_result() {
    if std::env::var(CHILD).is_ok() {
        return child_loop();
    }
    let cache = tmp("corrupt");
    let url = cache.to_str().unwrap();
    let name = "a_corrupt_cache_entry_is_a_miss_not_a_wrong_result";
    let (first, _, _) = run_child(name, &[("NEURON_COMPILE_CACHE_URL", url)]);
    // Flip a byte in every stored executable.
    let mut flipped = 0;
    for shard in std::fs::read_dir(cache.join("entries")).unwrap() {
        for f in std::fs::read_dir(shard.unwrap().path()).unwrap() {
            let p = f.unwrap().path();
            if p.extension().is_some_and(|e| e == "exe") {
                let mut b = std::fs::read(&p).unwrap();
                let n = b.len() / 2;
                b[n] ^= 0x40;
                std::fs::write(&p, b).unwrap();
                flipped += 1;
            }
        }
    }
    assert_eq!(flipped, 1);
    let (again, m, stderr) = run_child(name, &[("NEURON_COMPILE_CACHE_URL", url)]);
    assert_eq!(m.compiles, 1, "a corrupt entry must be recompiled: {m:?}");
    assert_eq!(again, first);
    assert!(stderr.contains("digest"), "the miss is explained: {stderr}");
    std::fs::remove_dir_all(&cache).unwrap();
}

#[test]
fn extract_mode_writes_graphs_and_flags_zero_filled_reads() {
    // alone in a process of its own: a trial-run device marks the whole process as a trial
    // run, and other tests' saves would be skipped
    if !run_alone(
        module_path!(),
        "extract_mode_writes_graphs_and_flags_zero_filled_reads",
    ) {
        return;
    }
    let dir = tmp("extract");
    let dev = LazyDevice::new(DeviceConfig {
        cache: neuron_pc::compile::CacheConfig::disabled(),
        extract_dir: Some(dir.clone()),
        ..DeviceConfig::default()
    })
    .unwrap();
    let a = dev
        .tensor(&HostTensor::from_slice(&[1.0f32, 2.0, 3.0], &[3]).unwrap())
        .unwrap();
    let mut outs = Vec::new();
    for _ in 0..3 {
        let y = a.exp().unwrap().sum_all().unwrap();
        dev.mark_step().unwrap();
        outs.push(y);
    }
    let v = outs[2].to_vec::<f32>().unwrap();
    assert_eq!(v, vec![0.0], "the trial run gives zero-filled stand-ins");
    let m = dev.metrics();
    assert_eq!(
        (m.graphs_extracted, m.compiles, m.executions),
        (1, 0, 0),
        "{m:?}"
    );
    assert_eq!(m.zero_filled_reads, 1);
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names.len(), 2, "{names:?}");
    assert!(names[0].ends_with(".json") && names[1].ends_with(".mlir"));
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join(&names[0])).unwrap()).unwrap();
    assert_eq!(record["params"][0], "f32[3]");
    assert!(record["site"]
        .as_str()
        .unwrap()
        .contains("lazy_persistent.rs"));
    let text = std::fs::read_to_string(dir.join(&names[1])).unwrap();
    assert!(text.contains("stablehlo.exponential"), "{text}");
    std::fs::remove_dir_all(&dir).unwrap();
}
