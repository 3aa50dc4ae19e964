//! Multi-process runs: the launchers' variables read into one topology, the clear refusal of
//! cross-process collectives on cpu, ranks sharing one cache, and trial runs of several ranks
//! that deduplicate their identical graphs.

use crate::support as common;

use std::collections::HashMap;
use std::process::{Command, Stdio};

use common::*;
use neuron_pc::topology::{check_launch, check_launch_with, Launcher, Topology};
use neuron_pc_compiler::pjrt::Target;

fn parse(vars: &[(&str, &str)]) -> neuron_pc::Result<Topology> {
    let map: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Topology::from_vars(|k| map.get(k).cloned())
}

#[test]
fn torchrun_variables() {
    let t = parse(&[
        ("RANK", "5"),
        ("WORLD_SIZE", "8"),
        ("LOCAL_RANK", "1"),
        ("LOCAL_WORLD_SIZE", "4"),
        ("GROUP_RANK", "1"),
        ("MASTER_ADDR", "10.0.0.7"),
        ("MASTER_PORT", "29500"),
        // torchrun inside a Slurm allocation: torchrun's variables describe the process
        ("SLURM_PROCID", "0"),
        ("SLURM_NTASKS", "2"),
    ])
    .unwrap();
    assert_eq!(
        (
            t.rank,
            t.world_size,
            t.local_rank,
            t.local_world_size,
            t.node_rank,
            t.num_nodes
        ),
        (5, 8, 1, 4, 1, 2)
    );
    assert_eq!(t.master_addr.as_deref(), Some("10.0.0.7"));
    assert_eq!(t.master_port, Some(29500));
    assert_eq!(t.launcher, Launcher::Torchrun);
    assert!(t.is_multi_process());
    assert_eq!((t.global_replica_offset(2), t.global_replicas(2)), (10, 16));
    assert_eq!(t.to_string(), "rank 5/8 (node 1/2, local 1/4) via torchrun");
}

#[test]
fn slurm_variables_with_compressed_lists() {
    let t = parse(&[
        ("SLURM_PROCID", "9"),
        ("SLURM_NTASKS", "11"),
        ("SLURM_LOCALID", "1"),
        ("SLURM_NODEID", "2"),
        ("SLURM_NNODES", "3"),
        ("SLURM_TASKS_PER_NODE", "4(x2),3"),
        ("SLURM_JOB_NODELIST", "trn1-[007-009]"),
    ])
    .unwrap();
    assert_eq!(
        (
            t.rank,
            t.world_size,
            t.local_rank,
            t.local_world_size,
            t.node_rank,
            t.num_nodes
        ),
        (9, 11, 1, 3, 2, 3)
    );
    assert_eq!(t.master_addr.as_deref(), Some("trn1-007"));
    assert_eq!(t.launcher, Launcher::Slurm);
}

#[test]
fn aws_batch_main_and_child_nodes() {
    let main = parse(&[
        ("AWS_BATCH_JOB_NODE_INDEX", "0"),
        ("AWS_BATCH_JOB_NUM_NODES", "4"),
        ("AWS_BATCH_JOB_MAIN_NODE_INDEX", "0"),
    ])
    .unwrap();
    assert_eq!(
        (main.rank, main.world_size, main.local_world_size),
        (0, 4, 1)
    );
    assert_eq!(main.master_addr, None);
    assert_eq!(main.launcher, Launcher::AwsBatch);
    let child = parse(&[
        ("AWS_BATCH_JOB_NODE_INDEX", "3"),
        ("AWS_BATCH_JOB_NUM_NODES", "4"),
        ("AWS_BATCH_JOB_MAIN_NODE_INDEX", "0"),
        ("AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS", "172.31.9.4"),
    ])
    .unwrap();
    assert_eq!((child.rank, child.node_rank, child.num_nodes), (3, 3, 4));
    assert_eq!(child.master_addr.as_deref(), Some("172.31.9.4"));
    let e = parse(&[
        ("AWS_BATCH_JOB_NODE_INDEX", "2"),
        ("AWS_BATCH_JOB_NUM_NODES", "4"),
    ])
    .unwrap_err();
    assert!(
        e.to_string()
            .contains("AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"),
        "{e}"
    );
}

#[test]
fn sagemaker_hosts() {
    let t = parse(&[
        ("SM_HOSTS", r#"["algo-1","algo-2","algo-3"]"#),
        ("SM_CURRENT_HOST", "algo-2"),
    ])
    .unwrap();
    assert_eq!((t.rank, t.world_size, t.node_rank), (1, 3, 1));
    assert_eq!(t.master_addr.as_deref(), Some("algo-1"));
    assert_eq!(t.launcher, Launcher::SageMaker);
    let e = parse(&[("SM_HOSTS", "algo-1"), ("SM_CURRENT_HOST", "algo-1")]).unwrap_err();
    assert!(
        e.to_string()
            .contains("SM_HOSTS=\"algo-1\": expected a JSON list"),
        "{e}"
    );
}

#[test]
fn no_launcher_is_one_process_and_bad_values_are_one_clear_line() {
    let t = parse(&[]).unwrap();
    assert_eq!(t, Topology::single());
    assert!(!t.is_multi_process());
    for (vars, want) in [
        (
            vec![("RANK", "x"), ("WORLD_SIZE", "2")],
            "RANK=\"x\": expected a whole number",
        ),
        (
            vec![("RANK", "2"), ("WORLD_SIZE", "2")],
            "rank 2 is not below the world size 2",
        ),
        (vec![("WORLD_SIZE", "2")], "RANK is not set"),
        (
            vec![("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_PORT", "99999")],
            "MASTER_PORT=\"99999\": expected a port number",
        ),
        (
            vec![
                ("RANK", "1"),
                ("WORLD_SIZE", "4"),
                ("LOCAL_RANK", "2"),
                ("LOCAL_WORLD_SIZE", "2"),
            ],
            "local rank 2 is not below the local world size 2",
        ),
        (
            vec![
                ("SLURM_PROCID", "0"),
                ("SLURM_NTASKS", "4"),
                ("SLURM_NODEID", "5"),
                ("SLURM_NNODES", "2"),
                ("SLURM_TASKS_PER_NODE", "2(x2)"),
            ],
            "SLURM_TASKS_PER_NODE=\"2(x2)\"",
        ),
    ] {
        let e = parse(&vars).unwrap_err();
        assert!(e.to_string().contains(want), "{vars:?}: {e}");
        assert_eq!(e.to_string().lines().count(), 1);
    }
}

#[test]
fn several_processes_on_cpu_need_the_store_but_extract_mode_does_not() {
    let t = parse(&[("RANK", "1"), ("WORLD_SIZE", "2")]).unwrap();
    // cpu: gloo's groups meet through the run's store
    let e = check_launch_with(&t, Target::Cpu, false, false)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("rank 1/2") && e.contains("NEURON_PC_STORE=etcd://"),
        "{e}"
    );
    assert!(check_launch_with(&t, Target::Cpu, false, true).is_ok());
    assert!(check_launch_with(&t, Target::Cpu, true, false).is_ok());
    assert!(check_launch(&Topology::single(), Target::Cpu, false).is_ok());
    // cuda: several processes need the run's store for the client's key-value callbacks
    let e = check_launch_with(&t, Target::Cuda, false, false)
        .unwrap_err()
        .to_string();
    assert!(e.contains("NEURON_PC_STORE"), "{e}");
    assert!(check_launch_with(&t, Target::Cuda, false, true).is_ok());
    // Neuron: the runtime's own bootstrap (NEURON_RT_ROOT_COMM_ID), no store needed
    assert!(check_launch_with(&t, Target::Trn1, false, false).is_ok());

    // A job launched as rank 1 of 2 on cpu without a store: one line on stderr, a failing
    // exit status.
    let out = Command::new(probe())
        .args(["--steps", "1"])
        .env_remove("NEURON_PC_EXTRACT_DIR")
        .env_remove("NEURON_PC_STORE")
        .env_remove("RUST_BACKTRACE")
        .envs([("RANK", "1"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "1")])
        .envs([("LOCAL_WORLD_SIZE", "2"), ("MASTER_ADDR", "127.0.0.1")])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = stderr(&out);
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(lines[0].contains("NEURON_PC_STORE=etcd://"), "{err}");
}

#[test]
fn two_ranks_sharing_a_cache_compile_each_graph_once() {
    let cache = tmp("ranks-share");
    let start = || {
        Command::new(probe())
            .args(["--steps", "3", "--json"])
            .env("NEURON_COMPILE_CACHE_URL", &cache)
            .env_remove("NEURON_CC_FLAGS")
            .env_remove("NEURON_PC_EXTRACT_DIR")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (start(), start());
    let mut compiles = 0;
    for child in [a, b] {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let m: serde_json::Value = text
            .lines()
            .find_map(|l| l.strip_prefix("METRICS "))
            .map(|m| serde_json::from_str(m).unwrap())
            .unwrap();
        compiles += m["compiles"].as_u64().unwrap();
        let found = m["compiles"].as_u64().unwrap()
            + m["disk_hits"].as_u64().unwrap()
            + m["waited_for_others"].as_u64().unwrap();
        assert_eq!(found, 3, "{m}");
    }
    assert_eq!(
        compiles, 3,
        "each of the 3 graphs compiled once across both processes"
    );
    let _ = std::fs::remove_dir_all(&cache);
}

#[test]
fn a_trial_run_of_two_ranks_compiles_each_graph_once() {
    // The stand-in for `torchrun --nproc-per-node 2`: the same job twice, with torchrun's
    // variables, started by one command.
    let cache = tmp("ranks-trial");
    let p = probe();
    let script = format!(
        "for r in 0 1; do RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 \
         MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 {} --steps 2 & done; wait",
        p.display()
    );
    let out = npc(
        &cache,
        &["compile", "--json", "--", "sh", "-c", &script],
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let v = json(&out);
    // both ranks traced the same 3 graphs (for 2 replicas across the two processes)
    assert_eq!(
        (v["found"].as_u64(), v["compiled"].as_u64()),
        (Some(3), Some(3)),
        "{v}"
    );
    assert_eq!(entry_keys(&cache).len(), 3);
    let _ = std::fs::remove_dir_all(&cache);
}
