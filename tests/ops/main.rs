//! Tensor operations and their gradients against independent references: finite differences,
//! a plain-Rust host evaluator, and PyTorch fixtures (layers, LLM blocks, mixed precision).

#[path = "../common/mod.rs"]
#[allow(dead_code)]
mod common;
mod grad_check;
mod host_ref;
use common::torch_fixture;

mod chunked_loss;
mod conv_pool;
mod grad_collectives;
mod grad_composites;
mod grad_layers;
mod grad_ops;
mod llm_blocks;
mod mixed_precision;
mod sort;
mod tensor_ops;
mod torch_layers;
mod torch_llm_blocks;
