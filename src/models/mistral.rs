//! Mistral (`model_type: "mistral"`, `MistralForCausalLM`): the Llama decoder with
//! sliding-window attention in every layer when `sliding_window` is set (Mistral 7B v0.1:
//! 4096; later versions `null`), never biases. The window is a band on top of the causal mask
//! (a query sees itself and the `sliding_window - 1` positions before it), built once per
//! step graph from the sequence length: every step has the same graph, and a window at least
//! as long as the sequence adds nothing.
//!
//! Keys read besides Llama's sizes: `sliding_window`, `head_dim`, `rope_parameters` /
//! `rope_scaling` (see [`crate::nn::RopeScaling`]). Defaults as `MistralConfig`'s
//! (`max_position_embeddings` 131072).
//!
//! There is no copy of the decoder here: [`MistralForCausalLM`] is [`LlamaForCausalLM`], whose
//! [`LlamaConfig::family`] switches the parts above on, so
//! [`LlamaForCausalLM::from_pretrained`] reads a Mistral directory by its `model_type` and
//! [`LlamaForCausalLM::save_pretrained`] writes one back that `transformers` loads as
//! `MistralForCausalLM`. A random one of given sizes:
//! `LlamaConfig::new(..)?.with_family(Family::Mistral)`.
//!
//! ```no_run
//! use std::path::Path;
//! use neuron_pc::models::mistral::MistralForCausalLM;
//! use neuron_pc::{DType, LazyDevice};
//! # fn main() -> neuron_pc::Result<()> {
//! let device = LazyDevice::from_env()?;
//! // a save_pretrained directory of mistralai/Mistral-7B-v0.1, its model_type "mistral"
//! let dir = Path::new("Mistral-7B-v0.1");
//! let model: MistralForCausalLM = MistralForCausalLM::from_pretrained(&device, dir)?;
//! assert_eq!(model.config.family.model_type(), "mistral");
//! // transformers loads it back as MistralForCausalLM
//! model.save_pretrained(Path::new("out"), DType::BF16)?;
//! # Ok(()) }
//! ```

#[cfg(doc)]
use crate::models::llama::LlamaConfig;
use crate::models::llama::LlamaForCausalLM;

/// `transformers`' `MistralForCausalLM`: the shared decoder, configured as Mistral.
pub type MistralForCausalLM = LlamaForCausalLM;
