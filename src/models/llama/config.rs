//! `LlamaConfig`: the sizes of a Llama model, read from (and written as) a Hugging Face
//! `config.json`.

use std::path::Path;

use neuron_pc_compiler::DType;
use serde_json::{json, Map, Value};

use super::experts::{self, MoeConfig};
use super::family::Family;
use super::keys::Keys;
use crate::error::{Error, Result};
use crate::nn::RopeScaling;

/// The settings of a decoder of the Llama family (Llama 2/3, Mistral, Qwen2/2.5, Qwen3) that
/// change what the model computes, as `transformers`' configs name them.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct LlamaConfig {
    /// Tokens in the vocabulary: the rows of the embeddings and of `lm_head`.
    pub vocab_size: usize,
    /// Width of the hidden states (the embeddings, the residual stream).
    pub hidden_size: usize,
    /// Width of the MLP's gate and up projections.
    pub intermediate_size: usize,
    /// Decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads (grouped-query attention); equal to the query heads for plain MHA.
    pub num_key_value_heads: usize,
    /// `hidden_size / num_attention_heads` unless the config gives `head_dim`.
    pub head_dim: usize,
    /// The epsilon of every RMSNorm (default 1e-6).
    pub rms_norm_eps: f64,
    /// The base of the rotary frequencies (default 10000; Llama 3: 500000).
    pub rope_theta: f64,
    /// `lm_head` shares `model.embed_tokens.weight` (then no `lm_head.weight` is stored).
    pub tie_word_embeddings: bool,
    /// The standard deviation of the random initialisation (weights only; norms are 1).
    pub initializer_range: f64,
    /// The context length of `config.json` (default 2048; read without the key: 131072 for
    /// Mistral, 32768 for Qwen). When a config is read, [`LlamaConfig::rope_scaling`] takes
    /// its lengths from it; nothing else uses it, and longer sequences are not refused.
    pub max_position_embeddings: usize,
    /// The dtype the checkpoint is stored in (`dtype`, or `torch_dtype` in older configs).
    pub dtype: DType,
    /// `model_type`: which architecture, and so which switches below are read and written.
    pub family: Family,
    /// The rotary scaling of `rope_parameters` (or `rope_scaling`).
    pub rope_scaling: RopeScaling,
    /// `attention_bias` (Llama, Qwen3): biases on q, k, v and o. Qwen2 has biases on q, k and
    /// v whatever this says ([`LlamaConfig::qkv_bias`]).
    pub attention_bias: bool,
    /// `mlp_bias` (Llama): biases on the gate, up and down projections.
    pub mlp_bias: bool,
    /// The window of sliding-window attention: a query attends to itself and the
    /// `sliding_window - 1` positions before it. `None`: full causal attention everywhere.
    pub sliding_window: Option<usize>,
    /// Which layers use the window (Qwen's `layer_types`, `true` for `sliding_attention`);
    /// empty: every layer (Mistral).
    pub sliding_layers: Vec<bool>,
    /// neuron-pc's own switch, not in `config.json`: the decoder layers are stacked and run as
    /// one loop (`nn::ScannedLayers`), so the step graph, and the time to compile it, do not
    /// grow with depth. The state-dict names and checkpoints are the same either way. Off by
    /// default: see `docs/design.md` ("Scanned layers") for what it costs and when it pays.
    pub scan_layers: bool,
    /// The experts of a mixture-of-experts family (Qwen3-MoE, Mixtral); `None` for the dense
    /// ones.
    pub moe: Option<MoeConfig>,
}

impl LlamaConfig {
    /// A config from explicit sizes, with the defaults of `transformers`' `LlamaConfig` for
    /// the rest (eps 1e-6, `rope_theta` 10000, untied, initializer range 0.02, float32).
    pub fn new(
        vocab_size: usize,
        hidden_size: usize,
        intermediate_size: usize,
        num_hidden_layers: usize,
        num_attention_heads: usize,
        num_key_value_heads: usize,
    ) -> Result<LlamaConfig> {
        let c = LlamaConfig {
            vocab_size,
            hidden_size,
            intermediate_size,
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads,
            head_dim: hidden_size / num_attention_heads.max(1),
            rms_norm_eps: 1e-6,
            rope_theta: 10_000.0,
            tie_word_embeddings: false,
            initializer_range: 0.02,
            max_position_embeddings: 2048,
            dtype: DType::F32,
            family: Family::Llama,
            rope_scaling: RopeScaling::Default,
            attention_bias: false,
            mlp_bias: false,
            sliding_window: None,
            sliding_layers: Vec::new(),
            scan_layers: false,
            moe: None,
        };
        c.validate("LlamaConfig::new")?;
        Ok(c)
    }

    /// This config as `family`'s (its `model_type`; Qwen3's q/k norms and Qwen2's q/k/v biases
    /// come with the family).
    pub fn with_family(mut self, family: Family) -> LlamaConfig {
        self.family = family;
        self
    }

    /// This config with experts (the family must be a mixture of experts: call
    /// [`LlamaConfig::with_family`] first); sizes that cannot make them are an error naming the
    /// key.
    pub fn with_moe(mut self, moe: MoeConfig) -> Result<LlamaConfig> {
        self.moe = Some(moe);
        self.validate("LlamaConfig::with_moe")?;
        Ok(self)
    }

    /// Whether layer `layer` has experts ([`MoeConfig::is_sparse`]); never in a dense family.
    pub fn is_sparse(&self, layer: usize) -> bool {
        self.moe.as_ref().is_some_and(|m| m.is_sparse(layer))
    }

    /// Biases on q, k and v.
    pub fn qkv_bias(&self) -> bool {
        self.attention_bias || self.family == Family::Qwen2
    }

    /// An RMSNorm over each head of q and of k (Qwen3).
    pub fn qk_norm(&self) -> bool {
        matches!(self.family, Family::Qwen3 | Family::Qwen3Moe)
    }

    /// The attention window of layer `layer` (`None`: full causal attention).
    pub fn window(&self, layer: usize) -> Option<usize> {
        let sliding = self.sliding_layers.get(layer).copied().unwrap_or(true);
        self.sliding_window.filter(|_| sliding)
    }

    /// Reads a Hugging Face `config.json`.
    pub fn from_file(path: &Path) -> Result<LlamaConfig> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::Config(format!("{}: cannot read: {e}", path.display())))?;
        LlamaConfig::from_json_str(&text, &path.display().to_string())
    }

    /// Parses the text of a `config.json`; `origin` names it in errors. `model_type` picks the
    /// [`Family`] (none: Llama). `rope_theta` and the rotary scaling may be top-level and in
    /// `rope_scaling` (transformers 4) or in `rope_parameters` (transformers 5). A setting
    /// this implementation does not compute (another rope type, another activation, dropout,
    /// a family's key it does not have) is an error naming the key, never silently ignored.
    pub fn from_json_str(text: &str, origin: &str) -> Result<LlamaConfig> {
        let value: Value = serde_json::from_str(text)
            .map_err(|e| Error::Config(format!("{origin}: not valid JSON: {e}")))?;
        let Value::Object(map) = value else {
            return Err(Error::Config(format!("{origin}: not a JSON object")));
        };
        let keys = Keys { map: &map, origin };
        let family = match keys.get("model_type") {
            None => Family::Llama,
            Some(t) => t
                .as_str()
                .and_then(Family::from_model_type)
                .ok_or_else(|| {
                    let known: Vec<&str> = Family::ALL.iter().map(|f| f.model_type()).collect();
                    keys.err(
                        "model_type",
                        format!(
                            "{t} is not a supported family (one of {})",
                            known.join(", ")
                        ),
                    )
                })?,
        };
        if let Some(act) = keys.get("hidden_act") {
            if act.as_str() != Some("silu") {
                return Err(keys.err(
                    "hidden_act",
                    format!("{act} is not supported (the MLP uses \"silu\")"),
                ));
            }
        }
        for key in ["attention_dropout", "hidden_dropout"] {
            if let Some(p) = keys.f64(&map, key)? {
                if p != 0.0 {
                    return Err(keys.err(key, format!("dropout {p} is not supported (use 0.0)")));
                }
            }
        }
        // the keys each family has (transformers ignores the others; so does this)
        let (attention_bias, mlp_bias) = match family {
            Family::Llama => (
                keys.bool("attention_bias")?.unwrap_or(false),
                keys.bool("mlp_bias")?.unwrap_or(false),
            ),
            Family::Qwen3 | Family::Qwen3Moe => {
                (keys.bool("attention_bias")?.unwrap_or(false), false)
            }
            Family::Mistral | Family::Qwen2 | Family::Mixtral => (false, false),
        };
        let num_hidden_layers = keys.required("num_hidden_layers")?;
        let (sliding_window, sliding_layers) = match family {
            Family::Llama => {
                if let Some(w) = keys.get("sliding_window") {
                    return Err(keys.err(
                        "sliding_window",
                        format!(
                            "{w}: a Llama config has no sliding window (model_type \"mistral\" \
                             or \"qwen2\" has)"
                        ),
                    ));
                }
                (None, Vec::new())
            }
            Family::Mistral | Family::Mixtral => (keys.usize("sliding_window")?, Vec::new()),
            Family::Qwen2 | Family::Qwen3 => keys.qwen_layers(num_hidden_layers)?,
            // Qwen3-MoE's window, when `use_sliding_window`, is every layer's
            Family::Qwen3Moe => match keys.bool("use_sliding_window")?.unwrap_or(false) {
                true => (keys.usize("sliding_window")?, Vec::new()),
                false => (None, Vec::new()),
            },
        };

        let max_position_embeddings =
            keys.usize("max_position_embeddings")?
                .unwrap_or(match family {
                    Family::Llama => 2048,
                    Family::Mistral | Family::Mixtral => 4096 * 32,
                    Family::Qwen2 | Family::Qwen3 | Family::Qwen3Moe => 32768,
                });
        let (rope_theta, rope_scaling) = keys.rope(max_position_embeddings)?;

        let dtype = match keys.get("dtype").or_else(|| keys.get("torch_dtype")) {
            None => DType::F32,
            Some(v) => match v.as_str() {
                Some("float32") => DType::F32,
                Some("bfloat16") => DType::BF16,
                Some("float16") => DType::F16,
                _ => {
                    let key = if keys.get("dtype").is_some() {
                        "dtype"
                    } else {
                        "torch_dtype"
                    };
                    return Err(keys.err(
                        key,
                        format!("{v} is not supported (float32, bfloat16 or float16)"),
                    ));
                }
            },
        };

        let hidden_size = keys.required("hidden_size")?;
        let num_attention_heads = keys.required("num_attention_heads")?;
        let default_head_dim = match family {
            Family::Qwen3 => 128,
            _ => hidden_size / num_attention_heads,
        };
        let intermediate_size = keys.required("intermediate_size")?;
        let moe = experts::parse(&keys, family, intermediate_size)?;
        let default_eps = match family {
            Family::Mixtral => 1e-5,
            _ => 1e-6,
        };
        let config = LlamaConfig {
            vocab_size: keys.required("vocab_size")?,
            hidden_size,
            intermediate_size,
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads: keys
                .usize("num_key_value_heads")?
                .unwrap_or(num_attention_heads),
            head_dim: keys.usize("head_dim")?.unwrap_or(default_head_dim),
            rms_norm_eps: keys.f64(&map, "rms_norm_eps")?.unwrap_or(default_eps),
            rope_theta,
            tie_word_embeddings: keys.bool("tie_word_embeddings")?.unwrap_or(false),
            initializer_range: keys.f64(&map, "initializer_range")?.unwrap_or(0.02),
            max_position_embeddings,
            dtype,
            family,
            rope_scaling,
            attention_bias,
            mlp_bias,
            sliding_window,
            sliding_layers,
            scan_layers: false,
            moe,
        };
        config.validate(origin)?;
        Ok(config)
    }

    /// Sizes that cannot make a model are an error naming the key.
    fn validate(&self, origin: &str) -> Result<()> {
        let err = |key: &str, message: String| {
            Err(Error::Config(format!(
                "{origin}: config key `{key}`: {message}"
            )))
        };
        for (key, v) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
        ] {
            if v == 0 {
                return err(key, "must be positive".into());
            }
        }
        if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            return err(
                "num_key_value_heads",
                format!(
                    "{} key/value heads do not divide the {} attention heads",
                    self.num_key_value_heads, self.num_attention_heads
                ),
            );
        }
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) {
            return err(
                "head_dim",
                format!(
                    "{} (rotary embeddings need an even, positive head dimension)",
                    self.head_dim
                ),
            );
        }
        if self.rms_norm_eps.is_nan() || self.rms_norm_eps <= 0.0 {
            return err(
                "rms_norm_eps",
                format!("must be positive, got {}", self.rms_norm_eps),
            );
        }
        if self.sliding_window == Some(0) {
            return err("sliding_window", "must be positive".into());
        }
        if !self.sliding_layers.is_empty() && self.sliding_layers.len() != self.num_hidden_layers {
            return err(
                "layer_types",
                format!(
                    "{} entries for {} layers",
                    self.sliding_layers.len(),
                    self.num_hidden_layers
                ),
            );
        }
        if matches!(self.rope_scaling, RopeScaling::Dynamic { .. }) && self.head_dim <= 2 {
            return err(
                "head_dim",
                format!("{}: dynamic rope scaling needs more than 2", self.head_dim),
            );
        }
        experts::validate(
            self.moe.as_ref(),
            self.family,
            (self.intermediate_size, self.num_hidden_layers),
            &|key, message| Error::Config(format!("{origin}: config key `{key}`: {message}")),
        )?;
        let misplaced = match self.family {
            Family::Llama => self.sliding_window.map(|_| "sliding_window"),
            Family::Mistral | Family::Qwen2 | Family::Mixtral => {
                match (self.attention_bias, self.mlp_bias) {
                    (true, _) => Some("attention_bias"),
                    (_, true) => Some("mlp_bias"),
                    _ => None,
                }
            }
            Family::Qwen3 | Family::Qwen3Moe => self.mlp_bias.then_some("mlp_bias"),
        };
        if let Some(key) = misplaced {
            return err(
                key,
                format!(
                    "model_type {:?} has no such setting",
                    self.family.model_type()
                ),
            );
        }
        Ok(())
    }

    /// The `config.json` `save_pretrained` would write for this model (transformers 5
    /// layout: `rope_parameters`, `dtype`), loadable by the family's
    /// `*ForCausalLM.from_pretrained` (and `AutoModelForCausalLM`).
    pub fn to_json(&self, dtype: DType) -> Value {
        let dtype = match dtype {
            DType::BF16 => "bfloat16",
            DType::F16 => "float16",
            _ => "float32",
        };
        let mut rope = Map::new();
        rope.insert("rope_type".into(), json!(self.rope_scaling.rope_type()));
        rope.insert("rope_theta".into(), json!(self.rope_theta));
        let mut put = |key: &str, value: Value| {
            rope.insert(key.into(), value);
        };
        match self.rope_scaling {
            RopeScaling::Linear { factor } | RopeScaling::Dynamic { factor, .. } => {
                put("factor", json!(factor))
            }
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => {
                put("factor", json!(factor));
                put("low_freq_factor", json!(low_freq_factor));
                put("high_freq_factor", json!(high_freq_factor));
                put(
                    "original_max_position_embeddings",
                    json!(original_max_position_embeddings),
                );
            }
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings,
                attention_factor,
                mscale,
                mscale_all_dim,
                beta_fast,
                beta_slow,
                truncate,
            } => {
                put("factor", json!(factor));
                put(
                    "original_max_position_embeddings",
                    json!(original_max_position_embeddings),
                );
                for (key, v) in [
                    ("attention_factor", attention_factor),
                    ("mscale", mscale),
                    ("mscale_all_dim", mscale_all_dim),
                ] {
                    if let Some(v) = v {
                        put(key, json!(v));
                    }
                }
                put("beta_fast", json!(beta_fast));
                put("beta_slow", json!(beta_slow));
                put("truncate", json!(truncate));
            }
            _ => {}
        }
        let mut config = json!({
            "architectures": [self.family.architecture()],
            "model_type": self.family.model_type(),
            "attention_dropout": 0.0,
            "bos_token_id": null,
            "eos_token_id": null,
            "pad_token_id": null,
            "dtype": dtype,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "hidden_size": self.hidden_size,
            "initializer_range": self.initializer_range,
            "intermediate_size": self.intermediate_size,
            "max_position_embeddings": self.max_position_embeddings,
            "num_attention_heads": self.num_attention_heads,
            "num_hidden_layers": self.num_hidden_layers,
            "num_key_value_heads": self.num_key_value_heads,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_parameters": rope,
            "tie_word_embeddings": self.tie_word_embeddings,
            "use_cache": true,
            "vocab_size": self.vocab_size,
        });
        let map = config.as_object_mut().expect("an object");
        let sliding = (0..self.num_hidden_layers).map(|l| self.window(l).is_some());
        match self.family {
            Family::Llama => {
                map.insert("attention_bias".into(), json!(self.attention_bias));
                map.insert("mlp_bias".into(), json!(self.mlp_bias));
            }
            Family::Mistral | Family::Mixtral => {
                map.insert("sliding_window".into(), json!(self.sliding_window));
            }
            Family::Qwen3Moe => {
                map.insert(
                    "use_sliding_window".into(),
                    json!(self.sliding_window.is_some()),
                );
                map.insert("sliding_window".into(), json!(self.sliding_window));
                map.insert("attention_bias".into(), json!(self.attention_bias));
            }
            Family::Qwen2 | Family::Qwen3 => {
                let types: Vec<&str> = sliding
                    .map(|s| match s {
                        true => "sliding_attention",
                        false => "full_attention",
                    })
                    .collect();
                let any = types.contains(&"sliding_attention");
                map.insert("use_sliding_window".into(), json!(any));
                map.insert(
                    "sliding_window".into(),
                    json!(self.sliding_window.filter(|_| any)),
                );
                // layer_types says it all; this is the value transformers would infer
                let first = types
                    .iter()
                    .position(|t| *t == "sliding_attention")
                    .unwrap_or(self.num_hidden_layers);
                map.insert("max_window_layers".into(), json!(first));
                map.insert("layer_types".into(), json!(types));
                if self.family == Family::Qwen3 {
                    map.insert("attention_bias".into(), json!(self.attention_bias));
                }
            }
        }
        if let Some(moe) = &self.moe {
            experts::write(moe, self.family, map);
        }
        config
    }

    /// Parameters of the model (embeddings counted once when tied).
    pub fn num_parameters(&self) -> usize {
        self.parameters_counted().0
    }

    /// Parameters one token's forward pass uses: [`LlamaConfig::num_parameters`] with each
    /// sparse layer's `num_experts_per_tok` experts in place of all of them (a dense model's
    /// are all of them). What "A3B" in Qwen3-30B-A3B counts.
    pub fn active_parameters(&self) -> usize {
        self.parameters_counted().1
    }

    /// (every parameter, the parameters a token uses).
    fn parameters_counted(&self) -> (usize, usize) {
        let (h, i) = (self.hidden_size, self.intermediate_size);
        let q = self.num_attention_heads * self.head_dim;
        let kv = self.num_key_value_heads * self.head_dim;
        let mut layer = h * q + 2 * h * kv + q * h + 2 * h;
        if self.qkv_bias() {
            layer += q + 2 * kv;
        }
        if self.attention_bias {
            layer += h; // o_proj
        }
        if self.qk_norm() {
            layer += 2 * self.head_dim;
        }
        let mut dense_mlp = 3 * h * i;
        if self.mlp_bias {
            dense_mlp += 2 * i + h;
        }
        let (mut all, mut active) = (0, 0);
        for l in 0..self.num_hidden_layers {
            let (a, b) = match &self.moe {
                Some(moe) if moe.is_sparse(l) => moe.block_parameters(h),
                _ => (dense_mlp, dense_mlp),
            };
            all += layer + a;
            active += layer + b;
        }
        let head = if self.tie_word_embeddings {
            0
        } else {
            self.vocab_size * h
        };
        let rest = self.vocab_size * h + h + head;
        (all + rest, active + rest)
    }

    /// Matmul FLOPs of one training step (forward and backward, `6 N` per token for the
    /// weights plus the attention products) for `batch` sequences of `seq` tokens; `N` counts
    /// the active parameters ([`LlamaConfig::active_parameters`]), as model FLOPs do.
    pub fn training_flops(&self, batch: usize, seq: usize) -> f64 {
        let tokens = (batch * seq) as f64;
        let embed = (self.vocab_size * self.hidden_size) as f64;
        // the embedding lookup is a gather, not a matmul; the lm head is one
        let matmul_params =
            self.active_parameters() as f64 - if self.tie_word_embeddings { 0.0 } else { embed };
        // q k^T and p v: 2 * 2 * seq * head_dim * heads per token and layer, forward
        let attn =
            4.0 * (seq * self.head_dim * self.num_attention_heads * self.num_hidden_layers) as f64;
        3.0 * tokens * (2.0 * matmul_params + attn)
    }
}
