//! [`Family`]: which `transformers` architecture a config describes (`model_type`).

/// The `transformers` architectures this decoder computes: what differs between them is
/// configuration and a few switches (see `docs/design.md`, "Model families").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Family {
    /// `LlamaForCausalLM` (Llama 2, 3, 3.1+, SmolLM, ...): `attention_bias` and `mlp_bias`.
    #[default]
    Llama,
    /// `MistralForCausalLM`: no biases, a sliding window in every layer when `sliding_window`
    /// is set.
    Mistral,
    /// `Qwen2ForCausalLM` (Qwen2, Qwen2.5): biases on q/k/v (never on o), sliding-window
    /// layers as `layer_types` (or `use_sliding_window` and `max_window_layers`) say.
    Qwen2,
    /// `Qwen3ForCausalLM`: an RMSNorm over each head of q and of k before the rotation,
    /// `attention_bias` on q/k/v/o, sliding-window layers as Qwen2's.
    Qwen3,
    /// `Qwen3MoeForCausalLM` (Qwen3-30B-A3B, 235B-A22B): Qwen3's attention (a window in every
    /// layer when `use_sliding_window`) and experts ([`super::LlamaConfig::moe`]) in the layers
    /// `decoder_sparse_step` and `mlp_only_layers` say.
    Qwen3Moe,
    /// `MixtralForCausalLM` (Mixtral 8x7B, 8x22B): Mistral's attention and experts in every
    /// layer, their weights always renormalised.
    Mixtral,
}

impl Family {
    /// Every family, in the order the guide (`docs/guide/llms.md`) lists them.
    pub const ALL: [Family; 6] = [
        Family::Llama,
        Family::Mistral,
        Family::Qwen2,
        Family::Qwen3,
        Family::Qwen3Moe,
        Family::Mixtral,
    ];

    /// `config.json`'s `model_type`.
    pub fn model_type(self) -> &'static str {
        match self {
            Family::Llama => "llama",
            Family::Mistral => "mistral",
            Family::Qwen2 => "qwen2",
            Family::Qwen3 => "qwen3",
            Family::Qwen3Moe => "qwen3_moe",
            Family::Mixtral => "mixtral",
        }
    }

    /// The `transformers` class `config.json`'s `architectures` names.
    pub fn architecture(self) -> &'static str {
        match self {
            Family::Llama => "LlamaForCausalLM",
            Family::Mistral => "MistralForCausalLM",
            Family::Qwen2 => "Qwen2ForCausalLM",
            Family::Qwen3 => "Qwen3ForCausalLM",
            Family::Qwen3Moe => "Qwen3MoeForCausalLM",
            Family::Mixtral => "MixtralForCausalLM",
        }
    }

    /// The family of a `model_type`, if this crate computes it.
    pub fn from_model_type(model_type: &str) -> Option<Family> {
        Family::ALL
            .into_iter()
            .find(|f| f.model_type() == model_type)
    }
}
