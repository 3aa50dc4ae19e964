//! The lazy device and training steps: tracing, asynchronous execution, metrics and the timeline,
//! gradients and optimizers, activation recomputation, scanned layers, step functions, data
//! parallelism (replicas, ZeRO-1, collectives between processes) and sharding over a mesh.

#[path = "../common/mod.rs"]
#[allow(dead_code)]
mod common;
#[path = "../cli/etcd_support.rs"]
mod etcd_support;

mod amp_scaler;
mod async_exec;
mod data_parallel;
mod data_parallel_training;
mod debug_steps;
mod expert_parallel;
mod grad_accumulation;
mod grad_training;
mod launch_thread;
mod lazy_device;
mod lazy_persistent;
mod made_before_loop;
mod memory_metrics;
mod optimizer_calls;
mod processes;
mod remat;
mod remat_program;
mod scan;
mod scan_layers;
mod sharded_program;
mod sharded_training;
mod step_fn;
mod timeline;
mod training_autocast;
mod zero1;
