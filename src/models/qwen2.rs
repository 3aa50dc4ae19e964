//! Qwen2 and Qwen2.5 (`model_type: "qwen2"`, `Qwen2ForCausalLM`): the Llama decoder with
//! biases on the q, k and v projections (none on o or the MLP), tied or untied embeddings,
//! and sliding-window attention in the layers `layer_types` marks `sliding_attention` (or,
//! without `layer_types`, the layers from `max_window_layers` on) when `use_sliding_window`
//! is true. Qwen2.5's long-context checkpoints scale the rotary frequencies with YaRN.
//!
//! Keys read besides Llama's sizes: `use_sliding_window`, `sliding_window`,
//! `max_window_layers`, `layer_types`, `rope_parameters` / `rope_scaling`. Defaults as
//! `Qwen2Config`'s (`max_position_embeddings` 32768, `sliding_window` 4096).
//!
//! There is no copy of the decoder here: [`Qwen2ForCausalLM`] is [`LlamaForCausalLM`], whose
//! [`LlamaConfig::family`] switches the parts above on, so
//! [`LlamaForCausalLM::from_pretrained`] reads a Qwen2 directory by its `model_type` and
//! [`LlamaForCausalLM::save_pretrained`] writes one back that `transformers` loads as
//! `Qwen2ForCausalLM`. A random one of given sizes:
//! `LlamaConfig::new(..)?.with_family(Family::Qwen2)`.
//!
//! ```no_run
//! use std::path::Path;
//! use neuron_pc::models::qwen2::Qwen2ForCausalLM;
//! use neuron_pc::{DType, LazyDevice};
//! # fn main() -> neuron_pc::Result<()> {
//! let device = LazyDevice::from_env()?;
//! // a save_pretrained directory of Qwen/Qwen2.5-0.5B, its model_type "qwen2"
//! let dir = Path::new("Qwen2.5-0.5B");
//! let model: Qwen2ForCausalLM = Qwen2ForCausalLM::from_pretrained(&device, dir)?;
//! assert_eq!(model.config.family.model_type(), "qwen2");
//! // transformers loads it back as Qwen2ForCausalLM
//! model.save_pretrained(Path::new("out"), DType::BF16)?;
//! # Ok(()) }
//! ```

#[cfg(doc)]
use crate::models::llama::LlamaConfig;
use crate::models::llama::LlamaForCausalLM;

/// `transformers`' `Qwen2ForCausalLM`: the shared decoder, configured as Qwen2.
pub type Qwen2ForCausalLM = LlamaForCausalLM;
