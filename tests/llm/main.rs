//! Language models and their data: Llama and the other Hugging Face families against
//! `transformers`, generation, PyTorch interop, and text data (tokenizer, dataset files, packing,
//! the packed-rows cache, length buckets, each process's rows, the device loader).

#[path = "../common/mod.rs"]
#[allow(dead_code)]
mod common;
mod llm_check;
use common::torch_fixture;

mod dataset_files;
mod families;
mod generate;
mod length_buckets;
mod llama;
mod local_rows;
mod moe;
mod packed_cache;
mod packing;
mod text_data;
mod tokenizer;
mod torch_interop;
mod training_loader;
