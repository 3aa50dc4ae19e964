//! `train_llama` under a real `srun` (the single-node Slurm of `shard.rs`), as the guide's
//! two-node command runs it: 2 tasks, each with a tensor-parallel mesh over its 2 cpu devices and
//! the tasks its data-parallel replicas with AdamW's moments sharded over them (ZeRO-1), their
//! rank layout read from Slurm's variables, their groups meeting through a real etcd; the losses
//! must be those of one process of 4 devices.

use std::process::Command;

use crate::etcd_support::Etcd;
use crate::shard::Slurm;
use crate::support::tmp;

const SMALL: &[&str] = &[
    "--hidden",
    "32",
    "--intermediate",
    "64",
    "--batch-size",
    "16",
    "--peak-matmul",
    "0",
    "--steps",
    "4",
    "--loss-log",
];

fn train_llama() -> std::path::PathBuf {
    neuron_pc_test_support::paths::example_binary(env!("CARGO_BIN_EXE_neuron-pc"), "train_llama")
}

fn losses(text: &str) -> Vec<f64> {
    text.lines()
        .filter(|l| l.starts_with("{\"step\""))
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["loss"]
                .as_f64()
                .unwrap()
        })
        .collect()
}

/// Variables of a launcher the test itself may run under, which a job would read.
const LAUNCHER_VARS: &[&str] = &["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"];

#[test]
fn two_srun_tasks_of_tensor_parallel_2_and_zero1_train_as_one_process_of_four() {
    let d = tmp("srun");
    let Some(etcd) = Etcd::start("srun") else {
        return;
    };
    let Some(slurm) = Slurm::start(&d.join("slurm")) else {
        return;
    };
    let cache = d.join("cache");
    let mut alone = Command::new(train_llama());
    alone
        .args(SMALL)
        .args(["--devices", "4"])
        .env("NEURON_COMPILE_CACHE_URL", &cache)
        .env_remove("NEURON_CC_FLAGS")
        .env_remove("NEURON_PC_DEVICES");
    for v in LAUNCHER_VARS {
        alone.env_remove(v);
    }
    let out = alone.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let want = losses(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(want.len(), 4);

    let outputs = d.join("out");
    std::fs::create_dir_all(&outputs).unwrap();
    let mut srun = slurm.client("srun");
    srun.args(["--ntasks=2", "--cpus-per-task=1", "--kill-on-bad-exit=1"])
        .arg(format!("--output={}/task-%t.out", outputs.display()))
        .arg(format!("--error={}/task-%t.err", outputs.display()))
        .arg(train_llama())
        .args(SMALL)
        .args(["--tp", "2", "--zero1", "--json"])
        .env("NEURON_PC_STORE", &etcd.url)
        .env("NEURON_COMPILE_CACHE_URL", &cache)
        .env_remove("NEURON_PC_RUN_ID")
        .env_remove("NEURON_CC_FLAGS")
        .env_remove("NEURON_PC_DEVICES");
    for v in LAUNCHER_VARS {
        srun.env_remove(v);
    }
    let status = srun.status().unwrap();
    let read = |task: usize, ext: &str| {
        std::fs::read_to_string(outputs.join(format!("task-{task}.{ext}"))).unwrap_or_default()
    };
    assert!(
        status.success(),
        "srun: {status}\n{}\n{}",
        read(0, "err"),
        read(1, "err")
    );
    for task in 0..2 {
        let text = read(task, "out");
        // the rank layout came from Slurm's variables
        let metrics: serde_json::Value = text
            .find("\n{\n")
            .map(|at| serde_json::from_str(&text[at..]).unwrap())
            .unwrap_or_else(|| panic!("task {task} printed no metrics: {text}"));
        assert_eq!(metrics["rank"], task, "{metrics}");
        assert_eq!(metrics["world_size"], 2, "{metrics}");
        let got = losses(&text);
        assert_eq!(got.len(), want.len(), "task {task}: {text}");
        for (step, (a, b)) in got.iter().zip(&want).enumerate() {
            let rel = (a - b).abs() / b.abs();
            assert!(rel <= 1e-5, "task {task} step {}: {a} vs {b}", step + 1);
        }
    }
    drop(slurm);
    let _ = std::fs::remove_dir_all(d);
}
