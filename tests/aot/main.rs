//! `neuron-pc compile` and launches of several processes: the trial run, the parallel
//! ahead-of-time compiler and its faults, graph analysis, sharding a compile over array jobs
//! (under a real Slurm), topology, the ranks' agreement check and the etcd store.

#[path = "../common/mod.rs"]
#[allow(dead_code)]
mod common;
mod etcd_support;
mod support;

mod analyze;
mod compile;
mod compile_ux;
// needs the failure switches the `test-hooks` feature compiles in
#[cfg(feature = "test-hooks")]
mod faults;
mod graphs;
mod rank_check;
mod shard;
mod store_etcd;
mod topology;
mod trial_safety;
