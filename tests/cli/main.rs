//! The `neuron-pc` binary as a user drives it: `neuron-pc compile` (the trial run, the parallel
//! ahead-of-time compiler and its faults, graph analysis, a compile sharded over array jobs under
//! a real Slurm), launches of several processes (topology, the ranks' agreement check, the etcd
//! store), `neuron-pc cache` and `neuron-pc doctor`, and the cache faults a job and the command
//! line meet, on a local directory and on the loopback S3 server.

#[path = "../common/mod.rs"]
#[allow(dead_code)]
mod common;
mod etcd_support;
#[path = "../../cache/tests/store/common/server.rs"]
#[allow(dead_code)]
mod server;
mod support;

mod analyze;
mod compile;
// needs the failure switches the `test-hooks` feature compiles in
#[cfg(feature = "test-hooks")]
mod compile_faults;
mod compile_ux;
mod graphs;
mod shard;
mod srun;
mod trial_safety;

mod rank_check;
mod store_etcd;
mod topology;

mod cache_after_a_job;
mod cache_exit_codes;
mod cache_faults;
mod cache_user_commands;
mod doctor;
mod plot;
