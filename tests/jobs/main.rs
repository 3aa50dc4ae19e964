//! The example jobs end to end as a user runs them (`train_text_encoder`, `train_llama`, the GPU
//! kit's script), training across processes, and training checkpoints: on disk, on S3, and
//! under SIGKILL.

#[path = "../common/mod.rs"]
#[allow(dead_code)]
mod common;
#[path = "../cli/etcd_support.rs"]
mod etcd_support;
mod llama_job;

mod checkpoint_faults;
mod checkpoint_kill;
mod checkpoints;
mod checkpoints_s3;
mod gpu_check;
mod moe_job;
mod monitor;
mod processes;
mod text_encoder;
mod train_llama;
mod train_llama_data;
