//! Collectives between processes on cpu, op by op: this test program started again as 2 ranks
//! of 2 replicas each (torchrun's variables, a real etcd for the store, gloo between them)
//! computes every collective a step can record, and each replica's value must be that of the
//! same replica of one process of 4 replicas: sums, maxima, gathers and scatters along the
//! first and an inner dimension, bf16 and integer reductions (a bf16 reduce-scatter too),
//! groups inside a process and groups across processes only, and the replica index.

use std::process::{Command, Stdio};

use neuron_pc::tensor::Reduction;
use neuron_pc::topology::Topology;
use neuron_pc::{DType, HostTensor, LazyDevice, Tensor};
use neuron_pc_test_support::launch::{free_port, torchrun_vars};

use crate::common::config;
use crate::etcd_support::Etcd;

/// Set in the ranks this test starts: there the test computes its rank's values.
const RANK_ENV: &str = "NEURON_PC_TEST_COLLECTIVES_RANK";
const TEST: &str = "processes::every_collective_over_two_processes_matches_one_process";

/// Replica `g`'s input: 4 x 8 values, distinct per replica and position.
fn input(g: usize) -> HostTensor {
    let v: Vec<f32> = (0..32)
        .map(|i| (g * 100 + i) as f32 * 0.37 - 20.0 * (i % 3) as f32)
        .collect();
    HostTensor::from_slice(&v, &[4, 8]).unwrap()
}

/// Every collective's value on each of this device's replicas, as f64s.
fn results(dev: &LazyDevice, first: usize) -> Vec<Vec<Vec<f64>>> {
    let hosts: Vec<HostTensor> = (0..dev.replicas()).map(|l| input(first + l)).collect();
    let x = dev.from_replicas(&hosts).unwrap();
    let id = dev.replica_index().unwrap().to_dtype(DType::F32).unwrap();
    let values: Vec<Tensor> = vec![
        x.all_reduce(Reduction::Sum).unwrap(),
        x.all_reduce(Reduction::Max).unwrap(),
        x.all_reduce(Reduction::Mean).unwrap(),
        x.all_gather(0).unwrap(),
        x.all_gather(1).unwrap(),
        x.reduce_scatter(Reduction::Sum, 0).unwrap(),
        x.reduce_scatter(Reduction::Sum, 1).unwrap(),
        x.reduce_scatter(Reduction::Max, 1).unwrap(),
        x.to_dtype(DType::BF16)
            .unwrap()
            .reduce_scatter(Reduction::Sum, 0)
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap(),
        x.to_dtype(DType::BF16)
            .unwrap()
            .all_reduce(Reduction::Sum)
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap(),
        x.to_dtype(DType::I32)
            .unwrap()
            .all_reduce(Reduction::Min)
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap(),
        // inside each process, and across processes only
        x.all_reduce_in(Reduction::Sum, &[vec![0, 1], vec![2, 3]])
            .unwrap(),
        x.all_reduce_in(Reduction::Sum, &[vec![0, 2], vec![1, 3]])
            .unwrap(),
        id,
    ];
    dev.mark_step().unwrap();
    let per_value: Vec<Vec<HostTensor>> = values
        .iter()
        .map(|v| v.to_host_replicas().unwrap())
        .collect();
    (0..dev.replicas())
        .map(|l| per_value.iter().map(|v| v[l].to_f64_vec()).collect())
        .collect()
}

#[test]
fn every_collective_over_two_processes_matches_one_process() {
    if let Ok(rank) = std::env::var(RANK_ENV) {
        let topology = Topology::from_env().unwrap();
        let dev = LazyDevice::new(neuron_pc::DeviceConfig {
            replicas: 2,
            topology,
            ..config()
        })
        .unwrap();
        let first = rank.parse::<usize>().unwrap() * 2;
        // on a line of its own: the harness has written "test ... " without a newline
        println!(
            "\nRESULT {}",
            serde_json::to_string(&results(&dev, first)).unwrap()
        );
        return;
    }
    let Some(etcd) = Etcd::start("collectives") else {
        return;
    };
    let reference = results(
        &LazyDevice::new(neuron_pc::DeviceConfig {
            replicas: 4,
            ..config()
        })
        .unwrap(),
        0,
    );
    let port = free_port();
    let ranks: Vec<_> = (0..2)
        .map(|rank| {
            Command::new(std::env::current_exe().unwrap())
                .args([TEST, "--exact", "--test-threads", "1", "--nocapture"])
                .env(RANK_ENV, rank.to_string())
                .envs(torchrun_vars(rank, 2, "collectives", port))
                .env("NEURON_PC_STORE", &etcd.url)
                .env_remove("NEURON_PC_RUN_ID")
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for (rank, child) in ranks.into_iter().enumerate() {
        let out = child.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "rank {rank}: {text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let line = text
            .lines()
            .find_map(|l| l.strip_prefix("RESULT "))
            .unwrap_or_else(|| panic!("rank {rank} printed no result"));
        let got: Vec<Vec<Vec<f64>>> = serde_json::from_str(line).unwrap();
        for (l, values) in got.iter().enumerate() {
            let want = &reference[rank * 2 + l];
            for (k, (a, b)) in values.iter().zip(want).enumerate() {
                assert_eq!(a.len(), b.len(), "rank {rank} replica {l} value {k}");
                // sums are added in another order (within each process, then across), and a
                // bf16 sum (values 8 and 9) rounds at each level: one bf16 step (2^-7) apart
                // at most
                let tolerance = if k == 8 || k == 9 { 1.0 / 128.0 } else { 1e-5 };
                for (i, (x, y)) in a.iter().zip(b).enumerate() {
                    let close = (x - y).abs() <= tolerance * y.abs().max(1.0);
                    assert!(close, "rank {rank} replica {l} value {k} [{i}]: {x} vs {y}");
                }
            }
        }
    }
}
