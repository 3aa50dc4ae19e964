//! Qwen3 (`model_type: "qwen3"`, `Qwen3ForCausalLM`): the Llama decoder with an RMSNorm
//! over each head of q and of k (`q_norm`, `k_norm`, weights `[head_dim]`) after the
//! projection and before the rotation, biases on q/k/v/o only with `attention_bias`, and
//! sliding-window layers as Qwen2's.
//!
//! Keys read besides Llama's sizes: `attention_bias`, `head_dim` (default 128, as
//! `Qwen3Config`'s, not `hidden_size / num_attention_heads`), `use_sliding_window`,
//! `sliding_window`, `max_window_layers`, `layer_types`, `rope_parameters` / `rope_scaling`.
//!
//! There is no copy of the decoder here: [`Qwen3ForCausalLM`] is [`LlamaForCausalLM`], whose
//! [`LlamaConfig::family`] switches the parts above on, so
//! [`LlamaForCausalLM::from_pretrained`] reads a Qwen3 directory by its `model_type` and
//! [`LlamaForCausalLM::save_pretrained`] writes one back that `transformers` loads as
//! `Qwen3ForCausalLM`. A random one of given sizes:
//! `LlamaConfig::new(..)?.with_family(Family::Qwen3)`.
//!
//! ```no_run
//! use std::path::Path;
//! use neuron_pc::models::qwen3::Qwen3ForCausalLM;
//! use neuron_pc::{DType, LazyDevice};
//! # fn main() -> neuron_pc::Result<()> {
//! let device = LazyDevice::from_env()?;
//! // a save_pretrained directory of Qwen/Qwen3-0.6B, its model_type "qwen3"
//! let dir = Path::new("Qwen3-0.6B");
//! let model: Qwen3ForCausalLM = Qwen3ForCausalLM::from_pretrained(&device, dir)?;
//! assert_eq!(model.config.family.model_type(), "qwen3");
//! // transformers loads it back as Qwen3ForCausalLM
//! model.save_pretrained(Path::new("out"), DType::BF16)?;
//! # Ok(()) }
//! ```

#[cfg(doc)]
use crate::models::llama::LlamaConfig;
use crate::models::llama::LlamaForCausalLM;

/// `transformers`' `Qwen3ForCausalLM`: the shared decoder, configured as Qwen3.
pub type Qwen3ForCausalLM = LlamaForCausalLM;
